"""An extend's attention through FlashInfer's ragged prefill, over any KV format the pool holds.

Semantics are ``reference.attention.paged_extend_attention``: request b's query rows are its last positions and see,
causally, every key of its rail the window allows. FlashInfer's ragged prefill with ``causal=True`` aligns the
diagonal bottom-right when a request has more keys than queries, which is that rule; ``window_left = window - 1``
(FlashInfer counts the keys left of the query's own); its soft cap is ``cap * tanh(x / cap)`` on the scaled logit,
as ours.

Per layer: the route's ``gather_kv`` (``gpu.route`` hands it the Triton gather, ``triton/gather_kv.py``; this
family imports no other) reads the rail's slots into contiguous K/V in ``gather_dtype(kv)`` (dequantized MXFP8,
exact in bf16; raw e4m3 for a per-tensor fp8 pool, whose ``k_scale`` goes into the softmax scale and ``v_scale``
onto the output), then FlashInfer runs on them with the query in that dtype: the values the Triton extend kernel
multiplies, so the two agree to accumulation order. Per step and (window, cap, scale, shape): one ``plan`` (host
indptrs: one sync), in the step's plan cache, shared by every layer with that key; a layer itself reads nothing
from the device (a sync per layer would leave the GPU idle while the host launches the next kernels).

Served: no relative bias, no sinks, head_dim 64/128/256, a bf16/fp16/fp8/MXFP8 pool and a bf16/fp16 query; the
route runs its Triton kernel for other layers (``why_not`` says why, the route logs it once).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .. import settings
from ..attention_inputs import AttentionParams, PagedKV
from ..rails import KVRails
from .install import HEAD_DIMS, QUERY_DTYPES, find_flashinfer, float_workspace, plan_logging_first

logger = logging.getLogger(__name__)

EXTEND_KERNEL_ENV = settings.EXTEND_KERNEL.name  # auto (default): FlashInfer where it serves; triton; flashinfer


def extend_family(device: torch.device, workspace: Optional[torch.Tensor] = None
                  ) -> tuple[Optional["FlashInferExtend"], str]:
    """``(FlashInferExtend, note)`` where FlashInfer serves extends on ``device`` and ``INKLING_EXTEND_KERNEL``
    allows it, else ``(None, why)``. ``INKLING_EXTEND_KERNEL=flashinfer`` raises (ValueError) when it cannot.
    ``workspace``: the route's float workspace (``install.float_workspace``), allocated here when None."""
    flashinfer, why = find_flashinfer(EXTEND_KERNEL_ENV, "BatchPrefillWithRaggedKVCacheWrapper", device)
    if flashinfer is None:
        return None, why
    family = FlashInferExtend(flashinfer, device, workspace)
    return family, f"FlashInfer {family.version} ragged prefill"


@dataclass(frozen=True)
class FlashInferExtendPlan:
    """A step's ragged prefill for a group of layers: the planned wrapper, the step's key count (a host int), the
    dtype the keys are read in and their per-tensor scales (``effective_scales``: the K scale is in the wrapper's
    softmax scale, the V scale goes onto the output)."""

    wrapper: object
    nnz: int
    dtype: torch.dtype
    k_scale: float
    v_scale: float


def effective_scales(kv: PagedKV) -> tuple[float, float]:
    """The per-tensor scales FlashInfer's plan and output take for ``kv``: a per-tensor fp8 pool's, else 1.0 (the
    gathered keys of every other format are the values themselves)."""
    return (kv.k_scale, kv.v_scale) if kv.kv_format.tensor_scaled else (1.0, 1.0)


class FlashInferExtend:
    """The family. The route's float workspace (``install.float_workspace``, allocated at the route's construction)
    and one FlashInfer wrapper per plan key, shared by every step; each step plans each key once."""

    name = "flashinfer"

    def __init__(self, flashinfer, device: torch.device, workspace: Optional[torch.Tensor] = None):
        self._flashinfer = flashinfer
        self.version = getattr(flashinfer, "__version__", "?")
        self.workspace = float_workspace(device) if workspace is None else workspace
        self._wrappers: dict = {}
        self.served = False  # True after the first extend it ran (the route falls back only before that)

    def why_not(self, q: torch.Tensor, kv: PagedKV, params: AttentionParams) -> str:
        """"" when this family serves the layer, else the reason (a phrase for a log line)."""
        return self.layer_why_not(q.dtype, kv, params)

    def layer_why_not(self, q_dtype: torch.dtype, kv: PagedKV, params: AttentionParams) -> str:
        """``why_not`` from the query's dtype alone: a step plans its layer groups before it has their queries."""
        if params.rel_bias is not None:
            return "a relative bias (FlashInfer's ragged prefill adds none)"
        if params.sinks is not None:
            return "attention sinks"
        if kv.head_dim not in HEAD_DIMS:
            return f"head_dim {kv.head_dim} (FlashInfer's prefill serves {HEAD_DIMS})"
        if kv.k_buffer.dtype == torch.float32 or q_dtype not in QUERY_DTYPES:
            return f"a {kv.k_buffer.dtype} pool with a {q_dtype} query (FlashInfer's prefill is 16-bit)"
        return ""

    def _plan(self, key, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, hq: int, hkv: int, d: int,
              dtype: torch.dtype, window: Optional[int], logit_cap: float, sm_scale: float):
        """``(wrapper, nnz)``: the key's wrapper planned for this step, and the step's key count (a host int, so
        the layers read no device value)."""
        wrapper = self._wrappers.get(key)
        if wrapper is None:
            wrapper = self._wrappers[key] = self._flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
                self.workspace, "NHD")
        qo_host, kv_host = qo_indptr.to("cpu", torch.int32), kv_indptr.to("cpu", torch.int32)  # one sync
        plan_logging_first("ragged prefill", (hq, hkv, d, dtype, window, logit_cap), lambda: wrapper.plan(
            qo_host, kv_host, hq, hkv, d, causal=True, window_left=window - 1 if window is not None else -1,
            logits_soft_cap=logit_cap if logit_cap > 0 else None, sm_scale=sm_scale,
            q_data_type=dtype, kv_data_type=dtype))
        return wrapper, int(kv_host[-1])

    def plan(self, num_q_heads: int, kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor,
             params: AttentionParams, plans, *, gather_dtype: Callable) -> FlashInferExtendPlan:
        """The step's plan for layers of ``num_q_heads`` over ``kv`` (its keys gathered in ``gather_dtype(kv)``)
        and ``params`` (one sync where the step has not planned this key yet; shared through ``plans``)."""
        k_scale, v_scale = effective_scales(kv)
        return self.plan_keys(num_q_heads, kv.num_kv_heads, kv.head_dim, gather_dtype(kv), k_scale, v_scale, rails,
                              qo_indptr, params, plans)

    def plan_keys(self, num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, k_scale: float,
                  v_scale: float, rails: KVRails, qo_indptr: torch.Tensor, params: AttentionParams,
                  plans) -> FlashInferExtendPlan:
        """``plan`` for keys described by their shape, the ``dtype`` FlashInfer reads them in and their per-tensor
        scales (1.0 where they carry none): ``k_scale`` goes into the softmax scale, ``v_scale`` onto the output."""
        sm_scale = params.softmax_scale * k_scale
        key = ("flashinfer_extend", num_q_heads, num_kv_heads, head_dim, dtype, params.window, params.logit_cap,
               sm_scale)
        wrapper, nnz = plans.get(key, lambda: self._plan(key, qo_indptr, rails.indptr, num_q_heads, num_kv_heads,
                                                         head_dim, dtype, params.window, params.logit_cap,
                                                         sm_scale))
        return FlashInferExtendPlan(wrapper, nnz, dtype, k_scale, v_scale)

    def run(self, plan: FlashInferExtendPlan, q: torch.Tensor, kv: PagedKV, rails: KVRails, *,
            gather_kv: Callable) -> torch.Tensor:
        """``q [rows, Hq, D]`` -> ``[rows, Hq, D]`` in the plan's dtype, over ``rails`` (the plan's key count of
        them). ``gather_kv(kv, slots, validate=False)``: the rail's K/V rows, contiguous, in that dtype."""
        nnz = plan.nnz
        if rails.dense and kv.k_buffer.dtype == plan.dtype:  # already contiguous in order (the forward's rows)
            k, v = kv.k_buffer[:nnz], kv.v_buffer[:nnz]
        else:
            k, v = gather_kv(kv, rails.indices[:nnz], validate=False)
        out = plan.wrapper.run(q.to(plan.dtype), k, v)
        if plan.v_scale != 1.0:
            out.mul_(plan.v_scale)
        self.served = True
        return out

    def extend(self, q: torch.Tensor, kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor,
               params: AttentionParams, plans, *, gather_kv: Callable, gather_dtype: Callable) -> torch.Tensor:
        """``q [rows, Hq, D]`` -> ``[rows, Hq, D]`` in ``gather_dtype(kv)``: ``plan`` then ``run``. The caller has
        checked the inputs (``why_not`` is "", rails and qo_indptr are the host's, validated where it builds
        them)."""
        plan = self.plan(q.shape[1], kv, rails, qo_indptr, params, plans, gather_dtype=gather_dtype)
        return self.run(plan, q, kv, rails, gather_kv=gather_kv)
