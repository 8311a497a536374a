"""What a route keeps and checks once per step, shared by every route and host: the plans of a group of layers
(``DecodeGroupPlan``, ``ExtendGroupPlan``), the step's plans by key for the paths that plan per layer
(``DecodePlanCache``, views of the route's workspace) and the check of an extend's keys (``check_extend_keys``).
Host-free and accelerator-free."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Optional, Union

import torch

from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV
from sglang_inkling_backend.checks import require_slots
from sglang_inkling_backend.rails import KVPages, KVRails


@dataclass(frozen=True)
class DecodeGroupPlan:
    """One step's decode for a group of layers that share everything a decode plan depends on (window, head counts,
    head_dim, the pool's dtype, format and slots), made once per step where the host hands over the batch
    (``Route.plan_decode_group``): the step's keys for the group, checked against the pool, and the route's kernel
    plan. A layer of the group then checks only its own tensors and runs it (``Route.run_decode_group``)."""

    window: Optional[int]
    batch: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: torch.dtype
    num_slots: int
    keys: Union[KVRails, KVPages]
    kernel_plan: object  # the route's (GpuRoute: triton.DecodePlan)


@dataclass(frozen=True)
class ForwardRows:
    """Where an extend's own new rows go among its keys when they are read from the forward's K/V
    (``layer_step.forward_rows_keys``): ``positions`` of the new rows among the gathered keys (None: every key is
    new, the forward's K/V are the keys) and ``dense``, the keys' order ``[0, nnz)``. Host-free tensors on the
    pool's device, the same for every layer of the step with the same window."""

    positions: Optional[torch.Tensor]
    dense: torch.Tensor


@dataclass(frozen=True)
class ExtendGroupPlan:
    """One step's extend for a group of layers that share everything its plan depends on (window, head counts,
    head_dim, the pool's dtype, format and slots), made once per step where the host hands over the batch
    (``Route.plan_extend_group``): the extend's rails and query offsets, checked against the pool
    (``check_extend_keys``), where the new rows go when read from the forward (``forward_rows``, None where the
    host reads them from the pool) and the route's kernel plan. A layer of the group then checks only its own
    tensors and runs it (``Route.run_extend_group``)."""

    window: Optional[int]
    rows: int  # the extend's query rows
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: torch.dtype
    num_slots: int
    rails: KVRails
    qo_indptr: torch.Tensor
    forward_rows: Optional[ForwardRows]
    kernel_plan: object  # the route's (GpuRoute: flashinfer.FlashInferExtendPlan, or triton.ExtendBlocks)
    params: AttentionParams  # the planning layer's: a layer with others (scale, cap, bias) plans for itself


class DecodePlanCache:
    """The decode plans of one step (one forward metadata), keyed by everything a plan depends on (window, head
    counts, head_dim, KV dtype, page size, batch size, max_seq_len). Every layer with the same key shares one plan:
    plans hold views of the route's one workspace, allocated at start-up, so making a plan allocates nothing, and a
    plan made while a CUDA graph is being captured stays valid for every replay."""

    def __init__(self) -> None:
        self._plans: dict = {}
        self._checked: set = set()
        self._values: dict = {}

    def value(self, key: Hashable, make: Callable[[], object]):
        """A value of this step shared by its layers (not a decode plan), made with ``make()`` on first use."""
        if key not in self._values:
            self._values[key] = make()
        return self._values[key]

    def get(self, key: Hashable, make: Callable[[], object]):
        """The plan for ``key``, made with ``make()`` on first use."""
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = make()
        return plan

    def has(self, key: Hashable) -> bool:
        """Whether a plan for ``key`` was made this step."""
        return key in self._plans

    def once(self, key: Hashable, check: Callable[[], object]) -> None:
        """Run ``check()`` the first time ``key`` is seen in this step (a check of the step's keys: once, not per
        layer); if it raises, it runs again next time."""
        if key not in self._checked:
            check()
            self._checked.add(key)

    # The step's checks and layouts that several rooms ask for (the layer step, the routes): each key spelled here.
    def check_extend_keys_once(self, kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor, rows: int,
                               window: Optional[int]) -> None:
        """``check_extend_keys`` once per step, window and pool size."""
        self.once(("extend keys", window, kv.num_slots), lambda: check_extend_keys(kv, rails, qo_indptr, rows))

    def check_verify_queries_once(self, verify, qo_indptr: torch.Tensor, window: Optional[int]) -> None:
        """A verify step's query offsets against its trees (``SpecVerify.check_queries``), once per step and
        window."""
        self.once(("verify queries", window), lambda: verify.check_queries(qo_indptr))

    def forward_rows(self, rails: KVRails, qo_indptr: torch.Tensor, rows: int,
                     window: Optional[int]) -> ForwardRows:
        """``forward_rows_layout``, made once per step, window and row count."""
        return self.value(("extend rows from the forward", window, rows),
                          lambda: forward_rows_layout(rails, qo_indptr, rows))

    def __len__(self) -> int:
        return len(self._plans)

    def plans(self) -> list:
        return list(self._plans.values())



def forward_rows_layout(rails: KVRails, qo_indptr: torch.Tensor, rows: int) -> ForwardRows:
    """Where an extend's ``rows`` new rows go among its keys (``ForwardRows``; one device read where the step has a
    cached prefix). The rails and offsets are checked by the caller (``check_extend_keys``)."""
    device = qo_indptr.device
    r = torch.arange(rows, device=device)
    if rails.indptr.shape == qo_indptr.shape and bool(torch.equal(rails.indptr, qo_indptr)):
        return ForwardRows(None, r)  # every key is new
    b = torch.searchsorted(qo_indptr[1:].contiguous(), r, right=True)
    nnz = int(rails.indptr[-1])
    return ForwardRows(rails.indptr[b + 1] - qo_indptr[b + 1] + r, torch.arange(nnz, device=device))


def keys_with_forward_rows(gather_keys: Callable, kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor,
                           layout: ForwardRows, new_k: torch.Tensor, new_v: torch.Tensor
                           ) -> tuple[PagedKV, KVRails]:
    """An extend's keys with its own new rows taken from the forward's K/V ``new_k``/``new_v [rows, Hkv, D]``
    (float) and the cached prefix from the pool, as dense rails over new K/V buffers. Without a prefix the
    forward's K/V are the keys, nothing is gathered; else the rails' rows are gathered (``gather_keys(kv, slots)``,
    a route's ``gather_keys``) and the new rows written over theirs."""
    if layout.positions is None:  # contiguous rows (a split of a fused qkv is a strided view): what every kernel reads
        return PagedKV(new_k.contiguous(), new_v.contiguous()), KVRails(qo_indptr, layout.dense, dense=True)
    k, v = gather_keys(kv, rails.indices[:layout.dense.numel()])
    k[layout.positions] = new_k.to(k.dtype)
    v[layout.positions] = new_v.to(v.dtype)
    return PagedKV(k, v), KVRails(rails.indptr, layout.dense, dense=True)


def check_extend_keys(kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor, rows: int) -> bool:
    """The extend's keys as the kernels read them (two device reads): ``qo_indptr`` and the rails' ``indptr`` from 0,
    non-decreasing, one entry per request each, ``qo_indptr`` ending at the query's ``rows``; every request with at
    least as many keys as queries; every slot read in ``[0, kv.num_slots)``. ValueError/TypeError naming what is
    wrong; True when all hold."""
    for name, t in (("qo_indptr", qo_indptr), ("the extend rails' indptr", rails.indptr),
                    ("the extend rails' indices", rails.indices)):
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
            raise TypeError(f"{name} must be a 1-D int32/int64 tensor, got "
                            f"{f'{t.dtype} {tuple(t.shape)}' if isinstance(t, torch.Tensor) else type(t).__name__}")
    if qo_indptr.numel() != rails.indptr.numel() or qo_indptr.numel() < 2:
        raise ValueError(f"qo_indptr and the extend rails' indptr must both have batch + 1 >= 2 entries, got "
                         f"{qo_indptr.numel()} and {rails.indptr.numel()}")
    both = torch.cat([qo_indptr.to(rails.indptr.device, torch.int64), rails.indptr.to(torch.int64)]).tolist()
    qo, kvp = both[:qo_indptr.numel()], both[qo_indptr.numel():]  # one device read for both
    if qo[0] != 0 or qo[-1] != rows or any(a > b for a, b in zip(qo, qo[1:])):
        raise ValueError(f"qo_indptr must start at 0, be non-decreasing and end at the query's {rows} rows, got "
                         f"{qo if len(qo) <= 8 else qo[:4] + ['...'] + qo[-2:]}")
    if kvp[0] != 0 or any(a > b for a, b in zip(kvp, kvp[1:])):
        raise ValueError("the extend rails' indptr must start at 0 and be non-decreasing")
    if kvp[-1] > rails.indices.numel():
        raise ValueError(f"the extend rails' indptr ends at {kvp[-1]}, past its {rails.indices.numel()} indices")
    short = [b for b in range(len(qo) - 1) if qo[b + 1] - qo[b] > kvp[b + 1] - kvp[b]]
    if short:
        b = short[0]
        raise ValueError(f"extend request {b} has {qo[b + 1] - qo[b]} queries (qo_indptr) but {kvp[b + 1] - kvp[b]} "
                         "keys (the rails' indptr); each request's keys include its queries")
    require_slots(rails.indices[:kvp[-1]], "the extend rails' slots", kv.num_slots)
    return True
