"""The attention routes, chosen once per backend (at construction): ``choose_route``.

- ``TorchRoute`` (here): the core's torch reference (``sglang_inkling_backend.reference.attention``): readable,
  float32 inside, per-request loops. The CPU route, and the fallback anywhere else.
- the accelerated routes, one module per kernel family folder, named in ``ACCELERATED_ROUTES`` and imported only when
  an accelerated route is asked for. Today ``gpu/route.py``: ``GpuRoute``, this package's Triton kernels with
  FlashInfer's decode and extend families where they serve, on CUDA/ROCm.

Every route is a ``route_protocol.Route``: what a host may call and read on it is declared there, with the defaults
a route lacking a capability inherits. An accelerated route module answers ``unavailable_because(device,
head_dims)`` ("" or why not; ``device`` None: any device of its kind, asked without touching one) and
``route_for(device)`` (``(route, note for the start-up log line)``). A new accelerator is a folder with such a
module and one line in ``ACCELERATED_ROUTES``. The host chooses the route once (``choose_route``), logging which and
why.
"""
from __future__ import annotations

import importlib
import logging
from typing import Optional

import torch

from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV, SpecVerify
from sglang_inkling_backend.checks import require_slots
from sglang_inkling_backend.rails import KVRails
from sglang_inkling_backend.reference import attention as reference
from sglang_inkling_backend.route_protocol import Route
from sglang_inkling_backend.step_plans import DecodePlanCache

logger = logging.getLogger(__name__)

# The accelerated routes choose_route tries on a device other than the CPU, in order: one line per kernel family
# folder, its route module by path.
ACCELERATED_ROUTES = (
    "sglang_inkling_backend.gpu.route",  # CUDA/ROCm: Triton kernels, FlashInfer's decode and extend families
)


def gather_rails_kv(kv: PagedKV, rails: KVRails) -> tuple[PagedKV, KVRails]:
    """Read (and dequantize) every slot the batch attends over in one call, as a compact float32 PagedKV with
    rails renumbered 0..nnz-1. The reference then loops over requests without re-reading scales per request:
    same numbers (the reference dequantizes to float32 too), one gather per layer instead of one per request."""
    nnz = int(rails.indptr[-1])
    if nnz > rails.indices.numel():
        raise ValueError(f"the rails' indptr ends at {nnz}, past their {rails.indices.numel()} indices")
    k, v = kv.read(require_slots(rails.indices[:nnz], "the rails' indices", kv.num_slots), check=False)
    return PagedKV(k, v), KVRails(rails.indptr, torch.arange(nnz, device=k.device))


class TorchRoute(Route):
    """The torch reference: per-token rails, float32 inside, any device. Every capability but ``serves_verify`` is
    the ``Route`` default (no graphs, no page tables, torch stores and gathers, no workspace: the reference
    allocates per call, the reference prologue)."""

    name = "torch"
    serves_verify = True  # the reference takes draft trees

    def decode(self, q: torch.Tensor, kv: PagedKV, rails: KVRails, params: AttentionParams, *,
               max_seq_len: Optional[int] = None, plans: Optional[DecodePlanCache] = None,
               workspace=None) -> torch.Tensor:
        if not isinstance(rails, KVRails):
            raise TypeError(f"the torch route reads per-token rails (KVRails), got {type(rails).__name__}")
        kv, rails = gather_rails_kv(kv, rails)
        return reference.paged_decode_attention(q, kv, rails.indptr, rails.indices, params)

    def extend(self, q: torch.Tensor, kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor,
               params: AttentionParams, *, plans: Optional[DecodePlanCache] = None,
               verify: Optional[SpecVerify] = None, workspace=None) -> torch.Tensor:
        if not isinstance(rails, KVRails):
            raise TypeError(f"the torch route reads per-token rails (KVRails), got {type(rails).__name__}")
        if not rails.dense:  # ``workspace`` is unused: the reference allocates per call
            kv, rails = gather_rails_kv(kv, rails)
        return reference.paged_extend_attention(q, kv, rails.indptr, rails.indices, qo_indptr, params, verify)


def missing_dependency(err: BaseException) -> bool:
    """True when ``err`` (raised importing an accelerated route module) says a library it needs is missing or too
    old: an ImportError of a module outside this package. Anything else (a SyntaxError, a NameError, an ImportError
    of our own modules) is a bug, which must raise rather than quietly become the slower torch route."""
    if not isinstance(err, ImportError):
        return False
    name = err.name or ""
    return bool(name) and name.split(".")[0] != "sglang_inkling_backend"


def load_route_module(path: str):
    """``(module, "")`` for the accelerated route module ``path``, or ``(None, why)`` when a library it needs is not
    installed or too old. A broken module of this package raises (see ``missing_dependency``)."""
    try:
        module = importlib.import_module(path)
    except Exception as err:
        if not missing_dependency(err):
            raise
        return None, f"{path} is not available: {type(err).__name__}: {err}"
    return module, ""


def _first_accelerated(device: Optional[torch.device], head_dims) -> tuple[object, str]:
    """``(route module, "")`` for the first of ``ACCELERATED_ROUTES`` that imports and serves ``device`` (None: any
    device of its kind) and these head sizes, else ``(None, every module's reason, joined)``."""
    reasons = []
    for path in ACCELERATED_ROUTES:
        module, why = load_route_module(path)
        if module is not None:
            why = module.unavailable_because(device, head_dims)
            if not why:
                return module, ""
        reasons.append(why)
    return None, "; ".join(reasons) or "no accelerated route is listed"


def accelerated_route_possible(head_dims=()) -> tuple[bool, str]:
    """Whether ``choose_route`` would pick an accelerated route (today the GPU route, graph-capturable) on a
    CUDA/ROCm device for these head sizes, answered without touching a device (the launcher's start-up checks ask it
    too): ``(True, "")`` or ``(False, why)``."""
    module, why = _first_accelerated(None, head_dims)
    return module is not None, why


def choose_route(device: torch.device, head_dims=()) -> Route:
    """Torch on CPU; elsewhere the first of ``ACCELERATED_ROUTES`` that imports and serves the device and the model's
    head sizes, else torch, with one WARNING saying why. The chosen route is logged with its note (for the GPU
    route: its decode and extend kernels)."""
    device = torch.device(device)  # a name ("cuda:0") is a device too
    if device.type == "cpu":
        logger.info("inkling: attention route: torch reference (device %s)", device)
        return TorchRoute()
    module, why = _first_accelerated(device, head_dims)
    if module is None:
        logger.warning("inkling: attention route: torch reference on %s (%s); slower than an accelerated route",
                       device, why)
        return TorchRoute()
    route, note = module.route_for(device)
    logger.info("inkling: attention route: %s", note)
    return route
