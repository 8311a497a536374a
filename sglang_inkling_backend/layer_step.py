"""One layer's attention for one step, shared by every host adapter: prepare the query, choose the keys, split the
batch's decode rows from its extend rows, call the route. Host-free (torch and the core only).

A host adapter translates its batch into ``StepKeys`` once per step (SGLang: its forward metadata,
``hosts/sglang/metadata.InklingForwardMetadata``; vLLM: ``hosts/vllm/batch.VllmBatch``), stores the layer's new K/V
where its pool says (the write slots are the host's: SGLang's pool, vLLM's slot mapping), and calls ``attend`` per
layer::

    q3 = prepare_query(q, spec, route, model_dtype, q_descale)    # [rows, Hq, D]
    out = attend(route, spec, q3, kv, keys, params_of, workspace[, out])  # [rows, Hq, D], the batch's row order

Rows ``[0, keys.num_decode_rows)`` are decodes (one query per request, in request order); the rest are extends
(several query tokens per request: prefill, chunked prefill, a prefix hit). A speculative verify step is an extend
whose rows are draft tokens, with ``verify`` (``attention_inputs.SpecVerify``: each request's tree mask and
depths) for a route that serves one (``route.serves_verify``); ``params_of`` is where a second kernel family's
arguments would come in.
"""
from __future__ import annotations

from typing import Callable, Optional, Protocol, Union

import torch

from sglang_inkling_backend import kv_views, settings
from sglang_inkling_backend.attention_inputs import FLOAT_KV_DTYPES, AttentionParams, PagedKV, SpecVerify
from sglang_inkling_backend.checks import require_tensor, UnsupportedFeature
from sglang_inkling_backend.layer_plan import LayerSpec
from sglang_inkling_backend.rails import KVPages, KVRails
from sglang_inkling_backend.route_protocol import Route
from sglang_inkling_backend.step_plans import DecodeGroupPlan, ExtendGroupPlan, keys_with_forward_rows


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


EXTEND_NEW_KEYS_ENV = settings.EXTEND_NEW_KEYS.name
EXTEND_NEW_KEYS_CHOICES = settings.EXTEND_NEW_KEYS_CHOICES


def extend_new_keys_setting() -> str:
    """Where an extend reads its own new tokens' keys: ``forward`` (default; the forward's K/V, as SGLang's triton
    and flashinfer backends do, the prefix from the cache: over a quantized cache they are unrounded, over a float
    one the same values, not gathered back) or ``cache`` (every key as stored, as SGLang's FA4 MXFP8 path does).
    ``INKLING_EXTEND_NEW_KEYS`` overrides."""
    return settings.extend_new_keys()


KERNEL_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # what a route's kernels write into


def prepare_query(q: torch.Tensor, spec: LayerSpec, route: Route, model_dtype: torch.dtype,
                  q_descale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[rows, Hq, D]``: the host's query (flat or per head; fp8 with ``q_descale``, dequantized to float32), in
    the model's dtype where the route multiplies in it (``route.query_in_model_dtype``)."""
    q3 = kv_views.dequantize_query(q, spec.num_q_heads, spec.head_dim, q_descale)
    if route.query_in_model_dtype and q3.dtype != model_dtype:
        q3 = q3.to(model_dtype)
    return q3


def forward_rows_keys(route: Route, kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor, new_k: torch.Tensor,
                      new_v: torch.Tensor, plans, window: Optional[int]) -> tuple[PagedKV, KVRails]:
    """An extend's keys with its own new rows (the last ``qlen`` keys of each request) taken from the forward's
    K/V ``new_k``/``new_v [rows, Hkv, D]`` (float), the cached prefix from the pool: SGLang's triton and flashinfer
    backends attend a quantized cache so (the chunk's keys in the forward's precision, only older keys rounded).
    Without a prefix the forward's K/V are the keys, nothing is gathered; else the rails' rows are gathered
    (``route.gather_keys``) and the new rows written over theirs. Where the rows go is worked out once per step and
    window (one sync) and shared by the layers."""
    layout = plans.forward_rows(rails, qo_indptr, new_k.shape[0], window)
    return keys_with_forward_rows(route.gather_keys, kv, rails, qo_indptr, layout, new_k, new_v)


def attend(route: Route, spec: LayerSpec, q3: torch.Tensor, kv: PagedKV, keys: StepKeys,
           params_of: Callable[[int, int], AttentionParams], workspace,
           out: Optional[torch.Tensor] = None, forward_kv: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
           verify: Optional[SpecVerify] = None, decode_group: Optional[DecodeGroupPlan] = None,
           extend_group: Optional[ExtendGroupPlan] = None) -> torch.Tensor:
    """The layer's attention over the step's keys. ``params_of(first, last)`` gives the parameters of rows
    ``[first, last)``. With ``out`` (``[rows, Hq, D]``, any float dtype) the route's results are cast into it and it
    is returned; without, a batch of one kind returns the route's result as it is (float32 or the query's dtype) and
    a mixed batch a new tensor in the query's dtype. ``forward_kv``: the step's K/V rows ``[rows, Hkv, D]`` (float,
    one per query row) for the extend rows to read their own keys from, not from the pool (``forward_rows_keys``);
    decode rows always read the pool. ``verify``: the extend rows are a speculative verify step's draft tokens
    (one tree per extend request); refused, before any route is called, by a route without ``serves_verify``.
    ``decode_group``: the step's decode plan for this layer's group (``Route.plan_decode_group``, made where the
    host handed over the batch): the decode rows run it (``Route.run_decode_group``) instead of planning here;
    ``extend_group`` the same for the extend rows (``Route.plan_extend_group``, made with ``forward_rows`` where
    ``forward_kv`` is given; ``Route.run_extend_group``)."""
    require_tensor(q3, "q", "a [rows, Hq, D] tensor")
    rows, nd = q3.shape[0], keys.num_decode_rows
    if forward_kv is not None:
        want = (rows, spec.num_kv_heads, spec.head_dim)
        for name, t in zip(("forward_kv[0] (k)", "forward_kv[1] (v)"), forward_kv):
            if isinstance(t, torch.Tensor):
                require_tensor(t, name, f"a bf16/fp16/fp32 tensor of shape {want}")
            if not isinstance(t, torch.Tensor) or t.dtype not in FLOAT_KV_DTYPES or tuple(t.shape) != want:
                desc = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must be a bf16/fp16/fp32 tensor of shape {want} (one row per query row), "
                                 f"got {desc}")
    if not 0 <= nd <= rows:
        raise ValueError(f"num_decode_rows must lie in [0, {rows}] (the query's rows), got {nd}")
    if out is not None:
        require_tensor(out, "out", f"a floating-point tensor of the query's shape {tuple(q3.shape)}")
    if out is not None and tuple(out.shape) != tuple(q3.shape):
        raise ValueError(f"out must have the query's shape {tuple(q3.shape)}, got {tuple(out.shape)}")
    if out is not None and not out.is_floating_point():
        raise TypeError(f"out must be a floating-point tensor (the attention is cast into it), got {out.dtype}")
    if verify is not None:
        if not route.serves_verify:
            raise UnsupportedFeature(f"the {route.name or type(route).__name__} route cannot serve a "
                                     "speculative verify step (a tree mask); the torch route can")
        if not isinstance(verify, SpecVerify):
            raise TypeError(f"verify must be None or a SpecVerify, got {type(verify).__name__}")
        if rows == nd:
            raise ValueError("verify is given but the step has no extend rows (its draft tokens)")
    if extend_group is not None and verify is not None:
        raise ValueError("extend_group and verify cannot both be given: a verify step's extend plans per layer")
    if rows > nd and extend_group is None:
        rails, qo_indptr = keys.extend_keys(spec.window)
        if verify is not None:  # the step's query offsets are every layer's: checked once per step and window
            keys.plans.check_verify_queries_once(verify, qo_indptr, spec.window)
    decoded = extended = None
    if out is None and 0 < nd < rows and decode_group is not None and extend_group is not None:
        out = torch.empty_like(q3)  # a mixed step's one result, which both groups' kernels write into
    # the kernels write bf16/fp16/fp32 rows contiguous in head_dim; any other out takes a copy of their result
    direct = out if out is not None and out.stride(-1) == 1 and out.dtype in KERNEL_OUT_DTYPES else None
    if nd and decode_group is not None:
        decoded = route.run_decode_group(decode_group, q3[:nd], kv, params_of(0, nd),
                                         out=None if direct is None else direct[:nd])
    elif nd:
        decoded = route.decode(q3[:nd], kv, keys.decode_keys(spec.window, route.reads_page_tables),
                               params_of(0, nd), max_seq_len=keys.max_seq_len, plans=keys.plans, workspace=workspace)
    if rows > nd and extend_group is not None:
        new_kv = None if forward_kv is None else (forward_kv[0][nd:], forward_kv[1][nd:])
        extended = route.run_extend_group(extend_group, q3[nd:], kv, params_of(nd, rows), forward_kv=new_kv,
                                          plans=keys.plans, out=None if direct is None else direct[nd:])
    elif rows > nd:
        extend_kv = kv
        if forward_kv is not None:
            # the pool's rails are read here, before the route sees them: checked as the route would (same key)
            keys.plans.check_extend_keys_once(kv, rails, qo_indptr, rows - nd, spec.window)
            extend_kv, rails = forward_rows_keys(route, kv, rails, qo_indptr, forward_kv[0][nd:], forward_kv[1][nd:],
                                                 keys.plans, spec.window)
        # a route without verify takes neither argument; a split verify launch keeps its partials in the workspace
        more = {} if verify is None else {"verify": verify, "workspace": workspace}
        extended = route.extend(q3[nd:], extend_kv, rails, qo_indptr, params_of(nd, rows), plans=keys.plans, **more)
    if out is None:
        if decoded is None and extended is None:
            return torch.empty_like(q3)  # no rows
        if extended is None:
            return decoded
        if decoded is None:
            return extended
        out = torch.empty_like(q3)
    # a route that wrote into out's rows returned them (same first element): nothing to copy
    if decoded is not None and decoded.data_ptr() != out.data_ptr():
        out[:nd] = decoded
    if extended is not None and extended.data_ptr() != out[nd:].data_ptr():
        out[nd:] = extended
    return out
