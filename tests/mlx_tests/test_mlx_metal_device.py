"""The public entry points with implementation="metal": each against its MLX-ops twin and the core (MXFP8 bytes
exactly, rotation and attention to float tolerance).

On Apple silicon the kernels run on the Metal device through mx.fast.metal_kernel. Elsewhere the same calls run
with ``run_metal`` served by tools/check_metal_on_cpu (the Metal source compiled as C++ and run on the CPU), so the
whole Python path around the kernels (validation, launch description, the pool scatter after the kernel) is
exercised here too; without g++ the module is skipped."""

import sys
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")

from sglang_inkling_backend.mlx import metal_kernels as mk  # noqa: E402

ON_DEVICE = mx.metal.is_available()


@pytest.fixture(autouse=True, scope="module")
def metal_runner(tmp_path_factory):
    """Real Metal on a Mac; the C++ build of the same source elsewhere."""
    if ON_DEVICE:
        yield "metal"
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "check_metal_on_cpu"))
    metal_cpu = pytest.importorskip("metal_cpu")
    if not metal_cpu.compiler_available():
        pytest.skip("no Metal device and no C++ compiler to stand in for it")
    cache = tmp_path_factory.mktemp("metal_device_cpu")

    def run_on_cpu(spec, launch):
        outputs = metal_cpu.CpuMetalKernel(spec, cache).checked_call(**launch.kwargs())
        return [mx.array(o.view(np.uint16)).view(mx.bfloat16) if dt == mx.bfloat16 else mx.array(o)
                for o, dt in zip(outputs, launch.output_dtypes)]

    saved = mk.run_metal, mk.metal_available
    mk.run_metal, mk.metal_available = run_on_cpu, lambda: True
    yield "cpu"
    mk.run_metal, mk.metal_available = saved

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend.mlx import rope_scatter as rs  # noqa: E402
from sglang_inkling_backend.mlx.decode_attention import decode_attention_mxfp8  # noqa: E402
from sglang_inkling_backend.mlx.interop import from_torch, to_torch  # noqa: E402
from sglang_inkling_backend.mlx.kv_pool import MlxMXFP8KVPool  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.reference.attention import paged_decode_attention  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402

POSITIONS = [0, 1, 7, 4095, 131071]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("page_size", [1, 128])
def test_fused_rope_mxfp8_scatter_on_metal(dtype, page_size):
    g = torch.Generator().manual_seed(0)
    t = len(POSITIONS)
    q, k, v = ((torch.randn(t, h, 128, generator=g) * 3).to(dtype) for h in (8, 2, 2))
    args = (from_torch(q), from_torch(k), from_torch(v), mx.array(POSITIONS, dtype=mx.int32))
    slots = mx.array([5, -1, 9, 255, 130], dtype=mx.int32)
    pools = {impl: MlxMXFP8KVPool(256, 2, 2, 128, page_size) for impl in ("metal", "mlx_ops")}
    results = {impl: rs.rope_scatter_mxfp8(*args, slots, pools[impl], 1, rs.RopeParams(1e6, 128), implementation=impl)
               for impl in pools}
    (q_m, k_m), (q_t, k_t) = results["metal"], results["mlx_ops"]
    tol = {torch.bfloat16: 2 ** -7, torch.float16: 2 ** -9, torch.float32: 1e-4}[dtype]
    assert mx.abs(q_m.astype(mx.float32) - q_t.astype(mx.float32)).max().item() <= tol * 10
    assert mx.abs(k_m.astype(mx.float32) - k_t.astype(mx.float32)).max().item() <= tol * 10
    # bytes in the pool: the core quantizer of the kernel's own k_rot (and of v)
    pool = pools["metal"]
    written = [0, 2, 3, 4]
    written_slots = torch.tensor([5, 9, 255, 130])
    layout = ScaleLayout.for_pool(256, 2, 128, page_size)
    kd, ks = mxfp8.quantize(to_torch(k_m)[written])
    vd, vs = mxfp8.quantize(v[written])
    assert torch.equal(to_torch(pool.k_buffer[1])[written_slots], kd.view(torch.uint8))
    assert torch.equal(to_torch(pool.v_buffer[1])[written_slots], vd.view(torch.uint8))
    assert torch.equal(layout.gather(to_torch(pool.k_scale_buffer[1]), written_slots), ks)
    assert torch.equal(layout.gather(to_torch(pool.v_scale_buffer[1]), written_slots), vs)
    assert not mx.any(pool.k_buffer[0]).item()


@pytest.mark.parametrize("page_size,window,cap,rel_extent,sinks", [
    (1, None, 0.0, None, False), (128, 4, 0.0, None, False), (1, 8, 5.0, 6, True)])
def test_decode_attention_on_metal(page_size, window, cap, rel_extent, sinks):
    g = torch.Generator().manual_seed(1)
    layout = ScaleLayout.for_pool(256, 2, 128, page_size)
    kd, ks = mxfp8.quantize(torch.randn(256, 2, 128, generator=g) * 3)
    vd, vs = mxfp8.quantize(torch.randn(256, 2, 128, generator=g))
    sfk, sfv = layout.empty(), layout.empty()
    layout.scatter(sfk, torch.arange(256), ks)
    layout.scatter(sfv, torch.arange(256), vs)
    kv = PagedKV(kd, vd, sfk, sfv, layout)
    lengths = [5, 1, 200]
    indices = (torch.randperm(255, generator=g)[: sum(lengths)] + 1).int()
    indptr = torch.tensor([0, 5, 6, 206], dtype=torch.int32)
    q = torch.randn(3, 8, 128, generator=g).bfloat16()
    rel_bias = torch.randn(3, 8, rel_extent, generator=g) if rel_extent else None
    sink = torch.randn(8, generator=g) if sinks else None
    ref = paged_decode_attention(q, kv, indptr, indices, AttentionParams(
        softmax_scale=1 / 128 if rel_extent else 128 ** -0.5, window=window, rel_bias=rel_bias, logit_cap=cap,
        sinks=sink))
    out = decode_attention_mxfp8(
        from_torch(q), from_torch(kd), from_torch(sfk), from_torch(vd), from_torch(sfv), from_torch(indptr),
        from_torch(indices), softmax_scale=1 / 128 if rel_extent else 128 ** -0.5, page_size=page_size,
        window=window, logit_cap=cap, sinks=None if sink is None else from_torch(sink),
        rel_bias=None if rel_bias is None else from_torch(rel_bias), implementation="metal")
    assert (to_torch(out) - ref).abs().max().item() < 1e-4
