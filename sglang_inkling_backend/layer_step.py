"""One layer's attention for one step, shared by every host adapter: prepare the query, choose the keys, split the
batch's decode rows from its extend rows, call the route. Host-free (torch and the core only).

A host adapter translates its batch into ``StepKeys`` once per step (SGLang: its forward metadata,
``hosts/sglang/metadata.InklingForwardMetadata``; vLLM: ``hosts/vllm/batch.VllmBatch``), stores the layer's new K/V
where its pool says (the write slots are the host's: SGLang's pool, vLLM's slot mapping), and calls ``attend`` per
layer::

    q3 = prepare_query(q, spec, route, model_dtype, q_descale)    # [rows, Hq, D]
    out = attend(route, spec, q3, kv, keys, params_of, workspace[, out])  # [rows, Hq, D], the batch's row order

Rows ``[0, keys.num_decode_rows)`` are decodes (one query per request, in request order); the rest are extends
(several query tokens per request: prefill, chunked prefill, a prefix hit). A speculative verify step would be an
extend with a mask; ``params_of`` is where a per-row mask or a second kernel family's arguments would come in.
"""
from __future__ import annotations

from typing import Callable, Optional, Protocol, Union

import torch

from sglang_inkling_backend import kv_views
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV
from sglang_inkling_backend.layer_plan import LayerSpec
from sglang_inkling_backend.rails import KVPages, KVRails


class StepKeys(Protocol):
    """What one step of a host's batch attends over."""

    num_decode_rows: int  # rows [0, n) are decodes; the rest extend
    max_seq_len: Optional[int]  # a host int bounding every request's keys (sizes the decode plans; no device read)
    plans: object  # step_plans.DecodePlanCache: this step's decode plans, shared by its layers

    def decode_keys(self, window: Optional[int], reads_page_tables: bool) -> Union[KVRails, KVPages]:
        """The decode requests' keys for a layer with ``window`` visible keys (None: full attention): a page table
        where the route reads one and the host built it, else per-token rails."""

    def extend_keys(self, window: Optional[int]) -> tuple[KVRails, torch.Tensor]:
        """The extend requests' rails and their query offsets (``qo_indptr`` from 0 over the extend rows)."""


def prepare_query(q: torch.Tensor, spec: LayerSpec, route, model_dtype: torch.dtype,
                  q_descale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[rows, Hq, D]``: the host's query (flat or per head; fp8 with ``q_descale``, dequantized to float32), in
    the model's dtype where the route multiplies in it (``route.query_in_model_dtype``)."""
    q3 = kv_views.dequantize_query(q, spec.num_q_heads, spec.head_dim, q_descale)
    if route.query_in_model_dtype and q3.dtype != model_dtype:
        q3 = q3.to(model_dtype)
    return q3


def attend(route, spec: LayerSpec, q3: torch.Tensor, kv: PagedKV, keys: StepKeys,
           params_of: Callable[[int, int], AttentionParams], workspace,
           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The layer's attention over the step's keys. ``params_of(first, last)`` gives the parameters of rows
    ``[first, last)``. With ``out`` (``[rows, Hq, D]``, any float dtype) the route's results are cast into it and it
    is returned; without, a batch of one kind returns the route's result as it is (float32 or the query's dtype) and
    a mixed batch a new tensor in the query's dtype."""
    rows, nd = q3.shape[0], keys.num_decode_rows
    if not 0 <= nd <= rows:
        raise ValueError(f"num_decode_rows must lie in [0, {rows}] (the query's rows), got {nd}")
    if out is not None and tuple(out.shape) != tuple(q3.shape):
        raise ValueError(f"out must have the query's shape {tuple(q3.shape)}, got {tuple(out.shape)}")
    if out is not None and not out.is_floating_point():
        raise TypeError(f"out must be a floating-point tensor (the attention is cast into it), got {out.dtype}")
    decoded = extended = None
    if nd:
        decoded = route.decode(q3[:nd], kv, keys.decode_keys(spec.window, route.reads_page_tables),
                               params_of(0, nd), max_seq_len=keys.max_seq_len, plans=keys.plans, workspace=workspace)
    if rows > nd:
        rails, qo_indptr = keys.extend_keys(spec.window)
        extended = route.extend(q3[nd:], kv, rails, qo_indptr, params_of(nd, rows), plans=keys.plans)
    if out is None:
        if decoded is None and extended is None:
            return torch.empty_like(q3)  # no rows
        if extended is None:
            return decoded
        if decoded is None:
            return extended
        out = torch.empty_like(q3)
    if decoded is not None:
        out[:nd] = decoded
    if extended is not None:
        out[nd:] = extended
    return out
