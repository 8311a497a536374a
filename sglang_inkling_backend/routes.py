"""The attention implementations the backend routes to, chosen once per backend (at construction).

- ``TorchRoute``: the core's torch reference (``sglang_inkling_backend.reference.attention``): readable, float32
  inside, per-request loops. The CPU route, and the fallback anywhere else.
- ``TritonRoute``: ``sglang_inkling_backend.triton`` kernels on CUDA/ROCm (decode split-KV kernel, extend kernel).
  Decode plans (``plan_decode``: kernel configuration, split-KV buffers) once per step and window, in the step's
  ``DecodePlanCache`` (``InklingForwardMetadata.decode_plans``), and runs every layer with ``run_decode``.

A route answers ``decode(q, kv, rails, params, max_seq_len=None, plans=None)`` and
``extend(q, kv, rails, qo_indptr, params)`` with ``[rows, Hq, D]`` (float32 or q's dtype; the backend casts to the model
dtype).
"""
from __future__ import annotations

import logging
from typing import Callable, Hashable, Optional

import torch

from sglang_inkling_backend.reference import attention as reference
from sglang_inkling_backend.reference.attention import AttentionParams, PagedKV
from sglang_inkling_backend.checks import stream_capturing
from sglang_inkling_backend.rails import KVRails

logger = logging.getLogger(__name__)


class DecodePlanCache:
    """The decode plans of one step (one forward metadata), keyed by everything a plan depends on besides the batch
    (the route's key: window, head counts, head_dim, KV dtype, page size; plus batch size and max_seq_len, which are
    fixed for a metadata anyway). Every layer with the same key shares one plan and its split-KV buffers: the layers
    run one after another on one stream, so one layer's merge has read the buffers before the next layer's split
    kernel writes them.

    CUDA-graph capture: SGLang builds the metadata once, runs the forward eagerly twice (warm-up), then once under
    capture. Plans from the warm-up hold buffers from the ordinary allocator; a graph that baked in those addresses
    would write, at every replay, into memory the allocator hands out again once this metadata is dropped. So the
    cache starts over whenever the device's capture state changes: the captured run makes its own plans, their
    buffers come from the graph's memory pool and are sized for the capture batch, and they stay here, with the
    captured metadata, for the rest of the capture (replays run no Python, so nothing is planned or allocated then).
    """

    def __init__(self) -> None:
        self._plans: dict = {}
        self._capturing = False

    def get(self, key: Hashable, make: Callable[[], object], device: torch.device):
        """The plan for ``key``, made with ``make()`` on first use (and again after a capture-state change)."""
        capturing = stream_capturing(device)
        if capturing != self._capturing:
            self._plans.clear()
            self._capturing = capturing
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = make()
        return plan

    def __len__(self) -> int:
        return len(self._plans)

    def plans(self) -> list:
        return list(self._plans.values())



def gather_rails_kv(kv: PagedKV, rails: KVRails) -> tuple[PagedKV, KVRails]:
    """Read (and dequantize) every slot the batch attends over in one call, as a compact float32 PagedKV with
    rails renumbered 0..nnz-1. The reference then loops over requests without re-reading scales per request:
    same numbers (the reference dequantizes to float32 too), one gather per layer instead of one per request."""
    nnz = int(rails.indptr[-1])
    k, v = kv.read(rails.indices[:nnz])
    return PagedKV(k, v), KVRails(rails.indptr, torch.arange(nnz, device=k.device))


class TorchRoute:
    name = "torch"
    graph_capturable = False
    mxfp8_store = None  # kv_views.store_kv_unchecked quantizes with the torch reference

    def decode(self, q: torch.Tensor, kv: PagedKV, rails: KVRails, params: AttentionParams,
               max_seq_len: Optional[int] = None, plans: Optional[DecodePlanCache] = None) -> torch.Tensor:
        kv, rails = gather_rails_kv(kv, rails)
        return reference.paged_decode_attention(q, kv, rails.indptr, rails.indices, params)

    def extend(self, q: torch.Tensor, kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor,
               params: AttentionParams) -> torch.Tensor:
        kv, rails = gather_rails_kv(kv, rails)
        return reference.paged_extend_attention(q, kv, rails.indptr, rails.indices, qo_indptr, params)


class TritonRoute:
    name = "triton"
    graph_capturable = True

    def __init__(self, kernels):
        self.kernels = kernels
        self.mxfp8_store = kernels.store_kv_mxfp8

    def decode(self, q: torch.Tensor, kv: PagedKV, rails: KVRails, params: AttentionParams,
               max_seq_len: Optional[int] = None, plans: Optional[DecodePlanCache] = None) -> torch.Tensor:
        """One layer's decode. With ``plans`` (the step's cache, from its metadata) the plan is made on the first
        layer of each (window, shape) key and reused by the others; without, every call plans for itself."""
        # With max_seq_len (a host int) the kernel's plan needs no device sync: what CUDA-graph capture needs.
        # An MXFP8 pool is paged (page 128, forced by hooks.py): SGLang's paged allocator gives every request whole
        # pages, the contract SGLang's own MXFP8 decode (FA4, which reads a page table) relies on too, so the
        # kernel finds each tile's slots from one index. Only full rails keep that contract: they start at token 0.
        # A window rail starts at the window (mid-page), and on a hybrid pool it holds sliding-window sub-pool
        # slots, so windowed layers are planned per token.
        page_size = (kv.layout.page_size if kv.is_mxfp8 and params.window is None and kv.layout.page_size % 16 == 0
                     else None)
        options = {"page_size": page_size} if page_size is not None else None
        if plans is None:
            return self.kernels.paged_decode_attention(q, kv, rails.indptr, rails.indices, params,
                                                       max_seq_len=max_seq_len, validate=False, plan_options=options)
        # The no-sync shape/dtype/device checks paged_decode_attention runs, on every call (not only the layer that
        # plans): q, the pool, rel_bias and sinks are per layer. Then the key holds every input of the plan.
        self.kernels.check_decode_inputs(q, kv, rails.indptr, rails.indices, params, None)
        hq, hkv, d, kv_dtype = q.shape[1], kv.num_kv_heads, q.shape[2], kv.k_buffer.dtype
        batch = rails.indptr.numel() - 1  # a host int (the tensor's shape): no sync
        key = (params.window, hq, hkv, d, kv_dtype, page_size, batch, max_seq_len)
        plan = plans.get(key, lambda: self.kernels.plan_decode(
            rails.indptr, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, window=params.window,
            max_seq_len=max_seq_len, page_size=page_size, kv_dtype=kv_dtype), q.device)
        return self.kernels.run_decode(plan, q, kv, rails.indptr, rails.indices, params, out=None, check=False)

    def extend(self, q: torch.Tensor, kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor,
               params: AttentionParams) -> torch.Tensor:
        return self.kernels.paged_extend_attention(q, kv, rails.indptr, rails.indices, qo_indptr, params,
                                                   validate=False)


KERNEL_NAMES = ("paged_decode_attention", "check_decode_inputs", "plan_decode", "run_decode", "paged_extend_attention",
                "store_kv_mxfp8")


def triton_unavailable(err: BaseException) -> bool:
    """True when ``err`` (raised importing our Triton kernels) says Triton itself is missing or too old: an
    ImportError of a module outside this package. Anything else (a SyntaxError, a NameError, an ImportError of our
    own modules) is a bug, which must raise rather than quietly become the slower torch route."""
    if not isinstance(err, ImportError):
        return False
    name = err.name or ""
    return bool(name) and name.split(".")[0] != "sglang_inkling_backend"


def triton_decode_kernel():
    """``(kernels, None)``: ``sglang_inkling_backend.triton`` with the decode and extend kernels; or ``(None, why)``
    when Triton is not installed or too old. A broken kernel module raises (see ``triton_unavailable``)."""
    try:
        from sglang_inkling_backend import triton as kernels
    except Exception as err:
        if not triton_unavailable(err):
            raise
        return None, f"{type(err).__name__}: {err}"
    missing = [name for name in KERNEL_NAMES if not hasattr(kernels, name)]
    if missing:
        raise ImportError(f"sglang_inkling_backend.triton lacks {missing}: the package is broken or mixed versions")
    return kernels, None


def triton_head_dim_ok(head_dim: int) -> bool:
    return head_dim >= 32 and head_dim & (head_dim - 1) == 0


def choose_route(device: torch.device, head_dims=()):
    """Torch on CPU; Triton on CUDA/ROCm when our kernels import and serve the model's head sizes; else torch, with
    one log line saying why."""
    if device.type == "cpu":
        logger.info("inkling: attention route: torch reference (device %s)", device)
        return TorchRoute()
    kernels, why = triton_decode_kernel()
    if kernels is None:
        logger.warning("inkling: attention route: torch reference on %s (sglang_inkling_backend.triton kernels are "
                       "not available: %s); slower than the Triton route", device, why)
        return TorchRoute()
    unsupported = sorted(d for d in set(head_dims) if not triton_head_dim_ok(d))
    if unsupported:
        logger.warning("inkling: attention route: torch reference on %s (the Triton kernels need a power-of-two "
                       "head_dim >= 32, the model has %s); slower than the Triton route", device, unsupported)
        return TorchRoute()
    logger.info("inkling: attention route: Triton kernels on %s", device)
    return TritonRoute(kernels)
