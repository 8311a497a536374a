"""The Triton MXFP8 encoder: float32 values -> e4m3fn bytes and one UE8M0 scale byte per 32-value block, byte for
byte ``sglang_inkling_backend.mxfp8.quantize`` (used by the fused K/V store and the decode prologue).

Every rounding is an integer bit operation (round to nearest even), never a dtype cast: exact on the GPU and under
the Triton interpreter alike (the interpreter's fp32 -> e4m3 cast rounds ties wrongly: 124 -> 64, 84 -> 88;
``tests/triton_tests/test_triton_prologue.py`` feeds it those ties). The scale exponent is ``ceil(log2(amax / 448))`` from the
float's exponent and mantissa bits, and the scaling multiplies by an exact power of two. A block holding a NaN or
an infinity gets the UE8M0 NaN byte 0xFF and e4m3 NaNs (0x7F), and a finite value past ``LARGEST_ROUND_TRIP``
saturates to it, as the core quantizer.

Reductions go through ``tl.reduce`` with this module's combine functions, not ``tl.max`` / ``tl.min``: those are
@jit functions of triton.language, which stay compiled when triton was imported before ``TRITON_INTERPRET`` was
set, while these follow this module (reloading it interpreted is enough; the prologue tests do that).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit
def _min(a, b):
    return tl.minimum(a, b)


@triton.jit
def encode_e4m3(y):
    """float32 ``y`` with |y| <= 448 -> e4m3fn byte (int32 0..255), round to nearest even, from the bits."""
    u = y.to(tl.int32, bitcast=True)
    sign = (u >> 24) & 0x80
    a = u & 0x7FFFFFFF
    exp = a >> 23
    # normal e4m3 (|y| >= 2**-6, fp32 exponent >= 121): round the 23-bit mantissa to 3 bits (a carry moves into
    # the exponent, as it should), then rebias 127 -> 7
    normal = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - (120 << 3)
    # subnormal e4m3: round(|y| * 2**9) to an integer 0..8 (8 is the smallest normal's code, 0x08)
    mant = (a & 0x7FFFFF) | 0x800000
    shift = tl.minimum(tl.maximum(141 - exp, 1), 31)  # the clamp at 1 only matters for normals
    half_minus_one = (1 << (shift - 1)) - 1
    sub = (mant + half_minus_one + ((mant >> shift) & 1)) >> shift
    return tl.where(exp >= 121, normal, sub) | sign


@triton.jit
def mxfp8_encode_blocks(xb):
    """``xb [N, 32]`` float32, one block per row -> (e4m3fn bytes ``[N, 32]`` uint8, UE8M0 bytes ``[N]`` uint8)."""
    bits = xb.to(tl.int32, bitcast=True)
    finite = (bits & 0x7F800000) != 0x7F800000
    block_finite = tl.reduce(finite.to(tl.int32), 1, _min) == 1
    # saturate at mxfp8.LARGEST_ROUND_TRIP = 1.875 * 2**127: past it e4m3 rounding would reach 2**128 (inf)
    xb = tl.minimum(tl.maximum(xb, -3.1901471898837981e38), 3.1901471898837981e38)
    amax = tl.maximum(tl.reduce(tl.where(finite, tl.abs(xb), 0.0), 1, _max), 1e-30)
    # smallest e with amax <= 448 * 2**(e - 127): amax = 1.m * 2**(E - 127), 448 = 1.75 * 2**8. A finite float32
    # has E <= 254, so e <= 247 and 2**(127 - e) below is a normal float32
    abits = amax.to(tl.int32, bitcast=True)
    e = (abits >> 23) - 8 + ((abits & 0x7FFFFF) > 0x600000).to(tl.int32)
    e = tl.minimum(tl.maximum(e, 0), 254)
    inv = ((254 - e) << 23).to(tl.float32, bitcast=True)  # 2**(127 - e), exact
    y = tl.minimum(tl.maximum(xb * inv[:, None], -448.0), 448.0)
    code = tl.where(block_finite[:, None], encode_e4m3(y), 0x7F)
    return code.to(tl.uint8), tl.where(block_finite, e, 0xFF).to(tl.uint8)
