"""KV-cache views and stores, host-free: one layer's pool buffers as the kernels' ``PagedKV`` and the K/V write
that CUDA graphs can capture (no host sync).

- ``paged_kv``: one layer's buffers (bf16/fp16/fp32, per-tensor fp8 e4m3, MXFP8 with its scale buffers) as a
  ``PagedKV``;
- ``store_kv_unchecked``: write new K/V at given slots with no host sync and no slot validation (the caller's
  eager path validates; inside a graph nothing can be read back);
- ``dequantize_query``: an MXFP8 query (e4m3 values with UE8M0 block scales) back to float32.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch

from sglang_inkling_backend import kv_formats, mxfp8
from sglang_inkling_backend.attention_inputs import PagedKV
from sglang_inkling_backend.checks import require_tensor
from sglang_inkling_backend.scale_layout import ScaleLayout


class _UnroundedQuery:
    """The ``q_descale`` a prologue of ours returns with a bf16 q in MXFP8 mode (its host would otherwise round q
    itself): "this q was kept unrounded"."""

    def __repr__(self) -> str:
        return "UNROUNDED_QUERY"


UNROUNDED_QUERY = _UnroundedQuery()


def dequantize_query(q: torch.Tensor, num_heads: int, head_dim: int,
                     q_descale: Optional[torch.Tensor]) -> torch.Tensor:
    """``q [T, Hq * D]`` (or ``[T, Hq, D]``) as ``[T, Hq, D]``; an e4m3 q (the Inkling model's MXFP8 q) is
    dequantized with its UE8M0 block scales ``q_descale [T, Hq, D // 32]`` (any shape of that many bytes)."""
    if isinstance(q, torch.Tensor):
        require_tensor(q, "q", f"[tokens, {num_heads * head_dim}] or [tokens, {num_heads}, {head_dim}]")
    if not isinstance(q, torch.Tensor) or q.dim() not in (2, 3) or math.prod(q.shape[1:]) != num_heads * head_dim:
        desc = tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
        raise ValueError(f"q must be [tokens, {num_heads * head_dim}] or [tokens, {num_heads}, {head_dim}] (the "
                         f"layer's query heads), got {desc}")
    if not q.is_floating_point():
        raise TypeError(f"q must be a floating-point tensor (or float8_e4m3fn with q_descale), got {q.dtype}")
    rows = q.shape[0]
    q3 = q.reshape(rows, num_heads, head_dim)
    if q_descale is UNROUNDED_QUERY:
        q_descale = None
        if q.dtype == mxfp8.DATA_DTYPE:
            raise ValueError("q_descale says the query was kept unrounded (UNROUNDED_QUERY), but q is float8_e4m3fn")
    if q.dtype != mxfp8.DATA_DTYPE:
        if q_descale is not None:
            raise ValueError(f"q_descale (MXFP8 block scales) goes with a float8_e4m3fn q, got it with a {q.dtype} q")
        return q3
    if q_descale is None:
        raise ValueError("q arrived as float8_e4m3fn without q_descale (its MXFP8 block scales)")
    if isinstance(q_descale, torch.Tensor):
        require_tensor(q_descale, "q_descale", "a tensor of UE8M0 bytes")
    if not isinstance(q_descale, torch.Tensor) or q_descale.numel() != rows * num_heads * (head_dim // mxfp8.BLOCK):
        desc = tuple(q_descale.shape) if isinstance(q_descale, torch.Tensor) else type(q_descale).__name__
        raise ValueError(f"q_descale must hold {rows * num_heads * (head_dim // mxfp8.BLOCK)} UE8M0 bytes (one per 32 "
                         f"channels of q), got {desc}")
    scales = q_descale.view(torch.uint8).reshape(rows, num_heads, head_dim // mxfp8.BLOCK)
    return mxfp8.dequantize(q3, scales, torch.float32)


def paged_kv(kv_format: Union[kv_formats.KVFormat, str], k_buffer: torch.Tensor, v_buffer: torch.Tensor, *, page_size: int,
             k_scales: Optional[torch.Tensor] = None, v_scales: Optional[torch.Tensor] = None,
             k_scale: float = 1.0, v_scale: float = 1.0) -> PagedKV:
    """One layer's pool buffers as a ``PagedKV`` for the routes."""
    fmt = kv_formats.as_kv_format(kv_format)
    for name, t in (("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        require_tensor(t, name, "a 3-D tensor [slots, Hkv, D]")
    if fmt.block_scaled:
        if k_scales is None or v_scales is None:
            raise ValueError("an mxfp8 pool layer needs its scale buffers (get_kv_scale_buffer)")
        for name, t in (("k_scales", k_scales), ("v_scales", v_scales)):
            require_tensor(t, name, "a scale buffer of UE8M0 bytes")
        if k_buffer.dim() != 3:
            raise ValueError(f"k_buffer must be a 3-D tensor [slots, Hkv, D], got {tuple(k_buffer.shape)}")
        slots, hkv, d = k_buffer.shape
        layout = ScaleLayout.for_pool(slots, hkv, d, page_size)
        return PagedKV(k_buffer, v_buffer, k_scales.view(torch.uint8), v_scales.view(torch.uint8), layout)
    if fmt.tensor_scaled:
        return PagedKV(k_buffer, v_buffer, k_scale=k_scale, v_scale=v_scale)
    return PagedKV(k_buffer, v_buffer)


def refuse_views_of_pool(pool_buffers, **inputs: Optional[torch.Tensor]) -> None:
    """A ValueError naming the first of ``inputs`` (a write's K/V or scales) that is a view of one of
    ``pool_buffers`` (the storage it writes): the write would read what it writes, one side written before torch
    refuses the overlap or, quantizing, silently from half-written rows. Host-only (storage pointers), so it runs
    under CUDA-graph capture too."""
    pool = {t.untyped_storage().data_ptr() for t in pool_buffers if t is not None}
    for name, t in inputs.items():
        if isinstance(t, torch.Tensor) and t.numel() and t.untyped_storage().data_ptr() in pool:
            raise ValueError(f"{name} is a view of the KV pool's own buffers (the store would read what it writes); "
                             f"pass a copy ({name}.clone())")


def store_kv_unchecked(kv: PagedKV, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                       k_block_scales: Optional[torch.Tensor] = None,
                       v_block_scales: Optional[torch.Tensor] = None,
                       fused_store: Optional[Callable[..., None]] = None) -> None:
    """Write K/V at ``loc`` with no host sync (CUDA-graph capture). The caller guarantees valid slots; shapes are
    still checked (host metadata, no sync). ``fused_store(kv, loc, k, v, validate=False)`` (the route's, e.g. the
    Triton ``store_kv``) stores K and V into an MXFP8 pool (quantizing) or an unquantized one in one kernel; without
    it torch does (the torch quantizer: the same bytes away from e4m3 ties,
    ``tests/triton_tests/test_triton_decode_attention.py::test_store_bytes_identical_to_quantize_and_scatter``,
    ``gpu_tests/check_triton_gpu.py``; two indexed writes for an unquantized pool). A per-tensor fp8 pool (divide by
    its scale, saturate) is stored by torch. K, V or their block scales that are views of the pool's own buffers
    are refused (ValueError) before anything is written: the store would read what it writes."""
    refuse_views_of_pool((kv.k_buffer, kv.v_buffer, kv.k_scales, kv.v_scales),
                         k=k, v=v, k_block_scales=k_block_scales, v_block_scales=v_block_scales)
    if k.requires_grad or v.requires_grad:  # the pool must not join the caller's autograd graph (an indexed write
        k, v = k.detach(), v.detach()       # would); cheaper per call than torch.no_grad (2 us)
    n, hkv, d = loc.numel(), kv.num_kv_heads, kv.head_dim
    k, v = k.reshape(n, hkv, d), v.reshape(n, hkv, d)
    loc = loc.long()
    if k_block_scales is not None:  # pre-quantized MXFP8
        if not kv.is_mxfp8:
            raise ValueError("block scales need an MXFP8 pool")
        kv.k_buffer[loc] = k.view(mxfp8.DATA_DTYPE)
        kv.v_buffer[loc] = v.view(mxfp8.DATA_DTYPE)
        nb = d // mxfp8.BLOCK
        kv.layout.scatter(kv.k_scales, loc, k_block_scales.view(torch.uint8).reshape(n, hkv, nb), check=False)
        kv.layout.scatter(kv.v_scales, loc, v_block_scales.view(torch.uint8).reshape(n, hkv, nb), check=False)
    elif kv.is_mxfp8:
        if fused_store is not None:
            fused_store(kv, loc, k, v, validate=False)
        else:
            for buf, sf, x in ((kv.k_buffer, kv.k_scales, k), (kv.v_buffer, kv.v_scales, v)):
                data, scales = mxfp8.quantize(x)
                buf[loc] = data
                kv.layout.scatter(sf, loc, scales, check=False)
    elif kv.k_buffer.dtype == mxfp8.DATA_DTYPE:  # per-tensor fp8: divide by the scale, saturate
        kv.k_buffer[loc] = mxfp8.quantize_per_tensor(k, kv.k_scale)
        kv.v_buffer[loc] = mxfp8.quantize_per_tensor(v, kv.v_scale)
    elif fused_store is not None:
        fused_store(kv, loc, k, v, validate=False)
    else:
        kv.k_buffer[loc] = k.to(kv.k_buffer.dtype)
        kv.v_buffer[loc] = v.to(kv.v_buffer.dtype)
