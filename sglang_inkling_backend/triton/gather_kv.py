"""Gather K/V rows of a pool into contiguous tensors, dequantized: the ragged K/V a dense prefill kernel (FlashInfer's
ragged prefill, ``sglang_inkling_backend.flashinfer``) reads for an extend.

``gather_kv(kv, slots)`` gives ``k, v [N, Hkv, D]`` in ``gather_dtype(kv)``: the pool's dtype for a bf16/fp16 pool;
bf16 for an MXFP8 pool (e4m3 times a power-of-two block scale is exact in bf16, whose exponent range is float32's)
and for a per-tensor fp8 pool, whose raw e4m3 values are returned WITHOUT ``k_scale``/``v_scale`` (exact in bf16;
the caller folds the scales into the softmax scale and the output, as the Triton kernels do). So the values are
exactly those the Triton extend kernel multiplies (``device.load_kv_tile``), and ``PagedKV.read`` (float32) equals
them cast to float32, times the per-tensor scale for fp8.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..attention_inputs import FLOAT_KV_DTYPES, PagedKV
from ..checks import require_slots, require_tensor
from .device import load_kv_tile
from .inputs import kv_data, kv_format_code, scale_args

_TL_DTYPE = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def gather_kv_kernel(
    k_ptr, v_ptr, ksf_ptr, vsf_ptr, slots_ptr, num_rows, k_out_ptr, v_out_ptr,
    stride_k_slot, stride_k_head, stride_v_slot, stride_v_head,
    HKV: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr, PAGE: tl.constexpr,
    INTERLEAVED: tl.constexpr, OUT_DTYPE: tl.constexpr,
):
    blk = tl.program_id(0)
    h = tl.program_id(1)
    rows = blk * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rows < num_rows
    slots = tl.load(slots_ptr + rows, mask=mask, other=0).to(tl.int64)
    out = rows.to(tl.int64)[:, None] * (HKV * D) + h * D + tl.arange(0, D)[None, :]
    k = load_kv_tile(k_ptr, ksf_ptr, slots, mask, h, stride_k_slot, stride_k_head,
                     HKV, D, BLOCK_N, KV_FORMAT, PAGE, INTERLEAVED, OUT_DTYPE)
    tl.store(k_out_ptr + out, k, mask=mask[:, None])
    v = load_kv_tile(v_ptr, vsf_ptr, slots, mask, h, stride_v_slot, stride_v_head,
                     HKV, D, BLOCK_N, KV_FORMAT, PAGE, INTERLEAVED, OUT_DTYPE)
    tl.store(v_out_ptr + out, v, mask=mask[:, None])


def gather_dtype(kv: PagedKV) -> torch.dtype:
    """The dtype ``gather_kv`` returns for this pool (see the module docstring)."""
    dtype = kv.k_buffer.dtype
    return dtype if dtype in FLOAT_KV_DTYPES else torch.bfloat16


def gather_kv(kv: PagedKV, slots: torch.Tensor, *, validate: bool = True, block_n: int = 32,
              out: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k, v)``, each ``[N, Hkv, D]`` in ``gather_dtype(kv)``: the rows at ``slots`` (1-D int32/int64, ``N``
    entries). ``validate`` range-checks the slots first (one sync); ``out`` gives the two destination tensors."""
    if not isinstance(kv, PagedKV):
        raise TypeError(f"kv must be a PagedKV, got {type(kv).__name__}")
    if validate:
        slots = require_slots(slots, "slots", kv.num_slots)
    elif require_tensor(slots, "slots", "a 1-D tensor").dim() != 1:
        raise ValueError("slots must be a 1-D tensor")
    if slots.device != kv.k_buffer.device:
        raise ValueError(f"slots must be on the pool's device {kv.k_buffer.device}, got {slots.device}")
    n, hkv, d = slots.numel(), kv.num_kv_heads, kv.head_dim
    dtype = gather_dtype(kv)
    if out is None:
        out = (torch.empty((n, hkv, d), dtype=dtype, device=slots.device),
               torch.empty((n, hkv, d), dtype=dtype, device=slots.device))
    for name, t in zip(("out[0]", "out[1]"), out):
        if tuple(t.shape) != (n, hkv, d) or t.dtype != dtype or not t.is_contiguous() or t.device != slots.device:
            raise ValueError(f"{name} must be a contiguous {dtype} tensor of shape {(n, hkv, d)} on "
                             f"{slots.device}, got {t.dtype} {tuple(t.shape)} on {t.device}")
    if n == 0:
        return out
    ksf, vsf, page, interleaved = scale_args(kv)
    gather_kv_kernel[(triton.cdiv(n, block_n), hkv)](
        *kv_data(kv), ksf, vsf, slots.contiguous(), n, out[0], out[1],
        kv.k_buffer.stride(0), kv.k_buffer.stride(1), kv.v_buffer.stride(0), kv.v_buffer.stride(1),
        HKV=hkv, D=d, BLOCK_N=block_n, KV_FORMAT=kv_format_code(kv), PAGE=page, INTERLEAVED=interleaved,
        OUT_DTYPE=_TL_DTYPE[dtype],
    )
    return out
