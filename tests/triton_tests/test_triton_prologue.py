"""The fused Triton decode prologue against the torch reference, byte for byte, under TRITON_INTERPRET=1 on the
CPU (small shapes): outputs, conv caches, pool bytes and scales. Also its exact rounding helpers (bf16 and e4m3 by
integer bit operations) against torch's casts and the core quantizer, and its argument errors."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("CPU interpreter tests; on a GPU run gpu_tests/test_prologue_gpu.py", allow_module_level=True)

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend.reference import prologue as reference  # noqa: E402
from sglang_inkling_backend.triton import device, encode  # noqa: E402
from sglang_inkling_backend.triton import prologue as fused  # noqa: E402

if not all(isinstance(fn, triton.runtime.interpreter.InterpretedFunction)
           for fn in (device.scale_offsets, encode.mxfp8_encode_blocks, fused._inkling_prologue_decode_kernel)):
    # Another test module imported the kernels (or the helpers and the encoder the prologue calls) before
    # TRITON_INTERPRET was set: define them again, interpreted, the helpers first.
    importlib.reload(device)
    importlib.reload(encode)
    fused = importlib.reload(fused)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the reference prologue's cases
from test_reference_prologue import ERROR_CASES, clone_args, make_case  # noqa: E402

DEVICE = "cpu"
D = 128


def as_bytes(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t


def assert_same_call(args, **extra):
    """Run reference and kernel on identical copies; every output and every mutated buffer must match exactly."""
    a, b = clone_args(args), clone_args(args)
    out_ref = reference.inkling_attn_prologue_decode(**a, **extra)
    out_fused = fused.inkling_attn_prologue_decode(**b, **extra)
    for name, x, y in zip(("q_out", "k_out", "v_out", "q_scale"), out_ref, out_fused):
        if x is None:
            assert y is None, name
            continue
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert torch.equal(as_bytes(x), as_bytes(y)), name
    for key, value in a.items():
        if isinstance(value, torch.Tensor) and key != "qkvr":
            assert torch.equal(as_bytes(value), as_bytes(b[key])), key
    return out_ref


# ------------------------------------------------------------------------------------------------------------
# Rounding helpers
# ------------------------------------------------------------------------------------------------------------

@triton.jit
def _bf16_probe(x_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, fused._round_to_bf16(tl.load(x_ptr + i)))


@triton.jit
def _mxfp8_probe(x_ptr, data_ptr, scale_ptr, ROWS: tl.constexpr):
    offs = tl.arange(0, ROWS)[:, None] * 128 + tl.arange(0, 128)[None, :]
    codes, scales = fused._mxfp8_quantize(tl.load(x_ptr + offs), ROWS)
    tl.store(data_ptr + offs, codes)
    tl.store(scale_ptr + tl.arange(0, ROWS * 4), scales)


def test_bf16_rounding_matches_torch_including_ties():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-20, 20, (4096,), generator=g).float())
    bits = base.view(torch.int32)
    ties = ((bits >> 16) << 16) | 0x8000  # exactly halfway between two bf16 values (both parities of the lsb)
    x = torch.cat([base, ties.view(torch.float32),
                   torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 3.4e38, 1e-40])])
    n = triton.next_power_of_2(x.numel())
    x = torch.cat([x, torch.zeros(n - x.numel())]).to(DEVICE)
    out = torch.empty_like(x)
    _bf16_probe[(1,)](x, out, N=n)
    assert torch.equal(out.view(torch.int32), x.bfloat16().float().view(torch.int32))


def test_mxfp8_quantize_matches_core_quantizer_at_ties_and_edges():
    rows = 64
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, D, generator=g) * torch.exp2(torch.randint(-30, 30, (rows, 1), generator=g).float())
    # e4m3 rounding ties once scaled: block amax 448 (scale 2^0) and midpoints of consecutive e4m3 values,
    # normal and subnormal; the interpreter's own cast gets 124 -> 64 and 84 -> 88 wrong.
    e4m3_values = torch.arange(0, 126, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    midpoints = (e4m3_values[:-1] + e4m3_values[1:]) / 2
    x[0, :32] = torch.cat([torch.tensor([448.0, 124.0, 84.0]), midpoints[:29]])
    x[0, 32:64] = torch.cat([torch.tensor([448.0]), -midpoints[29:60]])
    x[0, 64:96] = torch.cat([torch.tensor([448.0]), midpoints[60:91]])
    x[0, 96:128] = torch.cat([torch.tensor([-448.0]), midpoints[91:122]])
    x[1, :32] = 0.0  # zero block -> exponent 19
    x[1, 32:64] = 3.5  # amax exactly 448 / 128: an exact power-of-two exponent
    x[2, 5] = float("nan")  # non-finite blocks: scale 0xFF, all elements 0x7F; neighbours unaffected
    x[2, 40] = float("inf")
    x[3, :32] = torch.exp2(torch.arange(-40.0, -8.0))  # deep subnormals relative to the block max
    x[4, :3] = torch.tensor([3.3e38, -3.38e38, 1.0])  # past LARGEST_ROUND_TRIP: saturate, not 2**128
    x = x.bfloat16().float()
    data, scales = mxfp8.quantize(x)
    x_dev = x.to(DEVICE)
    out = torch.empty(rows, D, dtype=torch.uint8, device=DEVICE)
    out_scales = torch.empty(rows * 4, dtype=torch.uint8, device=DEVICE)
    _mxfp8_probe[(1,)](x_dev, out, out_scales, ROWS=rows)
    assert torch.equal(out.cpu(), data.view(torch.uint8))
    assert torch.equal(out_scales.cpu().view(rows, 4), scales)
    assert int(scales[1, 0]) == mxfp8.ZERO_BLOCK_EXPONENT and int(scales[2, 0]) == mxfp8.NAN_SCALE
    assert mxfp8.dequantize(data[4:5], scales[4:5], torch.float32)[0, :2].tolist() == [
        mxfp8.LARGEST_ROUND_TRIP, -mxfp8.LARGEST_ROUND_TRIP]


# ------------------------------------------------------------------------------------------------------------
# The fused prologue against the reference
# ------------------------------------------------------------------------------------------------------------

CONFIGS = [
    # (id, hq, hkv, W, mxfp8, tau, track)
    ("bf16", 2, 1, 4, False, False, False),
    ("bf16-tau-track", 3, 2, 4, False, True, True),
    ("mxfp8", 2, 1, 4, True, False, False),
    ("mxfp8-tau-track-gqa", 5, 2, 4, True, True, True),
    ("mxfp8-width2", 1, 1, 2, True, True, False),
    ("bf16-width5", 4, 1, 5, False, False, True),
]


@pytest.mark.parametrize("name,hq,hkv,W,mx,tau,track", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_fused_equals_reference(name, hq, hkv, W, mx, tau, track):
    T = 6
    args, _ = make_case(T=T, hq=hq, hkv=hkv, W=W, cache_slots=12, kv_slots=384, mxfp8_mode=mx,
                        seed=hash(name) % 1000)
    args["cache_indices"] = torch.tensor([3, -1, 1, 7, 9, 2], dtype=torch.int32)  # row 1: padding
    args["cache_mask"] = torch.tensor([True, False, False, True, True, True])
    args["loc"] = torch.tensor([5, 17, 130, -1, 255, 383])  # row 3: loc -1, no store
    if tau:
        args["log_scaling_tau"] = 1.0 + torch.rand(T)
    if track:
        args["track_mask"] = torch.tensor([True, True, False, True, False, True])
        args["track_indices"] = torch.tensor([10, 0, 0, 11, -1, 4])
    assert_same_call(args)


@pytest.mark.parametrize("tau", [False, True])
def test_fused_equals_reference_with_q_kept_bf16(tau):
    """quantize_q=False: MXFP8 K/V store, bf16 q; kernel and reference byte for byte."""
    T = 6
    args, _ = make_case(T=T, hq=5, hkv=2, W=4, cache_slots=12, kv_slots=384, mxfp8_mode=True, seed=11)
    if tau:
        args["log_scaling_tau"] = 1.0 + torch.rand(T)
    q, _, _, q_scale = assert_same_call(args, quantize_q=False)
    assert q.dtype == torch.bfloat16 and q_scale is None


def test_fused_equals_reference_with_sglangs_decode_mask_shape():
    """SGLang's Inkling decode passes cache_mask as [B, 1, 1] (its conv metadata's broadcast shape)."""
    T = 6
    args, _ = make_case(T=T, hq=2, hkv=1, W=4, cache_slots=12, kv_slots=384, mxfp8_mode=True, seed=5)
    args["cache_indices"] = torch.tensor([3, -1, 1, 7, 9, 2], dtype=torch.int32)
    args["cache_mask"] = torch.tensor([True, False, False, True, False, True]).view(T, 1, 1)
    args["loc"] = torch.tensor([5, 17, 130, -1, 255, 383])
    assert_same_call(args)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fused_equals_reference_inkling_rank_shape(seed):
    """Hq 16, Hkv 2 (Inkling per rank at TP4): 16k q values per seed, enough to meet bf16 rounding ties."""
    T = 8
    args, _ = make_case(T=T, hq=16, hkv=2, cache_slots=20, kv_slots=256, mxfp8_mode=seed != 1, seed=100 + seed)
    args["log_scaling_tau"] = 1.0 + torch.rand(T, generator=torch.Generator().manual_seed(seed))
    args["track_mask"] = torch.arange(T) % 2 == 0
    args["track_indices"] = torch.arange(10, 10 + T)
    assert_same_call(args)


def test_fused_equals_reference_full_row_and_no_store():
    args, packed = make_case(T=3, hq=2, hkv=2, seed=4)
    args["qkvr"] = packed.clone()  # the whole packed row instead of the q view
    args["do_store"] = False
    assert_same_call(args)


def test_fused_silu_within_float32_rounding():
    args, _ = make_case(T=3, hq=1, hkv=1, seed=8)
    args["activation"] = "silu"
    a, b = clone_args(args), clone_args(args)
    _, k_ref, v_ref, _ = reference.inkling_attn_prologue_decode(**a)
    _, k, v, _ = fused.inkling_attn_prologue_decode(**b)
    # exp differs between libraries by an ulp or so: at most one bf16 ulp apart
    for x, y in ((k_ref, k), (v_ref, v)):
        assert ((x.float() - y.float()).abs() <= x.float().abs() * 2.0 ** -7 + 1e-6).all()
    assert torch.equal(a["k_cache"], b["k_cache"])  # the cache update copies raw values: exact


def test_unchecked_out_of_range_slots_never_write_out_of_bounds():
    args, _ = make_case(T=3, hq=1, hkv=1, cache_slots=4, kv_slots=256)
    args["cache_indices"] = torch.tensor([1, 4, 2], dtype=torch.int32)  # 4 is out of range
    args["loc"] = torch.tensor([10, 11, 256])  # 256 is out of range
    before_cache = args["k_cache"].clone()
    with pytest.raises(ValueError):
        fused.inkling_attn_prologue_decode(**clone_args(args))
    fused.inkling_attn_prologue_decode(**args, check_values=False)
    assert torch.equal(args["k_cache"][3], before_cache[3])
    assert not args["k_buf"][11].any()  # row 1 (bad cache slot) is treated as padding: no store
    assert args["k_buf"][10].any()


@pytest.mark.parametrize("name,mx,edit,exc,message", ERROR_CASES[:12], ids=[c[0] for c in ERROR_CASES[:12]])
def test_fused_raises_the_reference_errors(name, mx, edit, exc, message):
    args, _ = make_case(T=4, mxfp8_mode=mx)
    edit(args)
    with pytest.raises(exc) as info:
        fused.inkling_attn_prologue_decode(**args)
    assert message in str(info.value)


def test_empty_batch():
    args, packed = make_case(T=1, mxfp8_mode=True)
    args["qkvr"] = packed[:0, :256]
    for key in ("cache_indices", "cache_mask", "loc"):
        args[key] = args[key][:0]
    q, k, v, q_scale = fused.inkling_attn_prologue_decode(**args)
    assert q.shape == (0, 256) and k.shape == (0, 128) and q_scale.shape == (0, 2, 4)
