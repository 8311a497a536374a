"""Host adapters: one folder per serving engine, each importing the core and never the other hosts.

- ``sglang``: SGLang 0.5.23 (``--attention-backend inkling``), its KV pools, hooks, the Inkling model seam and the
  wiring into SGLang's MLX runner on Apple silicon.
"""
