"""``Route``: everything a host may call or read on an attention route, with the defaults a route that lacks a
capability inherits, so a host calls every member without probing for it.

A route is the object a host calls per layer (through ``layer_step``); ``routes.choose_route`` picks one per device.
The routes: ``routes.TorchRoute`` (the torch reference, on any device) and each accelerated route module named in
``routes.ACCELERATED_ROUTES`` (``gpu/route.py``: ``GpuRoute``, this package's Triton kernels with FlashInfer's
decode and extend families on CUDA/ROCm).

Hosts read a route's capabilities, never its name (``name`` is for log lines):
- ``graph_capturable``: decode can be captured in a CUDA graph (plans are views of one workspace);
- ``reads_page_tables``: decode takes a page table (``KVPages``) as well as per-token rails;
- ``query_in_model_dtype``: the kernels multiply the query in the model's dtype, so a float32 query (one dequantized
  from fp8) is cast to it first; a route without it computes in float32 and takes any float query;
- ``runs_triton``: the route's device runs Triton, so the host's own helpers may use Triton there too;
- ``fused_store``: one kernel storing K and V into an MXFP8 or unquantized pool (``fused_store(kv, loc, k, v,
  validate=False)``), or None (``kv_views`` stores with torch: indexed writes, the torch quantizer);
- ``gather_rail_slots``: the slot gather of ``rails.gather_rails_host_lengths`` as one kernel (its ``gather_slots``),
  or None;
- ``serves_verify``: ``extend`` takes a speculative verify step (``verify``, an ``attention_inputs.SpecVerify``:
  draft trees, and the step's ``workspace``, where a split verify launch keeps its partials); ``layer_step.attend``
  refuses one for a route without it;
- ``decode_prologue``: the Inkling model's fused decode prologue with SGLang's ``inkling_attn_prologue_decode``
  signature (default: the torch reference, ``reference.prologue``).

And it answers ``make_workspace(**limits)`` (default: None, nothing kept between calls), ``decode`` and ``extend``
(every route), ``gather_keys`` (default: ``PagedKV.read``), ``plan_graph_step`` (default: nothing to plan) and
the group plans of an eager step, ``plan_decode_group``/``run_decode_group`` and
``plan_extend_group``/``run_extend_group`` (default: no plan, the layers call ``decode``/``extend``).

Apple silicon has no route: SGLang's MLX runner never builds a torch attention backend, so no host calls a route
there. The MLX family (``mlx/``: mx.array pools, Metal kernels) is wired by ``hosts/sglang/mlx_runner.py`` into
SGLang's own MLX attention wrappers, which call it per layer with SGLang's MLX context; a route over torch tensors
and ``layer_step.StepKeys`` would have no caller.
"""
from __future__ import annotations

import abc
from typing import Optional, Union

import torch

from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV, SpecVerify
from sglang_inkling_backend.rails import KVPages, KVRails
from sglang_inkling_backend.step_plans import DecodeGroupPlan, DecodePlanCache, ExtendGroupPlan


class Route(abc.ABC):
    """The contract. A concrete route sets ``name`` and implements ``decode`` and ``extend``; every other member has
    the default below (the capability absent)."""

    name: str = ""  # for log lines only
    graph_capturable = False
    reads_page_tables = False
    query_in_model_dtype = False
    runs_triton = False
    fused_store = None  # kv_views.store_kv_unchecked stores with torch
    gather_rail_slots = None  # rails.gather_rails_host_lengths gathers with torch
    serves_verify = False

    def make_workspace(self, *, max_batch: int, geometries, max_seq_len: int, device,
                       verify_draft_len: Optional[int] = None):
        """What ``decode`` and ``extend`` take as ``workspace``, allocated once by the host at start-up for up to
        ``max_batch`` requests of ``max_seq_len`` keys over every layer shape in ``geometries`` (``(Hq, Hkv, D)``),
        and for verify steps of ``verify_draft_len`` drafts per request where given. None: the route keeps nothing
        between calls."""
        return None

    @abc.abstractmethod
    def decode(self, q: torch.Tensor, kv: PagedKV, keys: Union[KVRails, KVPages], params: AttentionParams, *,
               max_seq_len: Optional[int], plans: Optional[DecodePlanCache], workspace) -> torch.Tensor:
        """One layer's decode: ``q [B, Hq, D]`` over ``keys`` (``KVRails``, or ``KVPages`` where
        ``reads_page_tables``) -> ``[B, Hq, D]`` (float32 or q's dtype). ``plans``: the step's
        ``step_plans.DecodePlanCache``."""

    @abc.abstractmethod
    def extend(self, q: torch.Tensor, kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor,
               params: AttentionParams, *, plans: Optional[DecodePlanCache] = None,
               verify: Optional[SpecVerify] = None, workspace=None) -> torch.Tensor:
        """One layer's extend: ``q [rows, Hq, D]`` (request b's rows ``qo_indptr[b]:qo_indptr[b + 1]``) over
        ``rails`` -> ``[rows, Hq, D]`` (float32 or q's dtype). ``verify`` only where ``serves_verify``."""

    def plan_decode_group(self, kv: PagedKV, keys: Union[KVRails, KVPages], params: AttentionParams, *,
                          num_q_heads: int, batch: int, max_seq_len: int, plans: DecodePlanCache,
                          workspace) -> Optional[DecodeGroupPlan]:
        """Once per eager decode step, where the host hands over the batch: the decode of every layer shaped like
        ``kv`` and ``params`` (a layer of the group: its pool buffers and parameters), with its keys checked; a
        layer's call then runs it (``run_decode_group``). None (here, and where the route plans per layer): the
        layers call ``decode``."""
        return None

    def run_decode_group(self, group: DecodeGroupPlan, q: torch.Tensor, kv: PagedKV,
                         params: AttentionParams, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One layer's decode with its group's plan (``plan_decode_group``): ``q [B, Hq, D]`` -> ``[B, Hq, D]``.
        ``out`` (q's shape, a float dtype, contiguous in D): where the result may be written; the caller copies a
        result returned elsewhere (a kernel that cannot write there)."""
        raise NotImplementedError(f"the {self.name} route makes no decode group plans")

    def plan_extend_group(self, kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor, params: AttentionParams, *,
                          num_q_heads: int, rows: int, q_dtype: torch.dtype, forward_rows: bool,
                          plans: DecodePlanCache) -> Optional[ExtendGroupPlan]:
        """Once per eager extend step, where the host hands over the batch: the extend of every layer shaped like
        ``kv`` and ``params`` over ``rows`` query rows of ``q_dtype``, with its keys checked; ``forward_rows``:
        the layers read their new rows' keys from the forward's K/V (``layer_step.forward_rows_keys``). A layer's
        call then runs it (``run_extend_group``). None (here, and where the route plans per layer): the layers
        call ``extend``."""
        return None

    def run_extend_group(self, group: ExtendGroupPlan, q: torch.Tensor, kv: PagedKV, params: AttentionParams, *,
                         forward_kv: Optional[tuple[torch.Tensor, torch.Tensor]],
                         plans: DecodePlanCache, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One layer's extend with its group's plan (``plan_extend_group``): ``q [rows, Hq, D]`` -> ``[rows, Hq,
        D]``; ``forward_kv``: the layer's new K/V rows ``[rows, Hkv, D]`` where the plan reads them from the
        forward; ``out``: as ``run_decode_group``'s."""
        raise NotImplementedError(f"the {self.name} route makes no extend group plans")

    def gather_keys(self, kv: PagedKV, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V rows at ``slots`` (checked by the caller), dequantized and scaled: here float32 through
        ``PagedKV.read``."""
        return kv.read(slots, check=False)

    def plan_graph_step(self, keys, layers, seq_lens_host: torch.Tensor, *, kv_format: str, max_bs: int,
                        max_seq_len: int) -> None:
        """Before a decode CUDA graph is captured or replayed, outside the capture: plan what a layer cannot plan
        inside one, for ``layers`` (``LayerSpec``) on the step's ``keys`` (``layer_step.StepKeys``) and each
        request's key count on the host (``seq_lens_host``). Nothing here: a route whose decode plans from host ints
        plans inside the capture."""
        return None

    @property
    def decode_prologue(self):
        """The Inkling model's fused decode prologue, with SGLang's ``inkling_attn_prologue_decode`` signature (plus
        ``quantize_q``): here the torch reference, imported at its first use (only the Inkling model asks)."""
        from sglang_inkling_backend.reference import prologue as reference_prologue

        return reference_prologue.inkling_attn_prologue_decode
