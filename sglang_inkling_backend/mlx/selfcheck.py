"""``python -m sglang_inkling_backend.mlx.selfcheck``: the MLX path against the core, on this machine.

On Apple silicon it runs the Metal kernels (and their MLX-ops twins); elsewhere the twins only (the Metal sources
are checked on Linux by tests/mlx_tests/test_mlx_metal_on_cpu.py). Prints the errors and byte mismatches, plus wall times
(informational, never a pass criterion); exits 1 on any byte mismatch or an error above its bound.
"""

from __future__ import annotations

import sys
import time

import mlx.core as mx
import torch

from sglang_inkling_backend import mxfp8
from sglang_inkling_backend.mlx import metal_kernels as mk
from sglang_inkling_backend.mlx import mxfp8_ops
from sglang_inkling_backend.mlx import rope_scatter as rs
from sglang_inkling_backend.mlx.decode_attention import decode_attention_mxfp8
from sglang_inkling_backend.mlx.interop import from_torch, to_torch
from sglang_inkling_backend.mlx.kv_pool import MlxMXFP8KVPool
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV
from sglang_inkling_backend.reference.attention import paged_decode_attention
from sglang_inkling_backend.scale_layout import ScaleLayout

failures: list[str] = []


def report(name: str, value: float, bound: float, unit: str = "") -> None:
    ok = value <= bound
    print(f"  {'ok ' if ok else 'BAD'} {name}: {value:.3g}{unit} (bound {bound:.3g})")
    if not ok:
        failures.append(name)


def timed(fn, repeat: int = 10) -> float:
    mx.eval(fn())
    start = time.perf_counter()
    for _ in range(repeat):
        mx.eval(fn())
    return (time.perf_counter() - start) / repeat * 1e3


def main() -> int:
    implementations = ["mlx_ops"] + (["metal"] if mk.metal_available() else [])
    print(f"mlx {mx.__version__}, device {mx.default_device()}, Metal available: {mk.metal_available()}")
    if not mk.metal_available():
        print("  (no Metal here: twins only; the Metal sources are checked by tests/mlx_tests/test_mlx_metal_on_cpu.py)")
    g = torch.Generator().manual_seed(0)

    print("MXFP8 quantize, 4096 x 8 x 128 bf16 values spanning 1e-6..1e6")
    x = (torch.randn(4096, 8, 128, generator=g) * torch.logspace(-6, 6, 4096).view(-1, 1, 1)).bfloat16()
    data, scales = mxfp8_ops.quantize(from_torch(x))
    core_data, core_scales = mxfp8.quantize(x)
    report("data bytes differing from the core", int((to_torch(data) != core_data.view(torch.uint8)).sum()), 0)
    report("scale bytes differing from the core", int((to_torch(scales) != core_scales).sum()), 0)

    tokens, hq, hkv, d = 32, 32, 8, 128
    positions = torch.randint(0, 131072, (tokens,), generator=g)
    q, k, v = ((torch.randn(tokens, h, d, generator=g) * 3).bfloat16() for h in (hq, hkv, hkv))
    inv = torch.tensor([1e6 ** (-2.0 * i / d) for i in range(d // 2)], dtype=torch.float32)
    theta = (positions.float()[:, None] * inv).double()[:, None, :]
    x1, x2 = k.double()[..., : d // 2], k.double()[..., d // 2:]
    k_ref = torch.cat([x1 * theta.cos() - x2 * theta.sin(), x1 * theta.sin() + x2 * theta.cos()], dim=-1)
    for impl in implementations:
        print(f"fused RoPE + MXFP8 scatter [{impl}], T={tokens} Hq={hq} Hkv={hkv} D={d}, positions < 131072")
        pool = MlxMXFP8KVPool(4096, 2, hkv, d)
        slots = mx.array(torch.randperm(4095, generator=g)[:tokens].add(1).tolist(), dtype=mx.int32)
        args = (from_torch(q), from_torch(k), from_torch(v), mx.array(positions.tolist(), dtype=mx.int32), slots, pool, 1,
                rs.RopeParams(1e6, d), impl)
        _, k_rot = rs.rope_scatter_mxfp8(*args)
        rel = ((to_torch(k_rot).double() - k_ref).abs() / (k_ref.abs() + 1e-3)).max().item()
        report("k_rot relative error vs float64 rotation of fp32 theta", rel, 2 ** -7)
        kd, ks = mxfp8.quantize(to_torch(k_rot))
        s = torch.tensor(slots.tolist())
        report("pool data bytes differing from core quantize(k_rot)",
               int((to_torch(pool.k_buffer[1])[s] != kd.view(torch.uint8)).sum()), 0)
        report("pool scale bytes differing", int((to_torch(pool.k_scale_buffer[1])[s] != ks).sum()), 0)
        print(f"  time {timed(lambda: rs.rope_scatter_mxfp8(*args)[1]):.3f} ms per call (wall, informational)")

    batch, length, num_slots = 8, 2048, 8 * 2048 + 128
    layout = ScaleLayout.for_pool(num_slots, hkv, d, 1)
    kd, ks = mxfp8.quantize(torch.randn(num_slots, hkv, d, generator=g))
    vd, vs = mxfp8.quantize(torch.randn(num_slots, hkv, d, generator=g))
    kv = PagedKV(kd, vd, ks.contiguous(), vs.contiguous(), layout)
    indices = (torch.randperm(num_slots - 1, generator=g)[: batch * length] + 1).int()
    indptr = torch.arange(0, batch * length + 1, length, dtype=torch.int32)
    qd = torch.randn(batch, hq, d, generator=g).bfloat16()
    for window in (None, 1024):
        ref = paged_decode_attention(qd, kv, indptr, indices, AttentionParams(d ** -0.5, window=window))
        for impl in implementations:
            print(f"decode attention [{impl}] B={batch} L={length} Hq={hq} Hkv={hkv} D={d} window={window}")
            call = lambda: decode_attention_mxfp8(  # noqa: E731
                from_torch(qd), from_torch(kd), from_torch(ks), from_torch(vd), from_torch(vs), from_torch(indptr),
                from_torch(indices), softmax_scale=d ** -0.5, window=window, implementation=impl)
            report("max |out - reference|", (to_torch(call()) - ref).abs().max().item(), 1e-4)
            print(f"  time {timed(call, 3):.2f} ms per call (wall, informational)")
    print("FAILED: " + ", ".join(failures) if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
