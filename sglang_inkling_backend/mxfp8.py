"""MXFP8, the encoding: e4m3 data with one UE8M0 scale per block (the KV formats and their storage: ``kv_formats.py``).

Blocks of 32 consecutive channels along head_dim share one UE8M0 scale byte (a biased power-of-two exponent,
bias 127). Elements are e4m3fn (max 448), round-to-nearest-even. The exponent rule is SGLang's
(Triton ``to_mxfp8``, the CUDA Inkling prologue and the pool's fused store agree byte for byte)::

    amax = max(max|x|, 1e-30)
    e    = clamp(ceil(log2(amax / 448)) + 127, 0, 254)     # an all-zero block gets e = 19
    q    = e4m3_rne(clamp(x / 2**(e - 127), -448, 448))

``e`` is computed exactly here (from the float's exponent and mantissa bits, never through ``log2``), so an exact
power of two such as ``amax = 3.5 = 448 / 128`` gives an integer exponent and no saturation.

Non-finite input (our decision; SGLang leaves it undefined): a block holding a NaN or an infinity gets the UE8M0
NaN byte ``0xFF`` and all its elements the e4m3 NaN ``0x7F``, so it dequantizes to NaN as a whole. Neighbouring
blocks are quantized as if the bad block did not exist.
"""

from __future__ import annotations

import torch

from .checks import require_positive_real, require_tensor

BLOCK = 32
E4M3_MAX = 448.0
SCALE_BIAS = 127
ZERO_BLOCK_EXPONENT = 19  # the exponent of the 1e-30 floor: what an all-zero block gets
NAN_SCALE = 0xFF  # UE8M0 NaN; scale buffers therefore start zeroed, never 0xFF
E4M3_NAN = 0x7F
AMAX_FLOOR = 1e-30
# The largest magnitude whose encoding dequantizes finite in float32: 240 * 2**120 = 1.875 * 2**127 (3.19e38). A
# larger finite value (float32 up to 3.40e38, or float64) saturates to it; unclamped, e4m3 rounding would give
# 256 * 2**120 = 2**128, which float32 reads as inf. Below it every encoder is SGLang's rule, byte for byte.
LARGEST_ROUND_TRIP = 1.875 * 2.0**127

DATA_DTYPE = torch.float8_e4m3fn
SCALE_DTYPE = torch.uint8  # a uint8 view of float8_e8m0fnu: every library can index and copy it
# the dtypes a scale tensor may come in (its bytes are the same)
SCALE_DTYPES = (torch.uint8,) + ((torch.float8_e8m0fnu,) if hasattr(torch, "float8_e8m0fnu") else ())


def head_dim_ok(head_dim: int) -> bool:
    """MXFP8 stores whole 32-channel blocks: one UE8M0 scale per ``BLOCK`` channels of a head."""
    return head_dim % BLOCK == 0


def require_head_dim(head_dim: int, name: str = "head_dim") -> None:
    if not head_dim_ok(head_dim):
        raise ValueError(f"{name} must be a multiple of {BLOCK} for MXFP8 (one scale per {BLOCK} channels), "
                         f"got {head_dim}")


def _check_last_dim(x: torch.Tensor, name: str) -> int:
    if x.dim() < 1:
        raise ValueError(f"{name} must have at least one dimension (the channel dim), got a scalar")
    d = x.shape[-1]
    if d % BLOCK != 0:
        raise ValueError(f"{name}.shape[-1] must be a multiple of {BLOCK} (one scale per {BLOCK} channels), got {d}")
    return d


def scale_exponent(amax: torch.Tensor) -> torch.Tensor:
    """The UE8M0 byte for blocks of absolute maximum ``amax`` (float32, finite, >= 0): the smallest ``e`` in
    [0, 254] with ``max(amax, 1e-30) <= 448 * 2**(e - 127)``, i.e. SGLang's ``ceil(log2(amax / 448)) + 127``
    computed exactly."""
    amax = torch.clamp(amax.float(), min=AMAX_FLOOR)
    # amax = m * 2**k with m in [0.5, 1); 448 = 0.875 * 2**9. amax <= 448 * 2**s  <=>  m / 0.875 <= 2**(9 + s - k):
    # s = k - 9 when m <= 0.875, else s = k - 8.
    mantissa, exponent = torch.frexp(amax)
    s = exponent.to(torch.int32) - 9 + (mantissa > 0.875).to(torch.int32)
    return torch.clamp(s + SCALE_BIAS, 0, 254).to(SCALE_DTYPE)


def exponent_to_scale(scales: torch.Tensor) -> torch.Tensor:
    """``2**(e - 127)`` as float32 for UE8M0 bytes; 0xFF gives NaN."""
    e = scales.to(torch.int32)
    value = torch.ldexp(torch.ones_like(e, dtype=torch.float32), e - SCALE_BIAS)
    return torch.where(e == NAN_SCALE, torch.full_like(value, float("nan")), value)


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., D]`` (any float dtype; bf16 in the KV path) to ``(data float8_e4m3fn [..., D],
    scales uint8 [..., D // 32])``. Finite values past ``LARGEST_ROUND_TRIP`` saturate to it; a block holding a NaN
    or an infinity is all NaN."""
    require_tensor(x, "x")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    d = _check_last_dim(x, "x")
    if x.element_size() == 1:  # float8 inputs (torch has no abs/amax for them): exact in float32
        x = x.float()
    blocks = x.reshape(*x.shape[:-1], d // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=-1)  # NaN and inf propagate: one finiteness test per block, not per element
    finite = torch.isfinite(amax)
    if torch.finfo(x.dtype).max > LARGEST_ROUND_TRIP:  # float32, bf16 and float64 can hold larger finite values
        blocks, amax = blocks.clamp(-LARGEST_ROUND_TRIP, LARGEST_ROUND_TRIP), amax.clamp(max=LARGEST_ROUND_TRIP)
    blocks, amax = blocks.float(), amax.float()
    e = scale_exponent(torch.where(finite, amax, 0.0))
    # Division by a power of two is exact; the ceil rule keeps |x / scale| <= 448, the clamp is belt and braces.
    scaled = torch.clamp(blocks / exponent_to_scale(e).unsqueeze(-1), -E4M3_MAX, E4M3_MAX)
    data = scaled.to(DATA_DTYPE).view(torch.uint8)
    data = torch.where(finite.unsqueeze(-1), data, E4M3_NAN)  # no host sync: also usable inside a CUDA graph
    e = torch.where(finite, e, NAN_SCALE)
    return data.reshape(x.shape).view(DATA_DTYPE), e


def dequantize(data: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``data [..., D]`` (float8_e4m3fn, or its uint8 bytes) times ``2**(scales - 127)`` per 32-block, as
    ``dtype`` (a floating dtype)."""
    for name, t in (("data", data), ("scales", scales)):
        require_tensor(t, name)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype.itemsize == 1:
        raise TypeError(f"dtype must be a bf16/fp16/fp32/fp64 torch.dtype, got {dtype!r}")
    if data.dtype == torch.uint8:
        data = data.view(DATA_DTYPE)
    if data.dtype != DATA_DTYPE:
        raise TypeError(f"data must be float8_e4m3fn (or its uint8 bytes), got {data.dtype}")
    if scales.dtype not in SCALE_DTYPES:
        raise TypeError(f"scales must be uint8 (UE8M0 bytes) or float8_e8m0fnu, got {scales.dtype}")
    scales = scales.view(torch.uint8)
    d = _check_last_dim(data, "data")
    expected = (*data.shape[:-1], d // BLOCK)
    if tuple(scales.shape) != expected:
        raise ValueError(f"scales must have shape {expected} for data of shape {tuple(data.shape)}, "
                         f"got {tuple(scales.shape)}")
    blocks = data.float().reshape(*data.shape[:-1], d // BLOCK, BLOCK)
    return (blocks * exponent_to_scale(scales).unsqueeze(-1)).reshape(data.shape).to(dtype)


def quantize_per_tensor(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Per-tensor fp8 e4m3 (the format FlashInfer and SGLang's fp8 KV use): ``e4m3_rne(x / scale)``, saturating at
    +-448 rather than overflowing to NaN (a per-tensor scale is a calibration, not a guarantee). ``scale`` must be
    finite and > 0 (0 would divide by zero, a negative scale flip every sign)."""
    if not require_tensor(x, "x", "a floating-point torch.Tensor").is_floating_point():
        raise TypeError(f"x must be a floating-point torch.Tensor, got {x.dtype}")
    scale = require_positive_real(scale, "scale")
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(DATA_DTYPE)

