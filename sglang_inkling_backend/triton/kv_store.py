"""Fused K/V stores, one kernel for K and V: ``store_kv_mxfp8`` quantizes into an MXFP8 pool (data and scales),
``store_kv_unquantized`` copies (and casts) into a bf16/fp16/fp32 pool; ``store_kv`` picks by the pool's format
(``FUSED_STORE_FORMATS``). The torch path they replace (``kv_views.store_kv_unchecked`` without a fused store) is two
indexed writes per layer for an unquantized pool and several passes for MXFP8.

The MXFP8 store is byte-identical to ``mxfp8.quantize`` followed by ``ScaleLayout.scatter`` (the torch path),
including the non-finite rule: a block holding a NaN or an infinity gets the UE8M0 NaN byte and e4m3 NaNs. The scale
exponent comes from the float's exponent and mantissa bits and e4m3 is encoded with integer operations
(round to nearest even), never through the dtype cast: exact on the GPU and under the Triton interpreter alike
(the interpreter's fp32 -> e4m3 cast is wrong at ties); the encoder is ``encode.mxfp8_encode_blocks``, shared with
the decode prologue.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..checks import require_slots, require_tensor, triton_head_dim_ok
from ..attention_inputs import PagedKV
from ..kv_formats import UNQUANTIZED_KV_FORMATS, KVFormat
from .device import scale_offsets
from .encode import mxfp8_encode_blocks


@triton.jit
def quantize_store_kernel(
    k_ptr, v_ptr, loc_ptr, kbuf_ptr, vbuf_ptr, ksf_ptr, vsf_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_buf_slot, stride_buf_head,
    HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, INTERLEAVED: tl.constexpr,
):
    t = tl.program_id(0)
    hv = tl.program_id(1)  # K heads first, then V heads
    NB: tl.constexpr = D // 32
    is_v = hv >= HKV
    h = hv % HKV
    blk = tl.arange(0, NB)
    offs = blk[:, None] * 32 + tl.arange(0, 32)[None, :]
    slot = tl.load(loc_ptr + t).to(tl.int64)
    if is_v:
        x = tl.load(v_ptr + t * stride_vt + h * stride_vh + offs).to(tl.float32)
    else:
        x = tl.load(k_ptr + t * stride_kt + h * stride_kh + offs).to(tl.float32)

    code, e = mxfp8_encode_blocks(x)  # [NB, 32] e4m3 bytes, [NB] UE8M0 bytes

    data_off = slot * stride_buf_slot + h * stride_buf_head + offs
    sf_off = scale_offsets(slot, 0, h, HKV, NB, PAGE, INTERLEAVED) + blk
    if is_v:
        tl.store(vbuf_ptr + data_off, code)
        tl.store(vsf_ptr + sf_off, e)
    else:
        tl.store(kbuf_ptr + data_off, code)
        tl.store(ksf_ptr + sf_off, e)


@triton.jit
def copy_store_kernel(
    k_ptr, v_ptr, loc_ptr, kbuf_ptr, vbuf_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_buf_slot, stride_buf_head,
    HKV: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0)
    is_v = tl.program_id(1) == 1
    h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, D)
    mask = (h < HKV)[:, None]
    slot = tl.load(loc_ptr + t).to(tl.int64)
    dst = slot * stride_buf_slot + h[:, None] * stride_buf_head + offs_d[None, :]
    if is_v:
        x = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + offs_d[None, :], mask=mask)
        tl.store(vbuf_ptr + dst, x, mask=mask)
    else:
        x = tl.load(k_ptr + t * stride_kt + h[:, None] * stride_kh + offs_d[None, :], mask=mask)
        tl.store(kbuf_ptr + dst, x, mask=mask)


# The pool formats ``store_kv`` writes in one kernel (per-tensor fp8 divides by its scale and saturates: torch).
FUSED_STORE_FORMATS = (KVFormat.MXFP8,) + UNQUANTIZED_KV_FORMATS


def store_kv(kv: PagedKV, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor, validate: bool = True) -> None:
    """Store ``k``, ``v`` at slots ``loc`` of ``kv`` in one kernel: ``store_kv_mxfp8`` for an MXFP8 pool,
    ``store_kv_unquantized`` for a bf16/fp16/fp32 one (``FUSED_STORE_FORMATS``); a per-tensor fp8 pool is refused
    (``kv_views.store_kv_unchecked`` quantizes it with torch)."""
    if not isinstance(kv, PagedKV):
        raise TypeError(f"kv must be a PagedKV, got {type(kv).__name__}")
    fmt = kv.kv_format
    if fmt.block_scaled:
        store_kv_mxfp8(kv, loc, k, v, validate=validate)
    elif not fmt.quantized:
        store_kv_unquantized(kv, loc, k, v, validate=validate)
    else:
        raise ValueError(f"store_kv writes {tuple(f.value for f in FUSED_STORE_FORMATS)} pools, this one is {fmt}")


def _check_store_inputs(kv: PagedKV, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor, validate: bool):
    """The checks both stores make, before anything is written: ``k``/``v`` as ``[N, Hkv, D]`` views."""
    require_tensor(loc, "loc", "a 1-D int32/int64 tensor of slot ids")
    if loc.dim() != 1 or loc.dtype not in (torch.int32, torch.int64):
        raise TypeError("loc must be a 1-D int32/int64 tensor of slot ids")
    n, hkv, d = loc.numel(), kv.num_kv_heads, kv.head_dim
    if not triton_head_dim_ok(d):
        raise ValueError(f"head_dim must be a power of two >= 32 for the Triton store, got {d}")
    views = []
    for name, t in (("k", k), ("v", v)):
        require_tensor(t, name)
        if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise TypeError(f"{name} must be bf16/fp16/fp32, got {t.dtype}")
        if tuple(t.shape) not in ((n, hkv, d), (n, hkv * d)):
            raise ValueError(f"{name} must hold [{n}, Hkv={hkv}, D={d}] values, got shape {tuple(t.shape)}")
        if t.device != kv.k_buffer.device:
            raise ValueError(f"{name} is on {t.device}, the pool on {kv.k_buffer.device}")
        t = t.view(n, hkv, d)
        if t.stride(2) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim")
        views.append(t)
    if loc.device != kv.k_buffer.device:
        raise ValueError(f"loc is on {loc.device}, the pool on {kv.k_buffer.device}")
    for name, t in (("k_buffer", kv.k_buffer), ("v_buffer", kv.v_buffer)):
        if t.stride() != kv.k_buffer.stride() or t.stride(2) != 1:
            raise ValueError(f"kv.{name} must be contiguous in head_dim with the same strides as k_buffer")
    if validate:  # range and distinct slots (slot 0, the padding sink, may repeat), as the core's writes
        require_slots(loc, "loc", kv.num_slots, distinct=True)
    return views


def store_kv_unquantized(kv: PagedKV, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         validate: bool = True) -> None:
    """Copy ``k``, ``v`` (``[N, Hkv, D]`` or ``[N, Hkv * D]``, bf16/fp16/fp32) into the bf16/fp16/fp32 pool ``kv`` at
    slots ``loc`` in one kernel (values of another dtype cast by ``Tensor.to`` first). ``validate``
    range-checks ``loc`` and refuses a slot named twice (one sync); every check runs before anything is written."""
    if not isinstance(kv, PagedKV):
        raise TypeError(f"kv must be a PagedKV, got {type(kv).__name__}")
    if kv.kv_format.quantized:
        raise ValueError(f"store_kv_unquantized needs a {tuple(f.value for f in UNQUANTIZED_KV_FORMATS)} pool, this "
                         f"one is {kv.kv_format}")
    k3, v3 = _check_store_inputs(kv, loc, k, v, validate)
    if loc.numel() == 0:
        return
    # A cast torch makes (round to nearest even): Triton's interpreter rounds fp32 -> bf16 otherwise. Models
    # store their own dtype, so this is the rare case.
    k3, v3 = (t if t.dtype == kv.k_buffer.dtype else t.to(kv.k_buffer.dtype) for t in (k3, v3))
    hkv, d = kv.num_kv_heads, kv.head_dim
    copy_store_kernel[(loc.numel(), 2)](
        k3, v3, loc, kv.k_buffer, kv.v_buffer,
        k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1), kv.k_buffer.stride(0), kv.k_buffer.stride(1),
        HKV=hkv, D=d, BLOCK_H=triton.next_power_of_2(hkv), num_warps=4 if hkv * d >= 1024 else 1,
    )


def store_kv_mxfp8(kv: PagedKV, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   validate: bool = True) -> None:
    """Quantize ``k``, ``v`` (``[N, Hkv, D]`` or ``[N, Hkv * D]``, bf16/fp16/fp32) and store them at slots ``loc``
    of the MXFP8 pool ``kv`` (data and scale bytes), in one kernel. ``validate`` range-checks ``loc`` and refuses a
    slot named twice (one sync); every check runs before anything is written."""
    if not isinstance(kv, PagedKV):
        raise TypeError(f"kv must be a PagedKV, got {type(kv).__name__}")
    if not kv.is_mxfp8:
        raise ValueError("store_kv_mxfp8 needs an MXFP8 PagedKV (k_scales, v_scales and layout); use "
                         "InklingKVPool.set_kv_buffer for other pools")
    k3, v3 = _check_store_inputs(kv, loc, k, v, validate)
    n, hkv, d = loc.numel(), kv.num_kv_heads, kv.head_dim
    if n == 0:
        return
    quantize_store_kernel[(n, 2 * hkv)](
        k3, v3, loc, kv.k_buffer.view(torch.uint8), kv.v_buffer.view(torch.uint8),
        kv.k_scales.view(torch.uint8), kv.v_scales.view(torch.uint8),
        k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1), kv.k_buffer.stride(0), kv.k_buffer.stride(1),
        HKV=hkv, D=d, PAGE=kv.layout.page_size, INTERLEAVED=kv.layout.interleaved,
        num_warps=1 if d <= 128 else 2,
    )
