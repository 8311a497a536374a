"""MXFP8 bytes against an independently written quantizer (numpy, float64, an e4m3 table searched by hand), plus
property tests and named edge cases."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sglang_inkling_backend import mxfp8


def _e4m3_table():
    """Every finite non-negative e4m3fn value with its byte, built from the bit definition (bias 7, no inf,
    S.1111.111 is NaN)."""
    values, codes = [], []
    for code in range(0x7F):  # 0x7F is NaN
        exp, man = code >> 3, code & 7
        value = (man / 8) * 2.0 ** -6 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7)
        values.append(value)
        codes.append(code)
    return np.array(values), np.array(codes)


E4M3_VALUES, E4M3_CODES = _e4m3_table()


def independent_quantize(x: np.ndarray):
    """x: float32 [N, D]. Returns (uint8 codes [N, D], uint8 exponents [N, D/32])."""
    n, d = x.shape
    blocks = x.astype(np.float64).reshape(n, d // 32, 32)
    amax = np.maximum(np.abs(blocks).max(axis=-1), 1e-30)
    e = np.zeros(amax.shape, dtype=np.int64)
    for idx in np.ndindex(amax.shape):
        k = 0  # smallest k in [0, 254] with amax <= 448 * 2**(k-127), by linear search
        while k < 254 and amax[idx] > 448.0 * 2.0 ** (k - 127):
            k += 1
        e[idx] = k
    scaled = blocks / (2.0 ** (e - 127))[..., None]
    scaled = np.clip(scaled, -448, 448)
    mag = np.abs(scaled)
    # nearest table entry; on a tie pick the even code (mantissa LSB 0)
    diff = np.abs(mag[..., None] - E4M3_VALUES)
    best = diff.min(axis=-1, keepdims=True)
    candidates = diff == best
    even = candidates & (E4M3_CODES % 2 == 0)
    pick = np.where(even.any(axis=-1), even.argmax(axis=-1), candidates.argmax(axis=-1))
    codes = E4M3_CODES[pick] | np.where(np.signbit(scaled), 0x80, 0)  # -0.0 keeps its sign, as a cast does
    return codes.reshape(n, d).astype(np.uint8), e.astype(np.uint8)


def ours(x: torch.Tensor):
    data, scales = mxfp8.quantize(x)
    return data.view(torch.uint8).numpy(), scales.numpy()


def test_bytes_match_independent_quantizer_on_100k_values():
    g = torch.Generator().manual_seed(0)
    # Gaussian, heavy-tailed and outlier-channel rows, wide exponent range: 1024 rows x 128 = 131072 values
    rows = [torch.randn(256, 128, generator=g),
            torch.randn(256, 128, generator=g) ** 3 * 50,
            torch.randn(256, 128, generator=g) * torch.logspace(-20, 20, 128).view(1, 128),
            torch.randn(256, 128, generator=g) * (1 + 300 * (torch.arange(128) % 37 == 0))]
    x = torch.cat(rows).bfloat16().float()  # the KV path quantizes bf16 values
    assert x.numel() >= 100_000
    data, scales = ours(x)
    ref_data, ref_scales = independent_quantize(x.numpy())
    assert np.array_equal(scales, ref_scales)
    mismatch = np.flatnonzero(data != ref_data)
    assert mismatch.size == 0, f"{mismatch.size} bytes differ, first at {mismatch[:5]}"


@pytest.mark.parametrize("values, expected_scale", [
    ([0.0] * 32, mxfp8.ZERO_BLOCK_EXPONENT),        # all-zero block: the 1e-30 floor gives 19, not 0
    ([3.5] + [0.0] * 31, 120),                       # 3.5 = 448 / 128: an exact power of two, no rounding up
    ([448.0] + [0.0] * 31, 127),                     # the e4m3 max itself at scale 1
    ([449.0] + [0.0] * 31, 128),                     # just above: next exponent
    ([-1e-30] + [0.0] * 31, 19),
    ([3.0e38] + [0.0] * 31, 247),                    # near the float32 max
])
def test_scale_exponent_edge_cases(values, expected_scale):
    _, scales = mxfp8.quantize(torch.tensor([values]))
    assert scales.tolist() == [[expected_scale]]


def test_round_to_nearest_even_ties_and_carry():
    # at scale 2^0 (amax 448): 124 lies between 120 and 128 -> 128 (carry into the exponent);
    # 84 between 80 and 88 -> 80; 0.5 * 2^-9 (half the smallest subnormal) -> 0; 3 * 2^-10 -> 2^-8 (even)
    x = torch.tensor([[448.0, 124.0, 84.0, -124.0, 2.0 ** -10, 3 * 2.0 ** -10] + [0.0] * 26])
    data, scales = mxfp8.quantize(x)
    assert scales.item() == 127
    assert data.float()[0, :6].tolist() == [448.0, 128.0, 80.0, -128.0, 0.0, 2.0 ** -8]


def test_non_finite_block_is_nan_and_does_not_spill():
    x = torch.ones(3, 64)
    x[0, 5] = float("nan")
    x[1, 40] = float("inf")
    x[2, 0] = -float("inf")
    data, scales = mxfp8.quantize(x)
    assert scales.tolist() == [[255, 127 - 8], [127 - 8, 255], [255, 127 - 8]]
    raw = data.view(torch.uint8)
    assert (raw[0, :32] == 0x7F).all() and (raw[1, 32:] == 0x7F).all()
    clean = mxfp8.quantize(torch.ones(1, 32))
    assert torch.equal(raw[0, 32:], clean[0].view(torch.uint8)[0])  # the neighbour block is untouched
    deq = mxfp8.dequantize(data, scales, torch.float32)
    assert deq[0, :32].isnan().all() and (deq[0, 32:] == 1).all()


def test_finite_values_past_float32s_round_trip_saturate():
    """Past 1.875 * 2**127 e4m3 rounding at scale 2**120 reaches 256 * 2**120 = 2**128, which float32 reads as inf;
    the quantizer saturates instead, for float32, bf16 and float64 input (1e300 would be inf in float32)."""
    top = mxfp8.LARGEST_ROUND_TRIP
    for x in (torch.tensor([[3.3e38, -3.4028e38, 1.0] + [0.0] * 29]),
              torch.tensor([[3.3e38, -3.39e38, 1.0] + [0.0] * 29]).bfloat16(),
              torch.tensor([[1e300, -1e300, 1.0] + [0.0] * 29], dtype=torch.float64)):
        data, scales = mxfp8.quantize(x)
        back = mxfp8.dequantize(data, scales, torch.float32)[0]
        assert back[:2].tolist() == [top, -top] and back[2] == 0.0 and int(scales) == 247, x.dtype
    # exactly at the limit: unchanged; an infinity still makes the block NaN
    data, scales = mxfp8.quantize(torch.tensor([[top] + [0.0] * 31]))
    assert mxfp8.dequantize(data, scales, torch.float32)[0, 0] == top
    assert int(mxfp8.quantize(torch.tensor([[float("inf")] + [0.0] * 31]))[1]) == mxfp8.NAN_SCALE
    # without the saturation the same rule overflows: 3.3e38 / 2**120 = 248.3 rounds to 256, 256 * 2**120 = inf
    unsaturated = torch.tensor(3.3e38 / 2.0 ** 120).to(mxfp8.DATA_DTYPE).float() * 2.0 ** 120
    assert unsaturated.isinf()


@settings(max_examples=200, deadline=None)
@given(arrays(np.float32, (2, 64), elements=st.floats(-2.0 ** 100, 2.0 ** 100, width=32, allow_subnormal=True)))
def test_round_trip_error_within_half_an_e4m3_step(x):
    t = torch.from_numpy(x)
    data, scales = mxfp8.quantize(t)
    deq = mxfp8.dequantize(data, scales, torch.float32).double()
    scale = mxfp8.exponent_to_scale(scales).double().repeat_interleave(32, dim=-1)
    mag = (t.double() / scale).abs()
    # e4m3 step at |y|: 2^(floor(log2 y) - 3) for normals (y >= 2^-6), 2^-9 for subnormals
    step = torch.where(mag >= 2 ** -6, 2.0 ** (torch.floor(torch.log2(mag.clamp(min=2 ** -6))) - 3), 2.0 ** -9)
    assert ((deq - t.double()).abs() <= step * scale / 2 * (1 + 1e-12)).all()
    assert (mag <= 448).all()  # the ceil rule never saturates


@settings(max_examples=100, deadline=None)
@given(arrays(np.float32, (1, 96), elements=st.floats(-2.0 ** 20, 2.0 ** 20, width=32)), st.integers(0, 2),
       st.floats(-2.0 ** 20, 2.0 ** 20, width=32))
def test_blocks_are_independent(x, block, value):
    t = torch.from_numpy(x.copy())
    d0, s0 = mxfp8.quantize(t)
    t[0, block * 32 + 7] = value
    d1, s1 = mxfp8.quantize(t)
    others = [b for b in range(3) if b != block]
    for b in others:
        assert s0[0, b] == s1[0, b]
        assert torch.equal(d0.view(torch.uint8)[0, b * 32:(b + 1) * 32], d1.view(torch.uint8)[0, b * 32:(b + 1) * 32])


def test_shapes_and_errors():
    data, scales = mxfp8.quantize(torch.randn(2, 3, 256, dtype=torch.bfloat16))
    assert data.dtype == torch.float8_e4m3fn and data.shape == (2, 3, 256)
    assert scales.dtype == torch.uint8 and scales.shape == (2, 3, 8)
    with pytest.raises(ValueError, match=r"x.shape\[-1\] must be a multiple of 32"):
        mxfp8.quantize(torch.randn(4, 48))
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        mxfp8.quantize(torch.ones(4, 32, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"scales must have shape \(2, 3, 8\)"):
        mxfp8.dequantize(data, scales[..., :4])
    with pytest.raises(TypeError, match="data must be float8_e4m3fn"):
        mxfp8.dequantize(torch.zeros(2, 32), torch.zeros(2, 1, dtype=torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_quantize_takes_float8_inputs_as_their_float32_values(dtype):
    """The docstring's "any float dtype": an 8-bit float input quantizes as its (exact) float32 values do."""
    x = (torch.randn(4, 64, generator=torch.Generator().manual_seed(5)) * 30).to(dtype)
    data, scales = mxfp8.quantize(x)
    ref_data, ref_scales = mxfp8.quantize(x.float())
    assert torch.equal(data.view(torch.uint8), ref_data.view(torch.uint8)) and torch.equal(scales, ref_scales)
    assert data.shape == x.shape and scales.shape == (4, 2)
