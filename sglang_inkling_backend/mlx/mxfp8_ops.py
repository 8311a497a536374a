"""The MXFP8 format in MLX ops, byte-identical to ``sglang_inkling_backend.mxfp8``.

MLX has no fp8 dtype: e4m3 data and UE8M0 scales travel as uint8. The exponent rule is SGLang's ceil
rule (the smallest e with ``amax <= 448 * 2^(e-127)``), computed from the float's bits so that an exact
power-of-two ratio never rounds the wrong way. e4m3 encoding and decoding are integer bit operations, the same
algorithm as ``metal/inkling_common.metal`` (so twin and kernel agree by construction, and nothing depends on
``mx.to_fp8``, which MLX 0.29 lacks and which maps NaN to 0x7E). Like the core, a block holding a NaN or an
infinity gets scale 0xFF (UE8M0 NaN) and data 0x7F (e4m3 NaN).
"""

from __future__ import annotations

import mlx.core as mx

from ..mxfp8 import AMAX_FLOOR as _AMAX_FLOOR  # an all-zero block gets exponent 19, as in SGLang
from ..mxfp8 import BLOCK, E4M3_MAX, LARGEST_ROUND_TRIP
from ..mxfp8 import NAN_SCALE as UE8M0_NAN
from ..scale_layout import INTERLEAVED_PAGE_SIZE, ROWS_PER_ATOM

E4M3_NAN = 0x7F


def ue8m0_exponent(amax: mx.array) -> mx.array:
    """uint8 exponent e with ``amax <= 448 * 2^(e - 127)``, smallest such, clamped to [0, 254]."""
    bits = mx.maximum(amax.astype(mx.float32), _AMAX_FLOOR).view(mx.uint32)
    biased = (bits >> 23) & 0xFF  # E + 127 of amax = m * 2^E
    above_1_75 = ((bits & 0x7FFFFF) > 0x600000).astype(mx.uint32)  # 448 = 1.75 * 2^8
    return mx.minimum(biased - 8 + above_1_75, 254).astype(mx.uint8)


def ue8m0_to_float(exponent: mx.array) -> mx.array:
    """UE8M0 byte -> 2^(e - 127) as float32 (e = 0 is the subnormal 2^-127, 0xFF is NaN)."""
    e = exponent.astype(mx.uint32)
    bits = mx.where(e == 0, mx.array(0x00400000, mx.uint32), e << 23)
    bits = mx.where(e == UE8M0_NAN, mx.array(0x7FC00000, mx.uint32), bits)
    return bits.view(mx.float32)


def e4m3_encode(x: mx.array) -> mx.array:
    """Finite float32 in [-448, 448] -> e4m3fn bytes (uint8), round-to-nearest-even."""
    bits = x.astype(mx.float32).view(mx.uint32)
    sign = (bits >> 24) & 0x80
    magnitude = bits & 0x7FFFFFFF
    mantissa = magnitude & 0x7FFFFF
    kept = mantissa >> 20
    rest = mantissa & 0xFFFFF
    round_up = (rest > 0x80000) | ((rest == 0x80000) & ((kept & 1) == 1))
    normal_exponent = mx.maximum(magnitude >> 23, 120) - 120  # clamped: only used where |x| >= 2^-6
    normal = mx.minimum(((normal_exponent << 3) | kept) + round_up.astype(mx.uint32), 0x7E)
    subnormal = mx.round(magnitude.view(mx.float32) * 512.0).astype(mx.uint32)  # ties to even; 8 -> 2^-6
    code = mx.where(magnitude >= 0x3C800000, normal, subnormal)
    return (code | sign).astype(mx.uint8)


def e4m3_decode(data: mx.array) -> mx.array:
    """e4m3fn bytes -> float32 (exact); 0x7F / 0xFF are NaN."""
    code = data.astype(mx.uint32)
    exponent = (code >> 3) & 0xF
    mantissa = code & 0x7
    normal = (((exponent + 120) << 23) | (mantissa << 20)).view(mx.float32)
    magnitude = mx.where(exponent == 0, mantissa.astype(mx.float32) * 0.001953125, normal)
    value = mx.where((code & 0x80) != 0, -magnitude, magnitude)
    return mx.where((code & 0x7F) == E4M3_NAN, mx.nan, value)


def _check_head_dim(x: mx.array, name: str) -> None:
    if x.ndim < 1 or x.shape[-1] % BLOCK != 0:
        raise ValueError(f"{name} must have a last dimension divisible by {BLOCK}, got shape {x.shape}")


def quantize(x: mx.array) -> tuple[mx.array, mx.array]:
    """x [..., D] float -> (data uint8 [..., D] e4m3fn codes, scales uint8 [..., D // 32] UE8M0)."""
    _check_head_dim(x, "x")
    blocks = x.astype(mx.float32).reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    element_finite = mx.isfinite(blocks)
    block_finite = mx.all(element_finite, axis=-1)
    blocks = mx.clip(blocks, -LARGEST_ROUND_TRIP, LARGEST_ROUND_TRIP)  # finite values saturate, as in the core
    exponent = ue8m0_exponent(mx.max(mx.where(element_finite, mx.abs(blocks), 0.0), axis=-1))
    inverse_scale = ((254 - exponent.astype(mx.uint32)) << 23).view(mx.float32)  # 2^(127 - e), exact
    scaled = mx.clip(mx.where(element_finite, blocks, 0.0) * inverse_scale[..., None], -E4M3_MAX, E4M3_MAX)
    data = mx.where(block_finite[..., None], e4m3_encode(scaled), E4M3_NAN).astype(mx.uint8)
    exponent = mx.where(block_finite, exponent, UE8M0_NAN).astype(mx.uint8)
    return data.reshape(x.shape), exponent


def dequantize(data: mx.array, scales: mx.array, dtype=mx.float32) -> mx.array:
    """(data uint8 [..., D], scales uint8 [..., D // 32]) -> values [..., D] (exact in float32)."""
    _check_head_dim(data, "data")
    if data.dtype != mx.uint8 or scales.dtype != mx.uint8:
        raise TypeError(f"data and scales must be uint8, got {data.dtype} and {scales.dtype}")
    if scales.shape != (*data.shape[:-1], data.shape[-1] // BLOCK):
        raise ValueError(f"scales shape {scales.shape} does not match data shape {data.shape}")
    values = e4m3_decode(data).reshape(*scales.shape, BLOCK)
    return (values * ue8m0_to_float(scales)[..., None]).reshape(data.shape).astype(dtype)


def scale_offsets(slots: mx.array, num_kv_heads: int, head_dim: int, page_size: int) -> mx.array:
    """Offsets [N, Hkv, D // 32] into the flattened scale buffer, the MLX twin of the core's
    ``ScaleLayout.flat_index`` (same constants, same formula; tests/test_scale_offset_agreement.py checks the
    three languages agree): interleaved ``[pages, Hkv, 32, page // 32, D // 32]`` when ``page_size`` is
    ``INTERLEAVED_PAGE_SIZE`` (128), flat ``[slots, Hkv, D // 32]`` otherwise."""
    num_blocks = head_dim // BLOCK
    slots = slots.astype(mx.int64)[:, None, None]
    heads = mx.arange(num_kv_heads, dtype=mx.int64)[None, :, None]
    blocks = mx.arange(num_blocks, dtype=mx.int64)[None, None, :]
    if page_size != INTERLEAVED_PAGE_SIZE:
        return (slots * num_kv_heads + heads) * num_blocks + blocks
    page, in_page = slots // page_size, slots % page_size
    columns = page_size // ROWS_PER_ATOM
    row = (page * num_kv_heads + heads) * ROWS_PER_ATOM + in_page % ROWS_PER_ATOM
    return (row * columns + in_page // ROWS_PER_ATOM) * num_blocks + blocks
