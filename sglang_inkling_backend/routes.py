"""The attention implementations the backend routes to, chosen once per backend (at construction).

- ``TorchRoute`` (here): the core's torch reference (``sglang_inkling_backend.reference.attention``): readable,
  float32 inside, per-request loops. The CPU route, and the fallback anywhere else.
- ``triton.route.TritonRoute``: the Triton family on CUDA/ROCm (decode split-KV kernels; extends through
  FlashInfer's ragged prefill where it serves the layer, else the Triton extend kernel). Each accelerated family
  keeps its route in its own folder, with ``unavailable_because`` and ``route_for``; ``choose_route`` asks them.

Hosts read a route's capabilities, never its name (``name`` is for log lines):
- ``graph_capturable``: decode can be captured in a CUDA graph (plans are views of one workspace);
- ``reads_page_tables``: decode takes a page table (``KVPages``) as well as per-token rails;
- ``query_in_model_dtype``: the kernels multiply the query in the model's dtype, so a float32 query (one dequantized
  from fp8) is cast to it first; the torch route computes in float32 and takes any float query;
- ``runs_triton``: the route's device runs Triton, so the host's own helpers may use Triton there too;
- ``fused_store``: one kernel storing K and V into an MXFP8 or unquantized pool (``fused_store(kv, loc, k, v,
  validate=False)``), or None (``kv_views`` stores with torch: indexed writes, the torch quantizer);
- ``gather_rail_slots``: the slot gather of ``rails.gather_rails_host_lengths`` as one kernel (its ``gather_slots``),
  or None;
- ``serves_verify``: ``extend`` takes a speculative verify step (``verify``, an ``attention_inputs.SpecVerify``:
  draft trees, and the step's ``workspace``, where a split verify launch keeps its partials); ``layer_step.attend``
  refuses one for a route without it.

A route answers ``make_workspace(**limits)``, ``decode(q, kv, keys, params, *, max_seq_len, plans, workspace)``
(``keys``: ``KVRails``, or ``KVPages`` where ``reads_page_tables``; ``plans``: the step's
``step_plans.DecodePlanCache``) and ``extend(q, kv, rails, qo_indptr, params, *, plans[, verify, workspace])``, each
returning
``[rows, Hq, D]`` (float32 or q's dtype; the backend casts to the model dtype). The host chooses the route once
(``choose_route``), logging which and why.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV, SpecVerify
from sglang_inkling_backend.checks import require_slots
from sglang_inkling_backend.rails import KVRails
from sglang_inkling_backend.reference import attention as reference
from sglang_inkling_backend.step_plans import DecodePlanCache

logger = logging.getLogger(__name__)


def gather_rails_kv(kv: PagedKV, rails: KVRails) -> tuple[PagedKV, KVRails]:
    """Read (and dequantize) every slot the batch attends over in one call, as a compact float32 PagedKV with
    rails renumbered 0..nnz-1. The reference then loops over requests without re-reading scales per request:
    same numbers (the reference dequantizes to float32 too), one gather per layer instead of one per request."""
    nnz = int(rails.indptr[-1])
    if nnz > rails.indices.numel():
        raise ValueError(f"the rails' indptr ends at {nnz}, past their {rails.indices.numel()} indices")
    k, v = kv.read(require_slots(rails.indices[:nnz], "the rails' indices", kv.num_slots), check=False)
    return PagedKV(k, v), KVRails(rails.indptr, torch.arange(nnz, device=k.device))


class TorchRoute:
    name = "torch"
    graph_capturable = False
    reads_page_tables = False  # it reads per-token rails
    query_in_model_dtype = False
    runs_triton = False
    fused_store = None  # kv_views.store_kv_unchecked stores with torch
    gather_rail_slots = None  # rails.gather_rails_host_lengths gathers with torch
    serves_verify = True  # the reference takes draft trees

    def make_workspace(self, **limits):
        return None  # the reference allocates per call

    def decode(self, q: torch.Tensor, kv: PagedKV, rails: KVRails, params: AttentionParams, *,
               max_seq_len: Optional[int] = None, plans: Optional[DecodePlanCache] = None,
               workspace=None) -> torch.Tensor:
        if not isinstance(rails, KVRails):
            raise TypeError(f"the torch route reads per-token rails (KVRails), got {type(rails).__name__}")
        kv, rails = gather_rails_kv(kv, rails)
        return reference.paged_decode_attention(q, kv, rails.indptr, rails.indices, params)

    def gather_keys(self, kv: PagedKV, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V rows at ``slots`` (checked by the caller), dequantized and scaled, as float32."""
        return kv.read(slots, check=False)

    def extend(self, q: torch.Tensor, kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor,
               params: AttentionParams, *, plans: Optional[DecodePlanCache] = None,
               verify: Optional[SpecVerify] = None, workspace=None) -> torch.Tensor:
        if not isinstance(rails, KVRails):
            raise TypeError(f"the torch route reads per-token rails (KVRails), got {type(rails).__name__}")
        if not rails.dense:  # ``workspace`` is unused: the reference allocates per call
            kv, rails = gather_rails_kv(kv, rails)
        return reference.paged_extend_attention(q, kv, rails.indptr, rails.indices, qo_indptr, params, verify)


def triton_unavailable(err: BaseException) -> bool:
    """True when ``err`` (raised importing our Triton kernels) says Triton itself is missing or too old: an
    ImportError of a module outside this package. Anything else (a SyntaxError, a NameError, an ImportError of our
    own modules) is a bug, which must raise rather than quietly become the slower torch route."""
    if not isinstance(err, ImportError):
        return False
    name = err.name or ""
    return bool(name) and name.split(".")[0] != "sglang_inkling_backend"


def triton_family():
    """``(sglang_inkling_backend.triton.route, "")``, or ``(None, why)`` when Triton is not installed or too old. A
    broken kernel module raises (see ``triton_unavailable``)."""
    try:
        from sglang_inkling_backend.triton import route
    except Exception as err:
        if not triton_unavailable(err):
            raise
        return None, f"{type(err).__name__}: {err}"
    return route, ""


def accelerated_route_possible(head_dims=()) -> tuple[bool, str]:
    """Whether ``choose_route`` would pick an accelerated (graph-capturable) route on a CUDA/ROCm device for these
    head sizes, answered without touching a device (the launcher's start-up checks ask it too): ``(True, "")`` or
    ``(False, why)``."""
    family, why = triton_family()
    if family is None:
        return False, f"sglang_inkling_backend.triton kernels are not available: {why}"
    why = family.unavailable_because(None, head_dims)
    return not why, why


def choose_route(device: torch.device, head_dims=()):
    """Torch on CPU; the Triton family on CUDA/ROCm when it imports and serves the GPU and the model's head sizes;
    else torch, with one WARNING saying why. The chosen route is logged with its extend kernel."""
    device = torch.device(device)  # a name ("cuda:0") is a device too
    if device.type == "cpu":
        logger.info("inkling: attention route: torch reference (device %s)", device)
        return TorchRoute()
    family, why = triton_family()
    if family is None:
        why = f"sglang_inkling_backend.triton kernels are not available: {why}"
    else:
        why = family.unavailable_because(device, head_dims)
    if why:
        logger.warning("inkling: attention route: torch reference on %s (%s); slower than the Triton route",
                       device, why)
        return TorchRoute()
    route, note = family.route_for(device)
    logger.info("inkling: attention route: %s", note)
    return route
