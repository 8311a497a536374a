"""Torch reference for paged decode and extend attention: readable, float32 inside, the oracle for every kernel
and the CPU route.

A request's keys are ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``, pool slots in position order. Its queries are
its last positions: decode has one (position ``L - 1``), extend has ``qlen`` (positions ``L - qlen .. L - 1``, so a
cached prefix is ``L - qlen`` keys). For query position ``i`` and key position ``j`` (distance ``d = i - j``)::

    logit = (q . k_j) * softmax_scale  (+ rel_bias[row, h, d] if 0 <= d < rel_extent)
    logit = cap * tanh(logit / cap)                       if logit_cap > 0
    kept  = 0 <= d  and  (window is None or d <= window - 1)
    p     = softmax over kept keys (plus one sink logit per head in the denominator when sinks are given)

Inkling mode is ``softmax_scale = 1 / D`` with ``rel_bias`` (the log-length temperature tau is applied to q and to
r by the prologue, before this point); generic mode is the layer's scale, window, sinks and logit cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .. import mxfp8
from ..checks import (require_non_negative_real, require_positive_int, require_positive_real,
                      require_slots)
from ..scale_layout import ScaleLayout

FLOAT_KV_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass
class PagedKV:
    """One layer's K/V pool buffers ``[slots, Hkv, D]``: bf16/fp16/fp32; or float8_e4m3fn with a per-tensor
    ``k_scale``/``v_scale``; or MXFP8 (float8_e4m3fn plus ``k_scales``/``v_scales`` scale buffers in ``layout``)."""

    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    k_scales: Optional[torch.Tensor] = None
    v_scales: Optional[torch.Tensor] = None
    layout: Optional[ScaleLayout] = None
    k_scale: float = 1.0
    v_scale: float = 1.0

    def __post_init__(self):
        for name in ("k_buffer", "v_buffer"):
            buf = getattr(self, name)
            if not isinstance(buf, torch.Tensor) or buf.dim() != 3:
                raise ValueError(f"{name} must be a 3-D tensor [slots, Hkv, D], got "
                                 f"{tuple(buf.shape) if isinstance(buf, torch.Tensor) else type(buf).__name__}")
        if self.k_buffer.shape[:2] != self.v_buffer.shape[:2]:
            raise ValueError(f"k_buffer and v_buffer must agree on [slots, Hkv], got {tuple(self.k_buffer.shape)} "
                             f"and {tuple(self.v_buffer.shape)}")
        if self.k_buffer.dtype != self.v_buffer.dtype:
            raise TypeError(f"k_buffer and v_buffer must share a dtype, got {self.k_buffer.dtype} and "
                            f"{self.v_buffer.dtype}")
        if self.k_buffer.dtype not in FLOAT_KV_DTYPES + (mxfp8.DATA_DTYPE,):
            raise TypeError(f"k_buffer must be one of {FLOAT_KV_DTYPES + (mxfp8.DATA_DTYPE,)}, got {self.k_buffer.dtype}")
        has_scales = self.k_scales is not None or self.v_scales is not None
        if has_scales:
            if self.k_scales is None or self.v_scales is None or self.layout is None:
                raise ValueError("an MXFP8 PagedKV needs k_scales, v_scales and their layout")
            if self.k_buffer.dtype != mxfp8.DATA_DTYPE:
                raise TypeError(f"MXFP8 scale buffers need float8_e4m3fn data, got {self.k_buffer.dtype}")
            expected = (self.layout.num_slots, self.layout.num_kv_heads, self.layout.head_dim)
            if tuple(self.k_buffer.shape) != expected:
                raise ValueError(f"k_buffer must have shape {expected} to match its scale layout, "
                                 f"got {tuple(self.k_buffer.shape)}")
            self.layout.check_buffer(self.k_scales, "k_scales")
            self.layout.check_buffer(self.v_scales, "v_scales")

    @property
    def is_mxfp8(self) -> bool:
        return self.k_scales is not None

    @property
    def kv_format(self) -> str:
        """The pool's format as ``plan_decode(kv_format=)`` takes it: "mxfp8", "fp8" (per-tensor) or "float"."""
        return "mxfp8" if self.is_mxfp8 else "float" if self.k_buffer.dtype.itemsize > 1 else "fp8"

    @property
    def num_slots(self) -> int:
        return self.k_buffer.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.k_buffer.shape[1]

    @property
    def head_dim(self) -> int:
        return self.k_buffer.shape[2]

    def read(self, slots: torch.Tensor, check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized float32 ``(k, v)`` of ``slots`` (1-D int32/int64 in ``[0, num_slots)``): ``[N, Hkv, D]``
        each. ``check=False`` skips the slot checks (the caller has made them)."""
        slots = require_slots(slots, "slots", self.num_slots) if check else slots.long()
        k, v = self.k_buffer[slots], self.v_buffer[slots]
        if self.is_mxfp8:
            return (mxfp8.dequantize(k, self.layout.gather(self.k_scales, slots), torch.float32),
                    mxfp8.dequantize(v, self.layout.gather(self.v_scales, slots), torch.float32))
        if k.dtype == mxfp8.DATA_DTYPE:
            return k.float() * self.k_scale, v.float() * self.v_scale
        return k.float(), v.float()


@dataclass
class AttentionParams:
    softmax_scale: float
    window: Optional[int] = None  # keys at distance 0 .. window-1; None: all earlier keys
    rel_bias: Optional[torch.Tensor] = None  # [query rows, Hq, rel_extent]
    logit_cap: float = 0.0
    sinks: Optional[torch.Tensor] = None  # [Hq], one extra logit per head in the softmax denominator

    def __post_init__(self):
        self.softmax_scale = require_positive_real(self.softmax_scale, "softmax_scale")
        if self.window is not None:
            require_positive_int(self.window, "window")
        self.logit_cap = require_non_negative_real(self.logit_cap, "logit_cap")  # 0 disables it
        for name in ("rel_bias", "sinks"):
            t = getattr(self, name)
            if t is not None and (not isinstance(t, torch.Tensor) or not t.is_floating_point()):
                raise TypeError(f"{name} must be None or a floating-point tensor, got "
                                f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")


def inkling_params(head_dim: int, rel_bias: Optional[torch.Tensor], window: Optional[int] = None) -> AttentionParams:
    """Inkling mode: softmax scale 1/D (not 1/sqrt(D)), relative bias, optional local window."""
    return AttentionParams(softmax_scale=1.0 / head_dim, window=window, rel_bias=rel_bias)


def _check_indices(kv: PagedKV, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, batch: int) -> None:
    if not isinstance(kv, PagedKV):
        raise TypeError(f"kv must be a PagedKV, got {type(kv).__name__}")
    for name, t in (("kv_indptr", kv_indptr), ("kv_indices", kv_indices)):
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
            raise TypeError(f"{name} must be a 1-D int32/int64 tensor")
    if kv_indptr.numel() != batch + 1:
        raise ValueError(f"kv_indptr must have batch + 1 = {batch + 1} entries, got {kv_indptr.numel()}")
    if int(kv_indptr[0]) != 0 or bool((kv_indptr[1:] < kv_indptr[:-1]).any()):
        raise ValueError("kv_indptr must start at 0 and be non-decreasing")
    if int(kv_indptr[-1]) > kv_indices.numel():
        raise ValueError(f"kv_indptr[-1]={int(kv_indptr[-1])} exceeds kv_indices' length {kv_indices.numel()}")
    used = kv_indices[: int(kv_indptr[-1])]
    if used.numel() and (int(used.min()) < 0 or int(used.max()) >= kv.num_slots):
        raise ValueError(f"kv_indices must be slots in [0, {kv.num_slots}), got [{int(used.min())}, {int(used.max())}]")


def _check_query(q: torch.Tensor, kv: PagedKV, params: AttentionParams) -> None:
    if not isinstance(kv, PagedKV):
        raise TypeError(f"kv must be a PagedKV, got {type(kv).__name__}")
    if not isinstance(params, AttentionParams):
        raise TypeError(f"params must be an AttentionParams, got {type(params).__name__}")
    if not isinstance(q, torch.Tensor) or not q.is_floating_point() or q.dim() != 3:
        raise ValueError(f"q must be a floating-point [rows, Hq, D] tensor, got "
                         f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
    rows, hq, d = q.shape
    if d != kv.head_dim:
        raise ValueError(f"q's head_dim {d} does not match the pool's {kv.head_dim}")
    if hq % kv.num_kv_heads:
        raise ValueError(f"q's head count {hq} must be a multiple of the pool's KV heads {kv.num_kv_heads}")
    if params.rel_bias is not None and (params.rel_bias.dim() != 3 or tuple(params.rel_bias.shape[:2]) != (rows, hq)):
        raise ValueError(f"rel_bias must have shape [{rows}, {hq}, rel_extent], got {tuple(params.rel_bias.shape)}")
    if params.sinks is not None and tuple(params.sinks.shape) != (hq,):
        raise ValueError(f"sinks must have shape [{hq}], got {tuple(params.sinks.shape)}")


def attend(q: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttentionParams,
           rel_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Dense attention of query rows ``q [R, Hq, D]`` at positions ``q_pos [R]`` over keys ``k, v [L, Hkv, D]`` at
    positions ``0..L-1``. float32 in, float32 out ``[R, Hq, D]``."""
    rows, hq, _ = q.shape
    group = hq // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # [L, Hq, D]: query head h reads KV head h // group
    v = v.repeat_interleave(group, dim=1)
    logits = torch.einsum("rhd,lhd->rhl", q, k) * params.softmax_scale
    dist = q_pos.view(-1, 1) - torch.arange(k.shape[0], device=q.device).view(1, -1)  # [R, L]
    if rel_bias is not None:
        extent = rel_bias.shape[-1]
        in_reach = (dist >= 0) & (dist < extent)
        idx = dist.clamp(0, extent - 1).unsqueeze(1).expand(rows, hq, -1)
        logits = logits + torch.where(in_reach.unsqueeze(1), rel_bias.float().gather(2, idx), 0.0)
    if params.logit_cap > 0:
        logits = params.logit_cap * torch.tanh(logits / params.logit_cap)
    keep = dist >= 0
    if params.window is not None:
        keep &= dist <= params.window - 1
    logits = logits.masked_fill(~keep.unsqueeze(1), float("-inf"))
    if params.sinks is not None:
        sink = params.sinks.float().view(1, hq, 1).expand(rows, hq, 1)
        probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(logits, dim=-1)
    return torch.einsum("rhl,lhd->rhd", probs, v)


def paged_decode_attention(q: torch.Tensor, kv: PagedKV, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                           params: AttentionParams) -> torch.Tensor:
    """One new query per request: ``q [B, Hq, D]`` -> ``[B, Hq, D]`` float32. Request b's query sits at the position
    of its last key."""
    _check_query(q, kv, params)
    batch = q.shape[0]
    _check_indices(kv, kv_indptr, kv_indices, batch)
    if bool((kv_indptr[1:] == kv_indptr[:-1]).any()):  # the Triton kernels' rule too (validate_slots)
        raise ValueError(f"every decode request needs at least one key (its own), got kv lens "
                         f"{kv_indptr.diff().tolist()}")
    qo_indptr = torch.arange(batch + 1, device=q.device)
    return _paged_attention(q, kv, kv_indptr, kv_indices, qo_indptr, params)


def paged_extend_attention(q: torch.Tensor, kv: PagedKV, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                           qo_indptr: torch.Tensor, params: AttentionParams) -> torch.Tensor:
    """Several new queries per request (prefill with a cached prefix, chunked prefill): ``q [T, Hq, D]``, request
    b's rows ``qo_indptr[b]:qo_indptr[b+1]`` are its last positions; causal."""
    _check_query(q, kv, params)
    if not isinstance(qo_indptr, torch.Tensor) or qo_indptr.dim() != 1 or qo_indptr.dtype not in (torch.int32,
                                                                                                   torch.int64):
        raise TypeError("qo_indptr must be a 1-D int32/int64 tensor")
    batch = qo_indptr.numel() - 1
    _check_indices(kv, kv_indptr, kv_indices, batch)
    if int(qo_indptr[-1]) != q.shape[0]:
        raise ValueError(f"qo_indptr[-1]={int(qo_indptr[-1])} must equal q's row count {q.shape[0]}")
    qlens, kvlens = qo_indptr.diff(), kv_indptr.diff()
    if bool((qlens > kvlens).any()):
        raise ValueError(f"each request needs at least as many keys as queries, got qlens {qlens.tolist()} "
                         f"and kv lens {kvlens.tolist()}")
    return _paged_attention(q, kv, kv_indptr, kv_indices, qo_indptr, params)


def _paged_attention(q, kv, kv_indptr, kv_indices, qo_indptr, params) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b in range(qo_indptr.numel() - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k0, k1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
        if q1 == q0:
            continue
        k, v = kv.read(kv_indices[k0:k1], check=False)  # _check_indices checked every slot
        length = k1 - k0
        q_pos = torch.arange(length - (q1 - q0), length, device=q.device)
        bias = params.rel_bias[q0:q1] if params.rel_bias is not None else None
        out[q0:q1] = attend(q[q0:q1].float(), q_pos, k, v, params, bias)
    return out
