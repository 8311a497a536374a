"""The attention implementations the backend routes to, chosen once per backend (at construction).

- ``TorchRoute``: the core's torch reference (``sglang_inkling_backend.reference.attention``): readable, float32
  inside, per-request loops. The CPU route, and the fallback anywhere else.
- ``TritonRoute``: ``sglang_inkling_backend.triton`` kernels on CUDA/ROCm (decode split-KV kernels, extend kernel),
  with FlashInfer's ragged prefill for the extends whose semantics are FlashInfer's where it is installed
  (``sglang_inkling_backend.flashinfer``: the extend family; ``INKLING_EXTEND_KERNEL`` = auto, triton or flashinfer).
  Decode plans (``plan_decode``: kernel configuration, split-KV buffers as views of the one workspace the host
  allocated at start-up with ``make_workspace``) once per step and key, in the step's ``DecodePlanCache``, and
  runs every layer with ``run_decode``; it reads page tables (``reads_page_tables``).

Hosts read a route's capabilities, never its name (``name`` is for log lines):
- ``graph_capturable``: decode can be captured in a CUDA graph (plans are views of one workspace);
- ``reads_page_tables``: decode takes a page table (``KVPages``) as well as per-token rails;
- ``query_in_model_dtype``: the kernels multiply the query in the model's dtype, so a float32 query (one dequantized
  from fp8) is cast to it first; the torch route computes in float32 and takes any float query;
- ``runs_triton``: the route's device runs Triton, so the host's own helpers may use Triton there too;
- ``mxfp8_store``: the fused MXFP8 K/V store, or None (``kv_views`` quantizes with the torch reference).

A route answers ``decode(q, kv, keys, params, *, max_seq_len, plans, workspace)`` (``keys``: ``KVRails``, or
``KVPages`` where ``reads_page_tables``) and ``extend(q, kv, rails, qo_indptr, params, *, plans)`` with
``[rows, Hq, D]``
(float32 or q's dtype; the backend casts to the model dtype). The host chooses the route once
(``choose_route``), logging which and why.
"""
from __future__ import annotations

import logging
from typing import Callable, Hashable, Optional, Union

import torch

from sglang_inkling_backend.reference import attention as reference
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV
from sglang_inkling_backend.checks import require_slots, stream_capturing, triton_head_dim_ok
from sglang_inkling_backend.rails import KVPages, KVRails

logger = logging.getLogger(__name__)
MIN_TRITON_CAPABILITY = (8, 0)  # NVIDIA: the kernels' bf16 dots; 8-bit pools before sm_89 are read as bytes


class DecodePlanCache:
    """The decode plans of one step (one forward metadata), keyed by everything a plan depends on (window, head
    counts, head_dim, KV dtype, page size, batch size, max_seq_len). Every layer with the same key shares one plan:
    plans hold views of the route's one workspace, allocated at start-up, so making a plan allocates nothing, and a
    plan made while a CUDA graph is being captured stays valid for every replay."""

    def __init__(self) -> None:
        self._plans: dict = {}
        self._checked: set = set()

    def get(self, key: Hashable, make: Callable[[], object]):
        """The plan for ``key``, made with ``make()`` on first use."""
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = make()
        return plan

    def once(self, key: Hashable, check: Callable[[], object]) -> None:
        """Run ``check()`` the first time ``key`` is seen in this step (a check of the step's keys: once, not per
        layer); if it raises, it runs again next time."""
        if key not in self._checked:
            check()
            self._checked.add(key)

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


def check_extend_keys(kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor, rows: int) -> bool:
    """The extend's keys as the kernels read them (one sync): ``qo_indptr`` and the rails' ``indptr`` from 0,
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
    qo, kvp = qo_indptr.tolist(), rails.indptr.tolist()
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
        raise ValueError(f"extend request {b} has {qo[b + 1] - qo[b]} queries but {kvp[b + 1] - kvp[b]} keys; each "
                         "request's keys include its queries")
    require_slots(rails.indices[:kvp[-1]], "the extend rails' slots", kv.num_slots)
    return True


class TorchRoute:
    name = "torch"
    graph_capturable = False
    reads_page_tables = False  # it reads per-token rails
    query_in_model_dtype = False
    runs_triton = False
    mxfp8_store = None  # kv_views.store_kv_unchecked quantizes with the torch reference

    def make_workspace(self, **limits):
        return None  # the reference allocates per call

    def decode(self, q: torch.Tensor, kv: PagedKV, rails: KVRails, params: AttentionParams, *,
               max_seq_len: Optional[int] = None, plans: Optional[DecodePlanCache] = None,
               workspace=None) -> torch.Tensor:
        if not isinstance(rails, KVRails):
            raise TypeError(f"the torch route reads per-token rails (KVRails), got {type(rails).__name__}")
        kv, rails = gather_rails_kv(kv, rails)
        return reference.paged_decode_attention(q, kv, rails.indptr, rails.indices, params)

    def extend(self, q: torch.Tensor, kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor,
               params: AttentionParams, *, plans: Optional[DecodePlanCache] = None) -> torch.Tensor:
        kv, rails = gather_rails_kv(kv, rails)
        return reference.paged_extend_attention(q, kv, rails.indptr, rails.indices, qo_indptr, params)


class TritonRoute:
    name = "triton"
    graph_capturable = True
    reads_page_tables = True
    query_in_model_dtype = True
    runs_triton = True

    def __init__(self, kernels, extend_family=None):
        self.kernels = kernels
        self.mxfp8_store = kernels.store_kv_mxfp8
        self.extend_family = extend_family  # flashinfer.FlashInferExtend, or None: the Triton extend kernel only
        self._extend_notes: set = set()  # the reasons already logged for running the Triton extend kernel

    def make_workspace(self, *, max_batch: int, geometries, max_seq_len: int, device):
        """One ``DecodeWorkspace`` for every layer shape of the model (``geometries``: ``(Hq, Hkv, D)`` per layer):
        room for the most split rows any of them plans for up to ``max_batch`` requests of ``max_seq_len`` keys."""
        geometries = set(geometries)
        shapes = [self.kernels.decode_workspace_shape(max_batch, hkv, max_seq_len, device) for _, hkv, _ in geometries]
        batch, splits = max(shapes, key=lambda shape: shape[0] * shape[1])  # the most split rows
        return self.kernels.DecodeWorkspace(batch, max(g[0] for g in geometries), max(g[2] for g in geometries),
                                            splits, device)

    def decode(self, q: torch.Tensor, kv: PagedKV, keys: Union[KVRails, KVPages], params: AttentionParams, *,
               max_seq_len: int, plans: DecodePlanCache, workspace) -> torch.Tensor:
        """One layer's decode. The plan is made on the first layer of each (window, shape) key of the step and
        reused by the others; ``max_seq_len`` is a host int, so nothing reads the device (CUDA-graph capture).

        ``keys``: a page table (``KVPages``: the paged kernels, windows included, positions absolute) or per-token
        rails (``KVRails``: any slot per token; a hybrid pool's window rails, a pool without whole pages)."""
        pages = isinstance(keys, KVPages)
        page_size = keys.page_size if pages else None
        csr = (None, None) if pages else (keys.indptr, keys.indices)
        table = (keys.page_table, keys.seq_lens) if pages else (None, None)
        # The no-sync shape/dtype/device checks, on every call (not only the layer that plans): q, the pool,
        # rel_bias and sinks are per layer. Then the key holds every input of the plan.
        self.kernels.check_decode_inputs(q, kv, *csr, params, None, page_table=table[0], seq_lens=table[1],
                                         page_size=page_size)
        batch, hq, d = q.shape
        hkv, kv_dtype = kv.num_kv_heads, kv.k_buffer.dtype
        kv_format = kv.kv_format
        key = (params.window, hq, hkv, d, kv_dtype, kv_format, page_size, batch, max_seq_len)
        if not stream_capturing(q.device):
            # The values the kernels read unchecked (block ids, lengths, max_seq_len), once per step and key: a page
            # past the pool would be an illegal address (a killed process); a length past max_seq_len, lost keys.
            plans.once(("decode keys", params.window, kv.num_slots, page_size),
                       lambda: self._check_decode_keys(kv, keys, params.window, max_seq_len))
        plan = plans.get(key, lambda: self.kernels.plan_decode(
            batch, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, window=params.window, max_seq_len=max_seq_len,
            page_size=page_size, kv_dtype=kv_dtype, workspace=workspace, kv_format=kv_format))
        return self.kernels.run_decode(plan, q, kv, *csr, params, check=False, page_table=table[0],
                                       seq_lens=table[1])

    def _check_decode_keys(self, kv: PagedKV, keys: Union[KVRails, KVPages], window: Optional[int],
                           max_seq_len: int) -> None:
        if isinstance(keys, KVPages):
            self.kernels.validate_page_table(kv, keys.page_table, keys.seq_lens, keys.page_size, window=window,
                                             max_seq_len=max_seq_len)
        else:
            self.kernels.validate_slots(kv, keys.indptr, keys.indices, max_seq_len=max_seq_len)

    def extend(self, q: torch.Tensor, kv: PagedKV, rails: KVRails, qo_indptr: torch.Tensor,
               params: AttentionParams, *, plans: Optional[DecodePlanCache] = None) -> torch.Tensor:
        """One layer's extend: the extend family (FlashInfer) where it serves the layer and the step gives
        ``plans``, else the Triton kernel, with one log line per reason. The keys are checked once per step and
        window (``check_extend_keys``), before any kernel reads them."""
        if plans is None:
            check_extend_keys(kv, rails, qo_indptr, q.shape[0])
        else:
            plans.once(("extend keys", params.window, kv.num_slots),
                       lambda: check_extend_keys(kv, rails, qo_indptr, q.shape[0]))
        family = self.extend_family
        if family is not None:
            why = family.why_not(q, kv, params) or ("" if plans is not None else "no step plan cache")
            if not why:
                try:
                    return family.extend(q, kv, rails, qo_indptr, params, plans)
                except Exception as err:
                    if family.served:
                        raise  # it has served before: a real failure, not an install that cannot build its kernel
                    # It writes none of our buffers, so the Triton kernel can still serve this call.
                    self.extend_family = None
                    logger.warning("inkling: extend: %s failed on its first call (%s: %s); the Triton extend "
                                   "kernel serves every extend from now on", family.name, type(err).__name__, err)
            elif why not in self._extend_notes:
                self._extend_notes.add(why)
                logger.info("inkling: extend: the Triton kernel for layers with %s", why)
        return self.kernels.paged_extend_attention(q, kv, rails.indptr, rails.indices, qo_indptr, params,
                                                   validate=False)


KERNEL_NAMES = ("check_decode_inputs", "plan_decode", "run_decode", "paged_extend_attention", "store_kv_mxfp8",
                "DecodeWorkspace", "decode_workspace_shape", "route_note")


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


def _triton_kernels_for(head_dims) -> tuple:
    """``(kernels, "")`` when the Triton kernels import and serve every head size, else ``(None, why)``."""
    kernels, why = triton_decode_kernel()
    if kernels is None:
        return None, f"sglang_inkling_backend.triton kernels are not available: {why}"
    unsupported = sorted(d for d in set(head_dims) if not triton_head_dim_ok(d))
    if unsupported:
        return None, f"the Triton kernels need a power-of-two head_dim >= 32, the model has {unsupported}"
    return kernels, ""


def triton_route_possible(head_dims=()) -> tuple[bool, str]:
    """Whether ``choose_route`` would pick the Triton route on a CUDA/ROCm device for these head sizes, answered
    without touching a device (the launcher's start-up checks ask it too): ``(True, "")`` or ``(False, why)``."""
    kernels, why = _triton_kernels_for(head_dims)
    return kernels is not None, why


def choose_route(device: torch.device, head_dims=()):
    """Torch on CPU; Triton on CUDA/ROCm when our kernels import and serve the model's head sizes; else torch, with
    one log line saying why. The Triton route's extends go through FlashInfer where it is installed and serves the
    layer (``flashinfer.extend_family``; ``INKLING_EXTEND_KERNEL``), logged with the route."""
    if device.type == "cpu":
        logger.info("inkling: attention route: torch reference (device %s)", device)
        return TorchRoute()
    if device.type == "cuda" and torch.version.hip is None and torch.cuda.is_available() and \
            torch.cuda.get_device_capability(device) < MIN_TRITON_CAPABILITY:
        major, minor = torch.cuda.get_device_capability(device)
        logger.warning("inkling: attention route: torch reference on %s (%s is sm_%d%d; the Triton kernels need "
                       "sm_%d%d or newer for their bf16 dots); slower than the Triton route", device,
                       torch.cuda.get_device_name(device), major, minor, *MIN_TRITON_CAPABILITY)
        return TorchRoute()
    kernels, why = _triton_kernels_for(head_dims)
    if kernels is None:
        logger.warning("inkling: attention route: torch reference on %s (%s); slower than the Triton route",
                       device, why)
        return TorchRoute()
    from sglang_inkling_backend.flashinfer import extend_family

    family, note = extend_family(device)
    logger.info("inkling: attention route: Triton kernels on %s; %s; extend: %s", device, kernels.route_note(device),
                f"{note} where a layer's semantics are FlashInfer's, else the Triton kernel" if family is not None
                else f"the Triton kernel ({note})")
    return TritonRoute(kernels, family)
