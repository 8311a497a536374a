"""Torch reference for paged decode and extend attention: readable, float32 inside, the oracle for every kernel
and the CPU route.

A request's keys are ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``, pool slots in position order. Its queries are
its last positions: decode has one (position ``L - 1``), extend has ``qlen`` (positions ``L - qlen .. L - 1``, so a
cached prefix is ``L - qlen`` keys). For query position ``i`` and key position ``j`` (distance ``d = i - j``)::

    logit = (q . k_j) * softmax_scale  (+ rel_bias[row, h, d] if 0 <= d < rel_extent)
    logit = cap * tanh(logit / cap)                       if logit_cap > 0
    kept  = 0 <= d  and  (window is None or d <= window - 1)
    p     = softmax over kept keys (plus one sink logit per head in the denominator when sinks are given)

A speculative verify step (``verify``, a ``SpecVerify``) is an extend whose queries are a request's draft tokens:
with ``P`` cached keys, draft i sits at position ``P + depth_i`` as a query and as a key, and sees the prefix and
the drafts its tree mask lets it see (``kept`` also needs ``mask[i, j]`` for a draft key j). A chain is an extend.

Inkling mode is ``softmax_scale = 1 / D`` with ``rel_bias`` (the log-length temperature tau is applied to q and to
r by the prologue, before this point); generic mode is the layer's scale, window, sinks and logit cap.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..attention_inputs import AttentionParams, PagedKV, SpecVerify, check_rel_bias
from ..checks import require_extents, require_tensor


def _check_indices(kv: PagedKV, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, batch: int) -> None:
    if not isinstance(kv, PagedKV):
        raise TypeError(f"kv must be a PagedKV, got {type(kv).__name__}")
    for name, t in (("kv_indptr", kv_indptr), ("kv_indices", kv_indices)):
        if require_tensor(t, name, "a 1-D int32/int64 tensor").dtype not in (torch.int32, torch.int64) or t.dim() != 1:
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
    require_tensor(q, "q", "a floating-point [rows, Hq, D] tensor")
    require_extents(q, "q", (None, "Hq (query heads)", "D (head_dim)"))
    rows, hq, d = q.shape
    if d != kv.head_dim:
        raise ValueError(f"q's head_dim {d} does not match the pool's {kv.head_dim}")
    if hq % kv.num_kv_heads:
        raise ValueError(f"q's head count {hq} must be a multiple of the pool's KV heads {kv.num_kv_heads}")
    if params.rel_bias is not None:
        check_rel_bias(require_tensor(params.rel_bias, "rel_bias"), rows, hq)
    if params.sinks is not None and tuple(require_tensor(params.sinks, "sinks").shape) != (hq,):
        raise ValueError(f"sinks must have shape [{hq}], got {tuple(params.sinks.shape)}")


def attend(q: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, params: AttentionParams,
           rel_bias: Optional[torch.Tensor] = None, k_pos: Optional[torch.Tensor] = None,
           visible: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Dense attention of query rows ``q [R, Hq, D]`` at positions ``q_pos [R]`` over keys ``k, v [L, Hkv, D]`` at
    positions ``k_pos [L]`` (default ``0..L-1``). ``visible [R, L]`` (bool): which keys each row may see at all (a
    verify step's tree mask), on top of the causal and window rules. float32 in, float32 out ``[R, Hq, D]``. A
    non-finite value in a key's V changes only the rows that keep that key."""
    rows, hq, _ = q.shape
    group = hq // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # [L, Hq, D]: query head h reads KV head h // group
    v = v.repeat_interleave(group, dim=1)
    logits = torch.einsum("rhd,lhd->rhl", q, k) * params.softmax_scale
    if k_pos is None:
        k_pos = torch.arange(k.shape[0], device=q.device)
    dist = q_pos.view(-1, 1) - k_pos.view(1, -1)  # [R, L]
    if rel_bias is not None:
        extent = rel_bias.shape[-1]
        in_reach = (dist >= 0) & (dist < extent)
        idx = dist.clamp(0, extent - 1).unsqueeze(1).expand(rows, hq, -1)
        logits = logits + torch.where(in_reach.unsqueeze(1), rel_bias.float().gather(2, idx), 0.0)
    if params.logit_cap > 0:
        logits = params.logit_cap * torch.tanh(logits / params.logit_cap)
    keep = dist >= 0
    if visible is not None:
        keep &= visible
    if params.window is not None:
        keep &= dist <= params.window - 1
    logits = logits.masked_fill(~keep.unsqueeze(1), float("-inf"))
    if params.sinks is not None:
        sink = params.sinks.float().view(1, hq, 1).expand(rows, hq, 1)
        probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(logits, dim=-1)
    finite = torch.isfinite(v)
    if bool(finite.all()):
        return torch.einsum("rhl,lhd->rhd", probs, v)
    # A key's non-finite V reaches only the rows that keep it (0 * NaN would reach every row): the finite values
    # are summed as they are, and a kept key's non-finite one gives its rows what IEEE arithmetic gives a
    # positive weight times it (inf stays inf, inf + -inf and NaN are NaN), channel by channel.
    out = torch.einsum("rhl,lhd->rhd", probs, torch.where(finite, v, 0.0))
    kept = keep.unsqueeze(1).expand(rows, hq, -1).float()

    def reaches(which: torch.Tensor) -> torch.Tensor:
        return torch.einsum("rhl,lhd->rhd", kept, which.float()) > 0

    nan, pos, neg = reaches(torch.isnan(v)), reaches(v == float("inf")), reaches(v == float("-inf"))
    out = torch.where(pos, float("inf"), out)
    out = torch.where(neg, float("-inf"), out)
    return torch.where(nan | (pos & neg), float("nan"), out)


def paged_decode_attention(q: torch.Tensor, kv: PagedKV, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                           params: AttentionParams) -> torch.Tensor:
    """One new query per request: ``q [B, Hq, D]`` -> ``[B, Hq, D]`` float32. Request b's query sits at the position
    of its last key."""
    _check_query(q, kv, params)
    batch = q.shape[0]
    _check_indices(kv, kv_indptr, kv_indices, batch)
    if bool((kv_indptr[1:] == kv_indptr[:-1]).any()):  # the Triton kernels' rule too (validate_slots)
        raise ValueError(f"every decode request needs at least one key (its own): kv_indptr gives key counts "
                         f"{kv_indptr.diff().tolist()}")
    qo_indptr = torch.arange(batch + 1, device=q.device)
    return _paged_attention(q, kv, kv_indptr, kv_indices, qo_indptr, params)


def paged_extend_attention(q: torch.Tensor, kv: PagedKV, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                           qo_indptr: torch.Tensor, params: AttentionParams,
                           verify: Optional[SpecVerify] = None) -> torch.Tensor:
    """Several new queries per request (prefill with a cached prefix, chunked prefill): ``q [T, Hq, D]``, request
    b's rows ``qo_indptr[b]:qo_indptr[b+1]`` are its last positions; causal. With ``verify`` (a speculative verify
    step) those rows are the request's draft tokens, the last keys of its rail, seen per its tree mask at positions
    given by their depths (the module docstring)."""
    _check_query(q, kv, params)
    if verify is not None and not isinstance(verify, SpecVerify):
        raise TypeError(f"verify must be None or a SpecVerify, got {type(verify).__name__}")
    require_tensor(qo_indptr, "qo_indptr", "a 1-D int32/int64 tensor")
    if qo_indptr.dim() != 1 or qo_indptr.dtype not in (torch.int32, torch.int64):
        raise TypeError("qo_indptr must be a 1-D int32/int64 tensor")
    batch = qo_indptr.numel() - 1
    if batch < 1:
        raise ValueError(f"qo_indptr must have batch + 1 >= 2 entries, got {qo_indptr.numel()}")
    _check_indices(kv, kv_indptr, kv_indices, batch)
    if int(qo_indptr[0]) != 0 or bool((qo_indptr.diff() < 0).any()):
        raise ValueError(f"qo_indptr must start at 0 and be non-decreasing, with batch + 1 >= 2 entries, got "
                         f"{qo_indptr.tolist()[:8]}")
    if int(qo_indptr[-1]) != q.shape[0]:
        raise ValueError(f"qo_indptr[-1]={int(qo_indptr[-1])} must equal q's row count {q.shape[0]}")
    qlens, kvlens = qo_indptr.diff(), kv_indptr.diff()
    if bool((qlens > kvlens).any()):
        raise ValueError(f"each request needs at least as many keys as queries: qo_indptr gives query counts "
                         f"{qlens.tolist()}, kv_indptr key counts {kvlens.tolist()}")
    if verify is not None:
        verify.check_queries(qo_indptr)
    return _paged_attention(q, kv, kv_indptr, kv_indices, qo_indptr, params, verify)


def _paged_attention(q, kv, kv_indptr, kv_indices, qo_indptr, params, verify=None) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b in range(qo_indptr.numel() - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        k0, k1 = int(kv_indptr[b]), int(kv_indptr[b + 1])
        if q1 == q0:
            continue
        k, v = kv.read(kv_indices[k0:k1], check=False)  # _check_indices checked every slot
        length, n = k1 - k0, q1 - q0
        q_pos = torch.arange(length - n, length, device=q.device)
        k_pos = visible = None
        if verify is not None:  # the drafts: positions prefix + depth, the prefix all visible, the drafts per mask
            mask, depth = verify.request(b, q.device)
            prefix = length - n
            q_pos = prefix + depth
            k_pos = torch.cat([torch.arange(prefix, device=q.device), q_pos])
            visible = torch.cat([torch.ones(n, prefix, dtype=torch.bool, device=q.device), mask], dim=1)
        bias = params.rel_bias[q0:q1] if params.rel_bias is not None else None
        out[q0:q1] = attend(q[q0:q1].float(), q_pos, k, v, params, bias, k_pos, visible)
    return out
