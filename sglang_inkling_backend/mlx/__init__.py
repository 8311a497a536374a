"""Apple silicon (MLX) path of the Inkling backend.

Its modules need ``mlx`` (the ``mlx`` extra: ``mlx`` on macOS, ``mlx[cpu]`` on Linux), all but ``decode_context``
(torch only); the core package never imports this sub-package, and the SGLang host wires it into SGLang's MLX runner
(``hosts/sglang/mlx_runner.py``). Modules:

- ``mxfp8_ops``: the MXFP8 format in MLX ops (uint8 carries e4m3 and UE8M0), byte-identical to the core.
- ``metal_kernels``: kernel specs (Metal sources under ``metal/``) and the ``mx.fast.metal_kernel`` launcher.
- ``rope_scatter``: fused RoPE + pool scatter, float pool and MXFP8 pool, Metal kernel and MLX-ops twin.
- ``decode_attention``: decode attention over an MXFP8 pool, Metal kernel and MLX-ops twin.
- ``kv_pool``: the MXFP8 pool on the MLX side (uint8 data + scale buffers in the core ScaleLayout).
- ``decode_context``: the batched decode context with SGLang's MLX semantics, in torch (imports no MLX).
- ``context``: the MLX decode context built from that factory and the layer plan.
- ``interop``: byte-exact mx.array <-> torch.Tensor (bf16 included).
- ``selfcheck``: ``python -m sglang_inkling_backend.mlx.selfcheck``, the path against the core on this machine.

The ``.metal`` sources under ``metal/`` are package data: the wheel must ship them.
"""
