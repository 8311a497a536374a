"""A decode's attention through FlashInfer's paged decode, for 16-bit pools read through per-token rails.

Semantics are ``reference.attention.paged_decode_attention``: request b's one query is its rail's last key and sees
every key of the rail. A window rail is already cut to the window (``rails.window_start``), so FlashInfer's own
window stays off (``window_left = -1``); its soft cap is ``cap * tanh(x / cap)`` on the scaled logit, as ours.
FlashInfer's pages are the pool's slots: page_size 1, ``indptr`` the rail's, ``indices`` its slots as int32, every
last page full. That is how SGLang's flashinfer backend reads a 16-bit pool of page size 1, with the same kernels:
tensor cores (FlashInfer's prefill kernel run as a decode) where the GQA group is 4 or more, SGLang's rule for
16-bit KV (``should_use_tensor_core`` in sglang/srt/layers/attention/flashinfer_backend.py).

Served: a bf16/fp16 pool with a query of its dtype, per-token rails, no relative bias, no sinks, head_dim
64/128/256. 8-bit pools stay on this package's kernels, as do page tables.

Plans: FlashInfer's ``plan`` reads the rail lengths on the host. Eagerly, the first layer of each key (window, head
counts, head_dim, dtype, cap, scale) plans it in the step's plan cache (the rail's indptr read back: one sync per
step and key). FlashInfer cannot plan inside a CUDA-graph capture, so under graphs the host calls the route's
``plan_graph_step`` (``GpuRoute``'s) before each capture and each replay, outside the graph, with its host sequence
lengths: one wrapper per (key, batch size) over buffers allocated once per window (indptr, int32 indices of
``max_bs * max keys``, last-page lengths), which every replay's plan refills at the same addresses. A wrapper's first
plan (at its capture) is FlashInfer's ``plan``, which builds its kernel module; its replays are planned with
FlashInfer's ``fast_decode_plan``, as SGLang's flashinfer backend does (``flashinfer_backend.py``: ``begin_forward =
partial(fast_decode_plan, w)`` after the capture's plan): the same host planning, without ``plan``'s argument
handling and buffer copies (this family writes the indptr and indices into the graph buffers itself, once per step
and window).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch

from .. import settings
from ..kv_formats import KVFormat
from ..attention_inputs import AttentionParams, PagedKV
from ..checks import stream_capturing
from ..rails import KVRails
from .install import HEAD_DIMS, find_flashinfer, float_workspace, plan_logging_first

logger = logging.getLogger(__name__)
DECODE_KERNEL_ENV = settings.DECODE_KERNEL.name  # auto (default): FlashInfer where it serves; triton; flashinfer
SERVED_FORMATS = (KVFormat.BF16, KVFormat.FP16)
TENSOR_CORE_MIN_GROUP = 4  # SGLang's should_use_tensor_core for 16-bit KV
PLAN_TAG = "flashinfer decode"


def decode_family(device: torch.device, workspace: Optional[torch.Tensor] = None
                  ) -> tuple[Optional["FlashInferDecode"], str]:
    """``(FlashInferDecode, note)`` where FlashInfer serves decodes on ``device`` and ``INKLING_DECODE_KERNEL``
    allows it, else ``(None, why)``. ``INKLING_DECODE_KERNEL=flashinfer`` raises (ValueError) when it cannot.
    ``workspace``: the route's float workspace, allocated here when None."""
    flashinfer, why = find_flashinfer(DECODE_KERNEL_ENV, "BatchDecodeWithPagedKVCacheWrapper", device)
    if flashinfer is None:
        return None, why
    family = FlashInferDecode(flashinfer, device, workspace)
    return family, f"FlashInfer {family.version} paged decode"


@dataclass
class GraphRails:
    """One window's address-stable FlashInfer inputs under CUDA graphs (every batch size's wrapper views them)."""

    indptr: torch.Tensor  # int32 [max_bs + 1]
    indices: torch.Tensor  # int32 [max_bs * max keys]
    last_page_len: torch.Tensor  # int32 [max_bs], all ones (page_size 1)


def use_tensor_cores(num_q_heads: int, num_kv_heads: int) -> bool:
    return num_q_heads // num_kv_heads >= TENSOR_CORE_MIN_GROUP


def rail_lengths(seq_lens_host: torch.Tensor, window: Optional[int]) -> torch.Tensor:
    """Each decode request's rail length (int32, host) from its key count: the window's keys at most."""
    lengths = seq_lens_host.to(torch.int32)
    return lengths if window is None else lengths.clamp(max=window)


class FlashInferDecode:
    """The family: the route's float workspace, FlashInfer wrappers per plan key (eager) or per (key, batch size)
    (CUDA graphs), and the graph buffers per window."""

    name = "flashinfer"

    def __init__(self, flashinfer, device: torch.device, workspace: Optional[torch.Tensor] = None):
        self._flashinfer = flashinfer
        self.device = device
        self.version = getattr(flashinfer, "__version__", "?")
        self.workspace = float_workspace(device) if workspace is None else workspace
        self._wrappers: dict = {}
        self._graph_rails: dict = {}  # window -> GraphRails
        self.served = False  # True after the first decode it ran (the route falls back only before that)
        # FlashInfer's replay planner (0.5 and 0.7 export it); without it every replay runs the full plan
        self._fast_plan = getattr(flashinfer, "fast_decode_plan", None)
        if self._fast_plan is None:
            logger.info("inkling: FlashInfer %s has no fast_decode_plan: decode graph replays run its full plan",
                        self.version)

    @staticmethod
    def plan_key(window: Optional[int], hq: int, hkv: int, d: int, dtype: torch.dtype, params: AttentionParams):
        return (PLAN_TAG, window, hq, hkv, d, dtype, params.logit_cap, params.softmax_scale)

    @staticmethod
    def layer_why_not(kv_format: str, head_dim: int, params: AttentionParams) -> str:
        """"" when a layer's pool and parameters allow this family, else the reason (the call's keys and query are
        ``why_not``'s)."""
        if kv_format not in SERVED_FORMATS:
            return f"a {kv_format} pool (this package's kernels read 8-bit pools)"
        if params.rel_bias is not None:
            return "a relative bias (FlashInfer's decode adds none)"
        if params.sinks is not None:
            return "attention sinks"
        if head_dim not in HEAD_DIMS:
            return f"head_dim {head_dim} (FlashInfer's decode serves {HEAD_DIMS})"
        return ""

    def why_not(self, q: torch.Tensor, kv: PagedKV, keys, params: AttentionParams, plans) -> str:
        """"" when this family serves the layer's decode now, else the reason (a phrase for a log line)."""
        why = self.layer_why_not(kv.kv_format, kv.head_dim, params)
        if why:
            return why
        if not isinstance(keys, KVRails):
            return "a page table (FlashInfer's decode here reads per-token rails)"
        if q.dtype != kv.k_buffer.dtype:
            return f"a {q.dtype} query over a {kv.k_buffer.dtype} pool"
        key = self.plan_key(params.window, q.shape[1], kv.num_kv_heads, kv.head_dim, q.dtype, params)
        if stream_capturing(q.device) and not plans.has(key):
            return "a CUDA-graph capture with no FlashInfer plan made before it (the host's plan_graph_step)"
        return ""

    def _new_wrapper(self, hq: int, hkv: int, graph: Optional[GraphRails] = None, bs: int = 0):
        tensor_cores = use_tensor_cores(hq, hkv)
        if graph is None:
            return self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD",
                                                                         use_tensor_cores=tensor_cores)
        return self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
            paged_kv_indptr_buffer=graph.indptr[:bs + 1], paged_kv_indices_buffer=graph.indices,
            paged_kv_last_page_len_buffer=graph.last_page_len[:bs])

    @staticmethod
    def _plan(wrapper, indptr_host: torch.Tensor, indices: torch.Tensor, key) -> None:
        _, _, hq, hkv, d, dtype, cap, scale = key
        bs = indptr_host.numel() - 1
        plan_logging_first("paged decode", (hq, hkv, d, dtype, cap), lambda: wrapper.plan(
            indptr_host, indices, torch.ones(bs, dtype=torch.int32), hq, hkv, d, 1,
            logits_soft_cap=cap if cap > 0 else None, q_data_type=dtype, kv_data_type=dtype, sm_scale=scale))

    def _plan_replay(self, wrapper, indptr_host: torch.Tensor, graph: GraphRails, bs: int, nnz: int, key) -> None:
        """A graph wrapper's later plans: ``fast_decode_plan`` over the graph buffers, which hold this step's indptr
        and indices already (``plan_graph``); the host indptr is what it plans from."""
        _, _, hq, hkv, d, dtype, cap, scale = key
        self._fast_plan(wrapper, graph.indptr[:bs + 1], graph.indices[:nnz], graph.last_page_len[:bs], hq, hkv, d, 1,
                        logits_soft_cap=cap if cap > 0 else None, q_data_type=dtype, kv_data_type=dtype,
                        sm_scale=scale, non_blocking=True, global_override_indptr_cpu=indptr_host)

    def _plan_eager(self, key, rails: KVRails):
        wrapper = self._wrappers.get(key)
        if wrapper is None:
            wrapper = self._wrappers[key] = self._new_wrapper(key[2], key[3])
        indptr_host = rails.indptr.to("cpu", torch.int32)  # one sync per step and key
        self._plan(wrapper, indptr_host, rails.indices[:int(indptr_host[-1])].to(torch.int32), key)
        return wrapper

    def graph_rails(self, window: Optional[int], max_bs: int, max_keys: int) -> GraphRails:
        """The window's graph buffers, allocated at the first call; later calls must fit them (the captured graphs
        hold their addresses)."""
        rails = self._graph_rails.get(window)
        if rails is None:
            rails = self._graph_rails[window] = GraphRails(
                torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device),
                torch.zeros(max_bs * max_keys, dtype=torch.int32, device=self.device),
                torch.ones(max_bs, dtype=torch.int32, device=self.device))
        elif rails.last_page_len.numel() < max_bs or rails.indices.numel() < max_bs * max_keys:
            raise ValueError(f"the FlashInfer decode graph buffers of window {window} hold {rails.last_page_len.numel()}"
                             f" requests of {rails.indices.numel() // rails.last_page_len.numel()} keys; asked for "
                             f"{max_bs} of {max_keys}")
        return rails

    def plan_graph(self, plans, key, rails: KVRails, seq_lens_host: torch.Tensor, max_bs: int,
                   max_keys: int) -> None:
        """Plan ``key`` for this step's CUDA-graph batch (outside the capture): the window's rails copied into its
        graph buffers as int32 (once per step and window) and this batch size's wrapper planned on them."""
        window = key[1]
        graph = self.graph_rails(window, max_bs, max_keys)
        bs = seq_lens_host.numel()
        indptr_host = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(rail_lengths(seq_lens_host, window), 0, out=indptr_host[1:])
        nnz = int(indptr_host[-1])
        if nnz > graph.indices.numel():
            raise ValueError(f"the decode batch's {nnz} keys (window {window}) exceed the FlashInfer graph buffer's "
                             f"{graph.indices.numel()}")
        def fill_graph_rails():
            graph.indices[:nnz].copy_(rails.indices[:nnz])
            graph.indptr[:bs + 1].copy_(indptr_host, non_blocking=True)
        plans.once((PLAN_TAG, "graph rails", window), fill_graph_rails)
        wrapper = self._wrappers.get((key, bs))
        first = wrapper is None
        if first:
            wrapper = self._wrappers[(key, bs)] = self._new_wrapper(key[2], key[3], graph, bs)
        if first or self._fast_plan is None:  # the full plan builds FlashInfer's module for the wrapper
            self._plan(wrapper, indptr_host, graph.indices[:nnz], key)
        else:
            self._plan_replay(wrapper, indptr_host, graph, bs, nnz, key)
        plans.get(key, lambda: wrapper)

    def decode(self, q: torch.Tensor, kv: PagedKV, rails: KVRails, params: AttentionParams, plans) -> torch.Tensor:
        """``q [B, Hq, D]`` -> ``[B, Hq, D]`` in q's dtype. The caller has checked the inputs and ``why_not``."""
        key = self.plan_key(params.window, q.shape[1], kv.num_kv_heads, kv.head_dim, q.dtype, params)
        wrapper = plans.get(key, lambda: self._plan_eager(key, rails))
        out = wrapper.run(q.contiguous(), (kv.k_buffer.unsqueeze(1), kv.v_buffer.unsqueeze(1)))
        self.served = True
        return out
