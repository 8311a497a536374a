"""The CUDA/ROCm route: ``GpuRoute``, the object a host calls per layer on a CUDA/ROCm GPU, and when it can serve
(``unavailable_because``, ``route_for``). ``routes.choose_route`` asks this module (``routes.ACCELERATED_ROUTES``).

This folder composes two kernel families, neither of which imports it or the other: this package's Triton kernels
(``sglang_inkling_backend.triton``) and FlashInfer's (``sglang_inkling_backend.flashinfer``). ``GpuRoute`` decodes
with the Triton kernels (``plan_decode`` once per step and key, in the step's ``DecodePlanCache``, over views of
the one workspace the host allocated at start-up with ``make_workspace``; ``run_decode`` per layer; page tables or
per-token rails), and a 16-bit pool's decode through FlashInfer's paged decode where it serves the layer (the
decode family; ``INKLING_DECODE_KERNEL``); it extends with FlashInfer's ragged prefill where the layer's semantics
are FlashInfer's (the extend family, which reads the rails through the Triton gather this route hands it;
``INKLING_EXTEND_KERNEL``), else with the Triton extend kernel. The FlashInfer families serve where FlashInfer is
installed; settings auto (default), triton or flashinfer. Its stores, rail gathers and the Inkling decode
prologue are Triton kernels.

Importing this module imports Triton (``sglang_inkling_backend.triton``), not FlashInfer: without Triton the import
fails with an ImportError of ``triton`` and ``choose_route`` takes the torch route.
"""
from __future__ import annotations

import logging
from typing import Optional, Union

import torch

from sglang_inkling_backend import flashinfer as flashinfer_families
from sglang_inkling_backend import kv_formats
from sglang_inkling_backend import triton as triton_kernels
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV
from sglang_inkling_backend.checks import stream_capturing, triton_head_dim_ok
from sglang_inkling_backend.layer_plan import LayerSpec, attention_params
from sglang_inkling_backend.rails import KVPages, KVRails, check_host_lengths
from sglang_inkling_backend.route_protocol import Route
from sglang_inkling_backend.step_plans import (DecodeGroupPlan, DecodePlanCache, ExtendGroupPlan, check_extend_keys,
                                               keys_with_forward_rows)
from sglang_inkling_backend.triton.gather_kv import gather_dtype, gather_kv
from sglang_inkling_backend.triton.plan import route_note

logger = logging.getLogger(__name__)
_QUERY_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MIN_CAPABILITY = (8, 0)  # NVIDIA: the kernels' bf16 dots; 8-bit pools before sm_89 are read as bytes (plan.py)


class GpuRoute(Route):
    """The Triton kernels, with FlashInfer's decode and extend families for the layers they serve (each family None:
    the Triton kernels only). ``kernels``: the Triton kernels' API, ``sglang_inkling_backend.triton`` (a test may
    pass a wrapped copy to count calls)."""

    name = "triton"  # the start-up log line's word for this route
    graph_capturable = True
    reads_page_tables = True
    query_in_model_dtype = True
    runs_triton = True
    serves_verify = True  # the Triton extend kernel takes a verify step's tree mask (FlashInfer's family is skipped)

    def __init__(self, kernels=None, extend_family=None, decode_family=None):
        if kernels is None:
            kernels = triton_kernels
        self.kernels = kernels
        self.fused_store = kernels.store_kv  # MXFP8 and 16-bit pools: one kernel for K and V
        self.gather_rail_slots = kernels.gather_rail_slots  # a graph step's rail slots in one kernel
        self.extend_family = extend_family  # flashinfer.FlashInferExtend, or None: the Triton extend kernel only
        self.decode_family = decode_family  # flashinfer.FlashInferDecode, or None: the Triton decode kernels only
        self._extend_notes: set = set()  # the reasons already logged for running the Triton extend kernel
        self._decode_notes: set = set()  # the same for the Triton decode kernels, where a decode family is present
        # plan_graph_step's keys, worked out once per (family, layers object, (kv_format, max_seq_len)): its
        # [(window, key, max_keys)]. It runs before every replay, where host time delays the graph.
        self._graph_step_keys: Optional[tuple] = None
        self._checked_kv: dict = {}  # id -> PagedKV: the pools run_decode_group has checked in full

    @property
    def decode_prologue(self):
        """The Triton kernel of the Inkling model's fused decode prologue (``triton/prologue.py``, SGLang's
        signature), imported at its first use: only the Inkling model calls it."""
        from sglang_inkling_backend.triton.prologue import inkling_attn_prologue_decode

        return inkling_attn_prologue_decode

    def make_workspace(self, *, max_batch: int, geometries, max_seq_len: int, device,
                       verify_draft_len: Optional[int] = None):
        """One ``DecodeWorkspace`` for every layer shape of the model (``geometries``: ``(Hq, Hkv, D)`` per layer):
        room for the most split rows any of them plans for up to ``max_batch`` requests of ``max_seq_len`` keys,
        and, with ``verify_draft_len`` (a speculative target's drafts per request), for the partials of every split
        verify launch of up to ``max_batch`` requests (``verify_workspace_shape``)."""
        geometries = set(geometries)
        shapes = [self.kernels.decode_workspace_shape(max_batch, hkv, max_seq_len, device) for _, hkv, _ in geometries]
        if verify_draft_len is not None:
            shapes += [self.kernels.verify_workspace_shape(max_batch, verify_draft_len, hq, hkv, device)
                       for hq, hkv, _ in geometries]
        batch, splits = max(shapes, key=lambda shape: shape[0] * shape[1])  # the most split rows
        return self.kernels.DecodeWorkspace(batch, max(g[0] for g in geometries), max(g[2] for g in geometries),
                                            splits, device)

    def decode(self, q: torch.Tensor, kv: PagedKV, keys: Union[KVRails, KVPages], params: AttentionParams, *,
               max_seq_len: int, plans: DecodePlanCache, workspace) -> torch.Tensor:
        """One layer's decode. The plan is made on the first layer of each (window, shape) key of the step and
        reused by the others; ``max_seq_len`` is a host int, so nothing reads the device (CUDA-graph capture).

        ``keys``: a page table (``KVPages``: the paged kernels, windows included, positions absolute) or per-token
        rails (``KVRails``: any slot per token; a hybrid pool's window rails, a pool without whole pages)."""
        if not isinstance(keys, (KVRails, KVPages)):
            raise TypeError(f"keys must be KVPages (a page table) or KVRails (per-token rails), got "
                            f"{type(keys).__name__}")
        page_size = keys.page_size if isinstance(keys, KVPages) else None
        csr, table = _csr(keys), _table(keys)
        # The no-sync shape/dtype/device checks, on every call (not only the layer that plans): q, the pool,
        # rel_bias and sinks are per layer. Then the key holds every input of the plan.
        self.kernels.check_decode_inputs(q, kv, *csr, params, None, page_table=table[0], seq_lens=table[1],
                                         page_size=page_size)
        self._check_decode_keys_once(kv, keys, params.window, page_size, max_seq_len, plans)
        family = self.decode_family
        if family is not None:
            why = family.why_not(q, kv, keys, params, plans)
            if not why:
                try:
                    return family.decode(q, kv, keys, params, plans)
                except Exception as err:
                    if family.served or stream_capturing(q.device):
                        raise  # it has served before: a real failure, not an install that cannot build its kernel
                    self.decode_family = None  # it wrote nothing: this package's kernels serve this call
                    logger.warning("inkling: decode: %s failed on its first call (%s: %s); the Triton decode "
                                   "kernels serve every decode from now on", family.name, type(err).__name__, err)
            elif why not in self._decode_notes:
                self._decode_notes.add(why)
                logger.info("inkling: decode: the Triton kernels for layers with %s", why)
        plan = self._triton_plan(q.shape[0], q.shape[1], kv, params.window, page_size, max_seq_len, plans,
                                 workspace)
        return self.kernels.run_decode(plan, q, kv, *csr, params, check=False, page_table=table[0],
                                       seq_lens=table[1])

    def _check_decode_keys_once(self, kv: PagedKV, keys, window: Optional[int], page_size: Optional[int],
                                max_seq_len: int, plans: DecodePlanCache) -> None:
        """The values the kernels read unchecked (block ids, lengths, max_seq_len), once per step and key, outside
        capture: a page past the pool would be an illegal address (a killed process); a length past max_seq_len,
        lost keys."""
        if not stream_capturing(kv.k_buffer.device):
            plans.once(("decode keys", window, kv.num_slots, page_size),
                       lambda: self._check_decode_keys(kv, keys, window, max_seq_len))

    def _triton_plan(self, batch: int, num_q_heads: int, kv: PagedKV, window: Optional[int],
                     page_size: Optional[int], max_seq_len: int, plans: DecodePlanCache, workspace):
        """The step's Triton decode plan for this shape, made by the first layer (or group) that asks: the key holds
        every input of ``plan_decode``."""
        hkv, d, kv_dtype, kv_format = kv.num_kv_heads, kv.head_dim, kv.k_buffer.dtype, kv.kv_format
        key = (window, num_q_heads, hkv, d, kv_dtype, kv_format, page_size, batch, max_seq_len)
        return plans.get(key, lambda: self.kernels.plan_decode(
            batch, num_q_heads=num_q_heads, num_kv_heads=hkv, head_dim=d, window=window, max_seq_len=max_seq_len,
            page_size=page_size, kv_dtype=kv_dtype, workspace=workspace, kv_format=kv_format))

    def plan_decode_group(self, kv: PagedKV, keys: Union[KVRails, KVPages], params: AttentionParams, *,
                          num_q_heads: int, batch: int, max_seq_len: int, plans: DecodePlanCache,
                          workspace) -> Optional[DecodeGroupPlan]:
        """An eager step's Triton decode for the layers shaped like ``kv`` and ``params``, planned and its keys
        checked once, where the host hands over the batch (``Route.plan_decode_group``). None where FlashInfer's
        decode family may serve these layers: their calls choose (``decode``)."""
        family = self.decode_family
        if family is not None:
            why = family.layer_why_not(kv.kv_format, kv.head_dim, params)
            if not why:
                return None
            if why not in self._decode_notes:
                self._decode_notes.add(why)
                logger.info("inkling: decode: the Triton kernels for layers with %s", why)
        if not isinstance(keys, (KVRails, KVPages)):
            raise TypeError(f"keys must be KVPages (a page table) or KVRails (per-token rails), got "
                            f"{type(keys).__name__}")
        page_size = keys.page_size if isinstance(keys, KVPages) else None
        self.kernels.check_kv_map(batch, kv, kv.k_buffer.device, *_csr(keys), *_table(keys), page_size)
        self._check_decode_keys_once(kv, keys, params.window, page_size, max_seq_len, plans)
        plan = self._triton_plan(batch, num_q_heads, kv, params.window, page_size, max_seq_len, plans, workspace)
        return DecodeGroupPlan(window=params.window, batch=batch, num_q_heads=num_q_heads,
                               num_kv_heads=kv.num_kv_heads, head_dim=kv.head_dim, kv_dtype=kv.k_buffer.dtype,
                               num_slots=kv.num_slots, keys=keys, kernel_plan=plan)

    def run_decode_group(self, group: DecodeGroupPlan, q: torch.Tensor, kv: PagedKV,
                         params: AttentionParams, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One layer's decode with its group's plan. The layer's own inputs are checked: ``q`` against the plan
        (shape, dtype, device), the pool against the group (slots, heads, head_dim, dtype) and, the first time this
        ``PagedKV`` is seen, in full (strides, scale buffers); a call with per-call tensors (``rel_bias``,
        ``sinks``) or anything unlike the plan takes the full checks, which name what is wrong."""
        keys = group.keys
        csr, table = _csr(keys), _table(keys)
        k_buffer = kv.k_buffer
        if (type(q) is not torch.Tensor or q.shape != (group.batch, group.num_q_heads, group.head_dim)
                or q.dtype not in _QUERY_DTYPES or q.stride(-1) != 1 or q.device != k_buffer.device
                or k_buffer.shape != (group.num_slots, group.num_kv_heads, group.head_dim)
                or k_buffer.dtype != group.kv_dtype or params.window != group.window
                or params.rel_bias is not None or params.sinks is not None or id(kv) not in self._checked_kv):
            self.kernels.check_decode_inputs(q, kv, *csr, params, None, page_table=table[0], seq_lens=table[1],
                                             page_size=keys.page_size if isinstance(keys, KVPages) else None)
            got = (tuple(q.shape), kv.num_slots, kv.num_kv_heads, k_buffer.dtype, params.window)
            want = ((group.batch, group.num_q_heads, group.head_dim), group.num_slots, group.num_kv_heads,
                    group.kv_dtype, group.window)
            if got != want:
                raise ValueError(f"this step's decode plan for the layer's group was made for q {want[0]}, a pool of "
                                 f"{want[1]} slots x {want[2]} KV heads of {want[3]}, window {want[4]}; got q "
                                 f"{got[0]}, {got[1]} slots x {got[2]} KV heads of {got[3]}, window {got[4]}")
            if len(self._checked_kv) > 4096:  # pools rebuilt many times: keep the newest only
                self._checked_kv.clear()
            self._checked_kv[id(kv)] = kv  # kept alive: its id is not reused while it is here
        if out is not None and (type(out) is not torch.Tensor or out.shape != q.shape or out.stride(-1) != 1
                                or out.dtype not in _QUERY_DTYPES or out.device != q.device):
            raise ValueError(f"out must be a bf16/fp16/fp32 tensor of q's shape {tuple(q.shape)} on {q.device}, "
                             f"contiguous in its last dim")
        # the kernel writes the caller's rows directly (no result buffer, no copy kernel per layer)
        return self.kernels.run_decode(group.kernel_plan, q, kv, *csr, params, out=out, check=False,
                                       page_table=table[0], seq_lens=table[1])

    def plan_graph_step(self, keys, layers, seq_lens_host: torch.Tensor, *, kv_format: str, max_bs: int,
                        max_seq_len: int) -> None:
        """Before a decode CUDA graph is captured or replayed, outside the capture: plan what a layer cannot plan
        inside one. This package's kernels plan from host ints inside the capture; FlashInfer's decode (the decode
        family) plans here, for every distinct key among ``layers`` (``LayerSpec``) it serves, on the step's
        ``keys`` (``layer_step.StepKeys``) and ``seq_lens_host`` (each request's keys, the new one included, on the
        host: padding rows included, as the graph's batch has them). ``max_bs`` and ``max_seq_len`` bound every
        batch the graphs serve (its buffers are sized by them at the first call). A FlashInfer that fails to plan
        the first time (a JIT build) leaves every decode to this package's kernels, with a log line."""
        family = self.decode_family
        if family is None:
            return
        bs = seq_lens_host.numel() if isinstance(seq_lens_host, torch.Tensor) else 0
        check_host_lengths(seq_lens_host, bs, max_seq_len)
        if not 1 <= bs <= max_bs:
            raise ValueError(f"seq_lens_host must hold 1 to {max_bs} requests (max_bs), got {bs}")
        cached = self._graph_step_keys
        if cached is None or cached[0] is not family or cached[1] is not layers or cached[2] != (kv_format,
                                                                                                max_seq_len):
            entries = self._graph_plan_keys(family, layers, kv_format, max_seq_len)
            cached = self._graph_step_keys = (family, layers, (kv_format, max_seq_len), entries)
        for window, key, max_keys in cached[3]:
            rails = keys.decode_keys(window, self.reads_page_tables)
            if not isinstance(rails, KVRails) or keys.plans.has(key):
                continue
            try:
                family.plan_graph(keys.plans, key, rails, seq_lens_host, max_bs, max_keys)
            except Exception as err:
                if family.served:
                    raise
                self.decode_family = None
                logger.warning("inkling: decode: %s failed to plan on its first step (%s: %s); the Triton decode "
                               "kernels serve every decode from now on", family.name, type(err).__name__, err)
                return

    @staticmethod
    def _graph_plan_keys(family, layers, kv_format: str, max_seq_len: int) -> list:
        """The distinct ``(window, plan key, max keys)`` the decode family plans for ``layers`` on a ``kv_format``
        pool: the layers it serves, in order (a relative bias comes with every call: this package's kernels)."""
        out, seen = [], set()
        for spec in layers:
            if not isinstance(spec, LayerSpec) or not spec.has_attention or spec.rel_extent is not None:
                continue
            params = attention_params(spec, rows=1)
            if family.layer_why_not(kv_format, spec.head_dim, params):
                continue
            key = family.plan_key(spec.window, spec.num_q_heads, spec.num_kv_heads, spec.head_dim,
                                  kv_formats.STORAGE_DTYPE[kv_format], params)
            if key not in seen:
                seen.add(key)
                out.append((spec.window, key, max_seq_len if spec.window is None else min(spec.window, max_seq_len)))
        return out

    def _check_decode_keys(self, kv: PagedKV, keys: Union[KVRails, KVPages], window: Optional[int],
                           max_seq_len: int) -> None:
        if isinstance(keys, KVPages):
            self.kernels.validate_page_table(kv, keys.page_table, keys.seq_lens, keys.page_size, window=window,
                                             max_seq_len=max_seq_len)
        else:
            self.kernels.validate_slots(kv, keys.indptr, keys.indices, max_seq_len=max_seq_len)

    def gather_keys(self, kv: PagedKV, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V rows at ``slots`` (checked by the caller), dequantized (MXFP8: exact in bf16) and, for a per-tensor
        fp8 pool, times its scales, in ``gather_dtype(kv)``."""
        k, v = gather_kv(kv, slots, validate=False)
        if kv.kv_format.tensor_scaled:  # gather_kv returns the raw e4m3 values
            k, v = (k.float() * kv.k_scale).to(k.dtype), (v.float() * kv.v_scale).to(v.dtype)
        return k, v

    def extend(self, q: torch.Tensor, kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor,
               params: AttentionParams, *, plans: Optional[DecodePlanCache] = None, verify=None,
               workspace=None) -> torch.Tensor:
        """One layer's extend: the extend family (FlashInfer) where it serves the layer and the step gives
        ``plans``, else the Triton kernel, with one log line per reason. The keys are checked once per step and
        window (``check_extend_keys``), before any kernel reads them. A speculative verify step (``verify``, its
        tree mask and depths) runs the Triton kernel: the family's ragged prefill takes no tree here. A ``uniform``
        one (a CUDA graph's verify step, ``D`` drafts per request) runs the launch laid out from its shapes
        (``uniform_verify_attention``: nothing read back, so it can be captured); the keys are then checked on the
        graph's warm-up runs, as decode's are, not while it is captured. Its key splits keep their partials in
        ``workspace`` (the step's ``DecodeWorkspace``) where it holds them; else (a workspace sized for other
        drafts, or none) they are allocated per launch, with one log line per shape."""
        if plans is None:
            check_extend_keys(kv, rails, qo_indptr, q.shape[0])
        elif not stream_capturing(q.device):
            plans.check_extend_keys_once(kv, rails, qo_indptr, q.shape[0], params.window)
        family = self.extend_family
        if verify is not None:
            draft_len = self._uniform_draft_len(q, qo_indptr, params, plans, verify)
            if draft_len:
                splits, workspace = self._verify_partials(q, kv, draft_len, workspace)
                return self.kernels.uniform_verify_attention(q, kv, rails.indptr, rails.indices, qo_indptr, params,
                                                             verify, draft_len, num_splits=splits,
                                                             workspace=workspace)
            return self.kernels.paged_extend_attention(q, kv, rails.indptr, rails.indices, qo_indptr, params,
                                                       validate=False, verify=verify)
        if family is not None:
            why = family.why_not(q, kv, params) or ("" if plans is not None else "no step plan cache")
            if not why:
                try:
                    return family.extend(q, kv, rails, qo_indptr, params, plans, gather_kv=gather_kv,
                                         gather_dtype=gather_dtype)
                except Exception as err:
                    if family.served:
                        raise  # it has served before: a real failure, not an install that cannot build its kernel
                    # It writes none of our buffers, so the Triton kernel can still serve this call.
                    self._drop_extend_family(family, err, "failed on its first call")
            else:
                self._note_triton_extend(why)
        blocks = None if plans is None else self._extend_blocks(qo_indptr, q.shape[1], kv.num_kv_heads, plans)
        return self.kernels.paged_extend_attention(q, kv, rails.indptr, rails.indices, qo_indptr, params,
                                                   validate=False, blocks=blocks)

    def _drop_extend_family(self, family, err: Exception, what: str) -> None:
        """The extend family raised before it ever served (an install that cannot build its kernel): dropped for
        good, with one warning; the Triton kernel serves every extend."""
        self.extend_family = None
        logger.warning("inkling: extend: %s %s (%s: %s); the Triton extend kernel serves every extend from now on",
                       family.name, what, type(err).__name__, err)

    def _note_triton_extend(self, why: str) -> None:
        """Say once per reason why layers run the Triton extend kernel where the family is installed."""
        if why not in self._extend_notes:
            self._extend_notes.add(why)
            logger.info("inkling: extend: the Triton kernel for layers with %s", why)

    def _extend_blocks(self, qo_indptr: torch.Tensor, num_q_heads: int, num_kv_heads: int, plans: DecodePlanCache):
        """The step's Triton extend grid, laid out once for its layers of this head grouping (one sync)."""
        return plans.value(("extend blocks", qo_indptr.data_ptr(), qo_indptr.numel(), num_q_heads, num_kv_heads),
                           lambda: self.kernels.extend_blocks(qo_indptr, num_q_heads, num_kv_heads))

    def plan_extend_group(self, kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor, params: AttentionParams, *,
                          num_q_heads: int, rows: int, q_dtype: torch.dtype, forward_rows: bool,
                          plans: DecodePlanCache) -> Optional[ExtendGroupPlan]:
        """An eager step's extend for the layers shaped like ``kv`` and ``params`` (``Route.plan_extend_group``):
        the keys checked once (``check_extend_keys``), where the forward's rows go, and FlashInfer's ragged prefill
        planned where the family serves these layers, else the Triton kernel's grid. A FlashInfer plan that fails
        before the family ever served leaves the Triton kernel to serve every extend, as ``extend`` does."""
        plans.check_extend_keys_once(kv, rails, qo_indptr, rows, params.window)
        layout = plans.forward_rows(rails, qo_indptr, rows, params.window) if forward_rows else None
        kernel_plan = None
        family = self.extend_family
        if family is not None:
            why = family.layer_why_not(q_dtype, kv, params)
            if not why:
                try:
                    if layout is None:
                        kernel_plan = family.plan(num_q_heads, kv, rails, qo_indptr, params, plans,
                                                  gather_dtype=gather_dtype)
                    else:  # the keys the layers build (keys_with_forward_rows): the forward's, or gathered ones
                        dtype = q_dtype if layout.positions is None else gather_dtype(kv)
                        kernel_plan = family.plan_keys(num_q_heads, kv.num_kv_heads, kv.head_dim, dtype, 1.0, 1.0,
                                                       rails, qo_indptr, params, plans)
                except Exception as err:
                    if family.served:
                        raise
                    self._drop_extend_family(family, err, "failed to plan on its first step")
            else:
                self._note_triton_extend(why)
        if kernel_plan is None:
            kernel_plan = self._extend_blocks(qo_indptr, num_q_heads, kv.num_kv_heads, plans)
        return ExtendGroupPlan(window=params.window, rows=rows, num_q_heads=num_q_heads, num_kv_heads=kv.num_kv_heads,
                               head_dim=kv.head_dim, kv_dtype=kv.k_buffer.dtype, num_slots=kv.num_slots,
                               rails=rails, qo_indptr=qo_indptr, forward_rows=layout, kernel_plan=kernel_plan,
                               params=params)

    def run_extend_group(self, group: ExtendGroupPlan, q: torch.Tensor, kv: PagedKV, params: AttentionParams, *,
                         forward_kv: Optional[tuple[torch.Tensor, torch.Tensor]],
                         plans: DecodePlanCache, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One layer's extend with its group's plan. ``q`` and the pool are checked against the plan (shape, dtype,
        device, window); a call whose parameters are not the plan's (a relative bias, sinks, another scale or cap:
        what FlashInfer's plan holds) runs ``extend``, which plans for it."""
        k_buffer = kv.k_buffer
        if (type(q) is not torch.Tensor or q.shape != (group.rows, group.num_q_heads, group.head_dim)
                or q.dtype not in _QUERY_DTYPES or q.device != k_buffer.device
                or k_buffer.shape != (group.num_slots, group.num_kv_heads, group.head_dim)
                or k_buffer.dtype != group.kv_dtype or params.window != group.window):
            got = (tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__, tuple(k_buffer.shape),
                   k_buffer.dtype, params.window)
            want = ((group.rows, group.num_q_heads, group.head_dim), (group.num_slots, group.num_kv_heads,
                                                                      group.head_dim), group.kv_dtype, group.window)
            raise ValueError(f"this step's extend plan for the layer's group was made for q {want[0]}, a pool of "
                             f"{want[1]} of {want[2]}, window {want[3]}; got q {got[0]} "
                             f"({q.dtype if isinstance(q, torch.Tensor) else ''} on "
                             f"{q.device if isinstance(q, torch.Tensor) else '?'}), a pool of {got[1]} of {got[2]}, "
                             f"window {got[3]}")
        rails = group.rails
        if forward_kv is not None and group.forward_rows is not None:
            kv, rails = keys_with_forward_rows(self.gather_keys, kv, rails, group.qo_indptr, group.forward_rows,
                                               *forward_kv)
        elif forward_kv is not None:
            raise ValueError("forward_kv is given but the step's extend plan reads every key from the pool")
        plan = group.kernel_plan
        if isinstance(plan, flashinfer_families.FlashInferExtendPlan):
            leader = group.params
            # FlashInfer's plan holds the scale, the cap and the keys' dtype: the keys read here (the pool, or the
            # forward's rows over it) must be those it was planned for
            if (params.rel_bias is not None or params.sinks is not None or params.softmax_scale
                    != leader.softmax_scale or params.logit_cap != leader.logit_cap
                    or flashinfer_families.effective_scales(kv) != (plan.k_scale, plan.v_scale)
                    or gather_dtype(kv) != plan.dtype or self.extend_family is None):
                return self.extend(q, kv, rails, group.qo_indptr, params, plans=plans)
            return self.extend_family.run(plan, q, kv, rails, gather_kv=gather_kv)
        # the Triton kernel writes the caller's rows directly (checked there: shape, dtype, device); FlashInfer's
        # result above is its own buffer, which the caller copies
        return self.kernels.paged_extend_attention(q, kv, rails.indptr, rails.indices, group.qo_indptr, params,
                                                   out=out, validate=False, blocks=plan)


    def _verify_partials(self, q: torch.Tensor, kv: PagedKV, draft_len: int, workspace):
        """A uniform verify launch's key splits, and the workspace its partials go to: ``workspace`` where it holds
        them, else None (allocated per launch; said once per shape at INFO)."""
        rows, hq, d = q.shape
        splits = self.kernels.verify_splits(rows // draft_len, draft_len, hq, kv.num_kv_heads, q.device)
        if splits == 1:
            return 1, None
        if workspace is not None and workspace.holds(rows, hq, splits, d):
            return splits, workspace
        note = ("verify partials", rows, hq, splits, d)
        if note not in self._extend_notes:
            self._extend_notes.add(note)
            room = ("no workspace was given" if workspace is None else
                    f"the workspace holds {workspace.part_o.numel()} values (sized for other drafts per request)")
            logger.info("inkling: verify: %d rows x %d heads x %d splits x head_dim %d of partials: %s; allocated "
                        "per launch", rows, hq, splits, d, room)
        return splits, None

    @staticmethod
    def _uniform_draft_len(q, qo_indptr, params, plans, verify) -> int:
        """``D`` where the verify step can run the launch laid out from its shapes (no device read per layer):
        a ``SpecVerify.uniform`` (a CUDA graph's), or, with the step's ``plans``, a checked one whose requests all
        have ``D`` drafts, on ``q``'s device with int64 offsets and depths, once its query offsets were checked
        against them (``check_queries``, once per step and window; ``check_extend_keys`` checked they start at 0).
        0 otherwise: the eager launch, which checks and lays out everything itself."""
        if verify.uniform_len:
            return verify.uniform_len
        lens = set(verify.draft_lens)
        if plans is None or len(lens) != 1 or verify.mask_indptr.dtype != torch.int64 \
                or verify.depths.dtype != torch.int64 \
                or any(t.device != q.device for t in (verify.tree_mask, verify.mask_indptr, verify.depths)):
            return 0
        plans.check_verify_queries_once(verify, qo_indptr, params.window)
        return lens.pop()


def unavailable_because(device: Optional[torch.device], head_dims=()) -> str:
    """Why this route cannot serve ``device`` (None: any CUDA/ROCm device, asked without touching one) and these
    head sizes, or "" when it can."""
    unsupported = sorted(d for d in set(head_dims) if not triton_head_dim_ok(d))
    if unsupported:
        return f"the Triton kernels need a power-of-two head_dim >= 32, the model has {unsupported}"
    if device is not None and device.type == "cuda" and torch.version.hip is None and torch.cuda.is_available():
        capability = torch.cuda.get_device_capability(device)
        if capability < MIN_CAPABILITY:
            return (f"{torch.cuda.get_device_name(device)} is sm_{capability[0]}{capability[1]}; the Triton kernels "
                    f"need sm_{MIN_CAPABILITY[0]}{MIN_CAPABILITY[1]} or newer for their bf16 dots")
    return ""


def route_for(device: torch.device) -> tuple[GpuRoute, str]:
    """The route for ``device`` with the FlashInfer families it found (``flashinfer.extend_family``,
    ``flashinfer.decode_family``; one float workspace between them), and a note for the start-up log line."""
    # the extend family allocates the route's float workspace; the decode family shares it
    family, note = flashinfer_families.extend_family(device)
    decoder, decode_note = flashinfer_families.decode_family(device, family.workspace if family is not None else None)
    extend = (f"{note} where a layer's semantics are FlashInfer's, else the Triton kernel" if family is not None
              else f"the Triton kernel ({note})")
    decode = (f"{decode_note} for 16-bit pools where it serves the layer" if decoder is not None
              else f"the Triton kernels ({decode_note})")
    return (GpuRoute(extend_family=family, decode_family=decoder),
            f"Triton kernels on {device}; {route_note(device)}; 16-bit decode: {decode}; extend: {extend}")


def _csr(keys) -> tuple:
    """``(kv_indptr, kv_indices)`` of per-token rails, ``(None, None)`` for a page table."""
    return (None, None) if isinstance(keys, KVPages) else (keys.indptr, keys.indices)


def _table(keys) -> tuple:
    """``(page_table, seq_lens)`` of a page table, ``(None, None)`` for rails."""
    return (keys.page_table, keys.seq_lens) if isinstance(keys, KVPages) else (None, None)
