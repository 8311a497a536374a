"""The Metal kernel sources themselves, compiled as C++ under tools/check_metal_on_cpu/metal_shim.h and run on
the CPU (AddressSanitizer + UBSan, every thread of the grid, two thread orders and two output sentinels), against
the core quantizer (bytes) and the core reference attention. See tools/check_metal_on_cpu/metal_cpu.py for what
this covers and what it cannot."""

import math
import sys
from pathlib import Path

import pytest

mx = pytest.importorskip("mlx.core")
torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "check_metal_on_cpu"))
metal_cpu = pytest.importorskip("metal_cpu")
if not metal_cpu.compiler_available():
    pytest.skip("no C++ compiler (g++) to build the Metal sources on the CPU", allow_module_level=True)

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend.mlx import metal_kernels as mk  # noqa: E402
from sglang_inkling_backend.mlx import rope_scatter as rs  # noqa: E402
from sglang_inkling_backend.mlx.decode_attention import decode_mxfp8_launch  # noqa: E402
from sglang_inkling_backend.mlx.interop import from_torch, to_torch  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.reference.attention import paged_decode_attention  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402

POSITIONS = [0, 1, 7, 4095, 131071]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("metal_cpu_build")


def _as_torch(np_array, dtype):
    t = torch.from_numpy(np_array.copy())
    return t.view(torch.int16).view(torch.bfloat16) if dtype == torch.bfloat16 else t


def rope_reference(x: torch.Tensor, positions: list[int], base: float) -> torch.Tensor:
    """NeoX rotation with theta = position * inv_freq in fp32 (the kernel's contract), cos/sin in float64."""
    d = x.shape[-1]
    inv = torch.tensor([base ** (-2.0 * i / d) for i in range(d // 2)], dtype=torch.float32)
    theta = (torch.tensor(positions, dtype=torch.float32)[:, None] * inv).double()[:, None, :]
    x1, x2 = x.double()[..., : d // 2], x.double()[..., d // 2:]
    return torch.cat([x1 * theta.cos() - x2 * theta.sin(), x1 * theta.sin() + x2 * theta.cos()], dim=-1)


def _rope_inputs(dtype, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = len(POSITIONS)
    q = (torch.randn(t, 8, d, generator=g) * 3).to(dtype)
    k = (torch.randn(t, 2, d, generator=g) * 3).to(dtype)
    v = (torch.randn(t, 2, d, generator=g) * torch.logspace(-5, 5, t).view(t, 1, 1)).to(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype,d", [(torch.bfloat16, 64), (torch.float32, 128), (torch.float16, 64)])
def test_rope_mxfp8_kernel_source(dtype, d, cache_dir):
    q, k, v = _rope_inputs(dtype, d)
    rope = rs.RopeParams(10000.0, d)
    launch = rs.rope_qk_mxfp8_launch(from_torch(q), from_torch(k), from_torch(v),
                                     mx.array(POSITIONS, dtype=mx.int32), rope)
    q_rot, k_rot, k_data, k_scales, v_data, v_scales = (
        metal_cpu.CpuMetalKernel(mk.ROPE_QK_MXFP8, cache_dir).checked_call(**launch.kwargs()))
    q_rot, k_rot = _as_torch(q_rot, dtype), _as_torch(k_rot, dtype)
    tol = {torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11, torch.float32: 1e-6}[dtype]
    for ours, x in ((q_rot, q), (k_rot, k)):
        ref = rope_reference(x, POSITIONS, 10000.0)
        assert ((ours.double() - ref).abs() <= tol * ref.abs() + 1e-5).all()
    # MXFP8 bytes: exactly the core quantizer of what the float path stores (k_rot in the input dtype), and of v
    core_k, core_ks = mxfp8.quantize(k_rot)
    core_v, core_vs = mxfp8.quantize(v)
    assert torch.equal(torch.from_numpy(k_data), core_k.view(torch.uint8))
    assert torch.equal(torch.from_numpy(k_scales), core_ks)
    assert torch.equal(torch.from_numpy(v_data), core_v.view(torch.uint8))
    assert torch.equal(torch.from_numpy(v_scales), core_vs)


def test_rope_mxfp8_kernel_matches_the_mlx_twin(cache_dir):
    q, k, v = _rope_inputs(torch.bfloat16, 128, seed=2)
    args = (from_torch(q), from_torch(k), from_torch(v), mx.array(POSITIONS, dtype=mx.int32), rs.RopeParams(1e6, 128))
    kernel = metal_cpu.CpuMetalKernel(mk.ROPE_QK_MXFP8, cache_dir).checked_call(**rs.rope_qk_mxfp8_launch(*args).kwargs())
    twin = rs.rope_qk_mxfp8_ops(*args)
    for name, a, b in zip(mk.ROPE_QK_MXFP8.output_names, kernel, twin):
        b = to_torch(b)
        a = _as_torch(a, b.dtype)
        if name.endswith("_rot"):
            assert (a.float() - b.float()).abs().max().item() <= 2 ** -8 * b.float().abs().max().item()
        else:
            assert torch.equal(a, b), name


def test_e4m3_encoder_in_metal_source_on_edge_values(cache_dir):
    """v is not rotated, so crafted values go straight through the Metal quantizer: every e4m3 code and every
    midpoint between neighbours (ties), saturation, subnormals, zero blocks, and NaN/inf blocks."""
    codes = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # all finite magnitudes
    mids = (codes[:-1] + codes[1:]) / 2
    values = torch.cat([codes, mids, -codes, -mids, torch.tensor([448.0, 447.0, 460.0])])
    rows = torch.nn.functional.pad(values, (0, (-values.numel()) % 64)).view(-1, 1, 64)
    # blocks whose amax is exactly 448 keep scale 2^0, so codes and ties are encoded as they are
    rows[..., 0] = 448.0
    rows[..., 32] = 448.0
    extra = torch.zeros(5, 1, 64)
    extra[0, 0, 5] = float("nan")
    extra[1, 0, 40] = float("inf")
    extra[2] = torch.linspace(-3.5, 3.5, 64)
    extra[4, 0, :3] = torch.tensor([3.3e38, -3.4e38, 1.0])  # past LARGEST_ROUND_TRIP: saturate, not 2**128
    v = torch.cat([rows, extra]).float()
    t = v.shape[0]
    q = torch.zeros(t, 1, 64)
    launch = rs.rope_qk_mxfp8_launch(from_torch(q), from_torch(v), from_torch(v), mx.zeros((t,), mx.int32),
                                     rs.RopeParams(10000.0, 64))
    out = metal_cpu.CpuMetalKernel(mk.ROPE_QK_MXFP8, cache_dir).checked_call(**launch.kwargs())
    core_v, core_vs = mxfp8.quantize(v)
    assert torch.equal(torch.from_numpy(out[4]), core_v.view(torch.uint8))
    assert torch.equal(torch.from_numpy(out[5]), core_vs)
    assert mxfp8.dequantize(core_v[-1], core_vs[-1], torch.float32)[0, :2].tolist() == [
        mxfp8.LARGEST_ROUND_TRIP, -mxfp8.LARGEST_ROUND_TRIP]


def test_rope_float_kernel_source(cache_dir):
    q, k, _ = _rope_inputs(torch.bfloat16, 64, seed=4)
    launch = rs.rope_qk_launch(from_torch(q), from_torch(k), mx.array(POSITIONS, dtype=mx.int32),
                               rs.RopeParams(500000.0, 64))
    q_rot, k_rot = metal_cpu.CpuMetalKernel(mk.ROPE_QK, cache_dir).checked_call(**launch.kwargs())
    for ours, x in ((q_rot, q), (k_rot, k)):
        ref = rope_reference(x, POSITIONS, 500000.0)
        assert ((_as_torch(ours, torch.bfloat16).double() - ref).abs() <= 2 ** -8 * ref.abs() + 1e-5).all()


def _pool(page_size, num_slots=256, hkv=2, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    layout = ScaleLayout.for_pool(num_slots, hkv, d, page_size)
    k_data, k_sc = mxfp8.quantize(torch.randn(num_slots, hkv, d, generator=g) * 3)
    v_data, v_sc = mxfp8.quantize(torch.randn(num_slots, hkv, d, generator=g))
    k_sf, v_sf = layout.empty(), layout.empty()
    layout.scatter(k_sf, torch.arange(num_slots), k_sc)
    layout.scatter(v_sf, torch.arange(num_slots), v_sc)
    return PagedKV(k_data, v_data, k_sf, v_sf, layout)


@pytest.mark.parametrize(
    "page_size,window,cap,rel_extent,sinks,q_dtype",
    [(1, None, 0.0, None, False, torch.float32),
     (128, 4, 0.0, None, False, torch.bfloat16),
     (1, 8, 5.0, 6, True, torch.bfloat16)],
)
def test_decode_kernel_source_matches_reference(page_size, window, cap, rel_extent, sinks, q_dtype, cache_dir):
    g = torch.Generator().manual_seed(7)
    kv = _pool(page_size)
    lengths = [5, 1, 37]
    indices = (torch.randperm(255, generator=g)[: sum(lengths)] + 1).int()
    indptr = torch.tensor([0, 5, 6, 43], dtype=torch.int32)
    q = (torch.randn(3, 8, 64, generator=g) * 2).to(q_dtype)
    rel_bias = torch.randn(3, 8, rel_extent, generator=g) if rel_extent else None
    sink_logits = torch.randn(8, generator=g) if sinks else None
    scale = 1.0 / 64 if rel_extent else 1.0 / math.sqrt(64)
    ref = paged_decode_attention(q, kv, indptr, indices, AttentionParams(
        softmax_scale=scale, window=window, rel_bias=rel_bias, logit_cap=cap, sinks=sink_logits))
    launch = decode_mxfp8_launch(
        from_torch(q), from_torch(kv.k_buffer), from_torch(kv.k_scales), from_torch(kv.v_buffer),
        from_torch(kv.v_scales), from_torch(indptr), from_torch(indices), softmax_scale=scale,
        page_size=page_size, window=window, logit_cap=cap,
        sinks=None if sink_logits is None else from_torch(sink_logits),
        rel_bias=None if rel_bias is None else from_torch(rel_bias))
    (out,) = metal_cpu.CpuMetalKernel(mk.DECODE_MXFP8, cache_dir).checked_call(**launch.kwargs())
    assert (torch.from_numpy(out) - ref).abs().max().item() < 2e-5


# ---- the checker catches the mistakes it claims to catch --------------------------------------------------


def _broken_spec(tmp_path, body: str, name: str):
    path = tmp_path / f"{name}.metal"
    path.write_text(body)
    return mk.MetalKernelSpec(name=name, body_file=str(path), input_names=("x",), output_names=("y",))


def _launch(n):
    return dict(inputs=[mx.arange(n, dtype=mx.float32)], output_shapes=[(n,)], output_dtypes=[mx.float32],
                grid=(n, 1, 1), threadgroup=(n, 1, 1), template=[])


def test_checker_catches_out_of_bounds_writes(tmp_path, cache_dir):
    spec = _broken_spec(tmp_path, "y[thread_position_in_grid.x + 1] = x[thread_position_in_grid.x];\n", "oob")
    with pytest.raises(RuntimeError, match="AddressSanitizer"):
        metal_cpu.CpuMetalKernel(spec, cache_dir)(**_launch(8))


def test_checker_catches_unwritten_outputs(tmp_path, cache_dir):
    spec = _broken_spec(tmp_path, "if (thread_position_in_grid.x % 2 == 0) { y[thread_position_in_grid.x] = 1.0f; }\n",
                        "holes")
    with pytest.raises(AssertionError, match="differs between thread orders"):
        metal_cpu.CpuMetalKernel(spec, cache_dir).checked_call(**_launch(8))


def test_checker_catches_order_dependent_results(tmp_path, cache_dir):
    spec = _broken_spec(tmp_path, "y[0] = x[thread_position_in_grid.x];\n"
                        "if (thread_position_in_grid.x > 0) { y[thread_position_in_grid.x] = 0.0f; }\n", "race")
    with pytest.raises(AssertionError, match="differs between thread orders"):
        metal_cpu.CpuMetalKernel(spec, cache_dir).checked_call(**_launch(8))


def test_checker_refuses_threadgroup_memory(tmp_path, cache_dir):
    spec = _broken_spec(tmp_path, "threadgroup float tile[8];\ntile[0] = x[0];\ny[thread_position_in_grid.x] = tile[0];\n",
                        "tg")
    with pytest.raises(RuntimeError, match="compiling"):
        metal_cpu.CpuMetalKernel(spec, cache_dir)(**_launch(8))
