"""SGLang host adapter: `--attention-backend inkling` for SGLang 0.5.23.

Importing this package is light (no sglang import); the modules that need sglang import it themselves:

- ``version``: the supported SGLang range and the check every entry into SGLang runs first.
- ``metadata``: host-free forward metadata (kv rails per request, window rails, CUDA-graph buffers).
- ``pool``: SGLang KV pools backed by the core ``InklingKVPool`` (bf16, per-tensor fp8 e4m3, MXFP8).
- ``backend``: ``InklingAttnBackend`` (SGLang's ``AttentionBackend``), over the core's attention routes.
- ``hooks``: server-argument resolution hooks and the KV-pool configurator hooks.
- ``inkling_model``: the seam that lets SGLang's in-tree Inkling model run on this backend.
"""

BACKEND_NAME = "inkling"
