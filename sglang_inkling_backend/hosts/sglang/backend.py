"""``InklingAttnBackend``: SGLang's ``AttentionBackend`` for ``--attention-backend inkling``.

This module only adapts SGLang's objects: the per-layer record comes from ``layers`` (built once, here, at
construction), the keys' maps from ``metadata``, the call's parameters from ``call_args``, the pool views from the
core's ``kv_views`` and the work from the core's ``routes`` (torch reference or Triton, chosen once here).

What SGLang expects of a backend and where it is met:
- ``token_to_kv_pool`` / ``req_to_token_pool`` attributes (read by models through the forward context);
- ``init_forward_metadata`` (eager), ``forward_decode`` / ``forward_extend`` with ``**kwargs``;
- decode CUDA graphs: ``init_cuda_graph_state`` allocates ``DecodeGraphBuffers``,
  ``init_forward_metadata_out_graph`` refills them in place (capture and replay), ``get_cuda_graph_seq_len_fill_value``
  is 1 (padded rows read slot 0, the padding sink); only the Triton route is capturable, and the resolution hook
  turns decode graphs off otherwise;
- a speculative target's graphs (TARGET_VERIFY, ``D`` drafts per request): ``VerifyGraphBuffers`` in place of the
  decode buffers, and ``verify_mask`` (its tree mask as SGLang's QLEN_ONLY ``VerifyMask``: EAGLE writes its trees
  there); the resolution hook drops these graphs with ``INKLING_VERIFY_GRAPHS=0`` (hooks.py);
- ``forward_metadata.swa_out_cache_loc`` (the in-tree Inkling model reads it).
The CPU graph runner (``--enable-torch-compile`` on CPU): its duck-typed hooks are implemented, and attention runs
eagerly inside the compiled model.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Optional

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

from sglang_inkling_backend import checks, kv_formats, kv_views, layer_step, mxfp8
from sglang_inkling_backend.attention_inputs import FLOAT_KV_DTYPES
from sglang_inkling_backend.checks import UnsupportedFeature
from sglang_inkling_backend.hosts.sglang import call_args
from sglang_inkling_backend.hosts.sglang.cache_dtypes import dtype_format
from sglang_inkling_backend.hosts.sglang.layers import layer_plan_of, radix_layers
from sglang_inkling_backend.hosts.sglang.metadata import (DecodeGraphBuffers, InklingForwardMetadata,
                                                          VerifyGraphBuffers, build_forward_metadata)
from sglang_inkling_backend.hosts.sglang.pool import InklingMHATokenToKVPool
from sglang_inkling_backend.hosts.sglang.spec_verify import draft_count, spec_verify_of
from sglang_inkling_backend.hosts.sglang.version import check_sglang_version
from sglang_inkling_backend.layer_plan import LayerSpec, attention_params
from sglang_inkling_backend.route_protocol import Route
from sglang_inkling_backend.routes import choose_route

logger = logging.getLogger(__name__)


def leaf_pools(pool) -> list:
    """The per-layer pools inside SGLang's composite pools (SWA, hybrid linear)."""
    leaves = [p for p in (getattr(pool, "full_kv_pool", None), getattr(pool, "swa_kv_pool", None)) if p is not None]
    return leaves or [pool]


def kv_format_of(pool, kv_cache_dtype: torch.dtype) -> kv_formats.KVFormat:
    formats = {p.kv_format for p in leaf_pools(pool) if isinstance(p, InklingMHATokenToKVPool)}
    if len(formats) == 1:
        return formats.pop()
    if formats:
        raise ValueError(f"inkling: the KV pool mixes formats {sorted(formats)}")
    # Not our pool (its hook did not run): only an unquantized SGLang pool can be read as it is.
    kv_format = dtype_format(kv_cache_dtype)
    if kv_format is None or kv_format.quantized:
        raise ValueError(f"inkling: the KV pool {type(pool).__name__} is not the inkling pool and holds "
                         f"{kv_cache_dtype}; quantized KV needs the inkling pool (was the plugin's pool hook applied?)")
    return kv_format


def check_pool_page_size(pool, page_size) -> None:
    """The runner's page size (what its allocator hands out and ``decode_page_size`` plans pages with) must be each of
    this backend's pools' own: an MXFP8 pool places its scale bytes by its page (SGLang's interleaved layout at 128).
    Refused at construction, before any forward writes."""
    for leaf in leaf_pools(pool):
        own = getattr(leaf, "page_size", None) if isinstance(leaf, InklingMHATokenToKVPool) else None
        if own is not None and own != page_size:
            raise ValueError(f"model_runner.page_size is {page_size} but the {leaf.kv_format} KV pool "
                             f"{type(leaf).__name__} was built with page size {own}; they must be equal (an MXFP8 "
                             f"pool lays out its scales by its page)")


def check_swa_placement(plan, layers_mapping) -> None:
    """SGLang's hybrid SWA pool places layers by the model config's SWA layer list; the record places them by each
    layer's own window. Refuse at start-up where they disagree (a windowed layer's window rail is translated to the
    SWA sub-pool, a full layer's is not)."""
    for layer_id in plan.attention_layer_ids:
        placed = layers_mapping.get(layer_id)
        windowed = plan.window(layer_id) is not None
        if placed is None or bool(placed[1]) != windowed:
            raise UnsupportedFeature(
                f"inkling: layer {layer_id} is {'windowed' if windowed else 'full attention'} but SGLang's hybrid "
                f"SWA pool places it {'nowhere' if placed is None else ('in the SWA' if placed[1] else 'in the full')}"
                f" sub-pool; serve this model with --disable-hybrid-swa-memory")


def verify_draft_len_of(model_runner) -> Optional[int]:
    """A speculative target's drafts per verify step: SGLang 0.5.23's workers take ``spec_info.draft_token_num`` from
    the published spec config (``get_spec().speculative_num_draft_tokens``, e.g. ngram_worker.py:99), which is
    ``--speculative-num-draft-tokens`` after SGLang's own adjustments; the server argument where none is published
    (a runner built outside a server). None where SGLang left it unset: no verify partials are sized for."""
    from sglang.srt.runtime_context import get_spec

    try:
        draft_len = getattr(get_spec(), "speculative_num_draft_tokens", None)
    except ValueError:  # "config namespace 'spec' not published"
        draft_len = getattr(getattr(model_runner, "server_args", None), "speculative_num_draft_tokens", None)
    if not checks.is_int(draft_len) or draft_len < 1:
        return None
    return draft_len


WRITE_SLOTS_NAME = "out_cache_loc (the step's write slots)"


class InklingAttnBackend(AttentionBackend):
    """Paged attention over bf16 / per-tensor fp8 / MXFP8 KV, with per-layer sliding windows and relative bias."""

    def __init__(self, model_runner):
        super().__init__()
        check_sglang_version()
        self.device = checks.require_device(model_runner.device, "model_runner.device")
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.model_dtype = model_runner.dtype
        self.page_size = model_runner.page_size
        self.kv_cache_dtype = model_runner.kv_cache_dtype
        self.kv_format = kv_format_of(self.token_to_kv_pool, self.kv_cache_dtype)
        check_pool_page_size(self.token_to_kv_pool, self.page_size)
        self.is_swa_pool = isinstance(self.token_to_kv_pool, SWAKVPool)
        self.max_context_len = self.req_to_token_pool.req_to_token.shape[1]
        model_config = model_runner.model_config
        if getattr(model_config, "is_encoder_decoder", False):
            raise ValueError("--attention-backend inkling serves decoder-only models; this one is encoder-decoder")
        # The per-layer record, built once: every per-layer fact on the serving path comes from here.
        self.layer_plan = layer_plan_of(radix_layers(getattr(model_runner, "model", None)))
        if self.is_swa_pool:
            check_swa_placement(self.layer_plan, self.token_to_kv_pool.layers_mapping)
        self.windows = {self.layer_plan.window(i) for i in self.layer_plan.windowed_layer_ids}
        # The slots req_to_token indexes: a full-attention layer's buffer (None when every layer is windowed in a
        # hybrid pool, whose rails are translated instead); checked against each eager step's entries.
        full = [i for i in self.layer_plan.attention_layer_ids if self.layer_plan.window(i) is None]
        self.req_to_token_slots = self.token_to_kv_pool.get_key_buffer(full[0]).shape[0] if full else None
        # A speculative target's CUDA graphs are verify steps (SGLang's decode graph runner captures TARGET_VERIFY)
        spec_algorithm = getattr(model_runner, "spec_algorithm", None)
        self.speculative_target = (spec_algorithm is not None and bool(spec_algorithm.is_speculative())
                                   and not getattr(model_runner, "is_draft_worker", False))
        # D, each verify step's drafts per request: the workspace holds a split verify launch's partials too
        self.verify_draft_len = verify_draft_len_of(model_runner) if self.speculative_target else None
        head_dims = {self.layer_plan.spec(i).head_dim for i in self.layer_plan.attention_layer_ids}
        self.use_route(choose_route(self.device, head_dims))
        self.forward_metadata: Optional[InklingForwardMetadata] = None
        # Eager stores of float K/V go straight to the pool's buffers (kv_views.store_kv_unchecked, as a graph step
        # stores), their slots checked once per step, on one pool whose writes need no translation (not hybrid, no
        # physical-location plan); else through SGLang's pool interface, which checks them per layer
        self._direct_store = (not self.is_swa_pool and self.req_to_token_slots is not None
                              and not getattr(self.token_to_kv_pool, "requires_physical_write_loc", False))
        self._layer_kv: dict = {}  # layer id -> its PagedKV over the pool's buffers (rebuilt if they change)
        self._layer_params: dict = {}  # layer id -> its AttentionParams for calls without per-call tensors
        self._graph_buffers: Optional[DecodeGraphBuffers] = None
        self._verify_buffers: Optional[VerifyGraphBuffers] = None
        self._verify_mask = None  # SGLang's VerifyMask over _verify_buffers.tree_mask
        self._notes: set = set()  # the log lines said once
        # an extend's own keys from the forward's K/V: unrounded over a quantized cache, and over a bf16 one (which
        # holds the same values) without gathering them back
        self.extend_new_keys = layer_step.extend_new_keys_setting()
        logger.info("inkling: backend ready: %s KV, route %s, windows %s, %s pool, extend reads its new keys from the "
                    "%s", self.kv_format, self.route.name, sorted(self.windows) or "none",
                    type(self.token_to_kv_pool).__name__, self.extend_new_keys)
        from sglang_inkling_backend.hosts.sglang import inkling_model

        inkling_model.install_seam_if_loaded()

    def use_route(self, route: Route) -> None:
        """Serve through ``route`` (chosen by ``routes.choose_route`` at construction; tests pass the GPU route on
        the CPU), with the decode key map and the workspace that route reads."""
        self.route = route
        for pool in leaf_pools(self.token_to_kv_pool):  # eager MXFP8 writes through the route's fused store
            if isinstance(pool, InklingMHATokenToKVPool) and pool.core is not None:
                pool.core.fused_store = route.fused_store
        # Decode reads a page table where the route takes one and the pool hands out whole pages: SGLang's paged
        # allocator gives every request whole pages (the contract SGLang's own MXFP8 decode, FA4, relies on too),
        # and an MXFP8 pool is always paged (page 128, forced by hooks.py).
        self.decode_page_size = (self.page_size if self.route.reads_page_tables and self.kv_format.block_scaled
                                 and self.page_size % 16 == 0 else None)
        # The split-KV scratch of every decode plan, allocated once for the largest batch and context (plans are
        # views of it, so capture and replay need nothing else).
        self.attention_specs = [self.layer_plan.spec(i) for i in self.layer_plan.attention_layer_ids]
        # Layers that plan alike, planned once per eager step (init_forward_metadata): each group's first layer, and
        # each layer's group by layer id. A decode plan depends on the window, heads, head_dim and the pool's slots;
        # an extend plan (FlashInfer's) also holds the softmax scale, cap and per-tensor scales.
        def decode_key(spec, layer_id):
            return (spec.window, spec.num_q_heads, spec.num_kv_heads, spec.head_dim,
                    self.token_to_kv_pool.get_key_buffer(layer_id).shape[0])

        self.decode_group_of_layer, self.decode_group_leaders = self._group_layers(decode_key)
        self.extend_group_of_layer, self.extend_group_leaders = self._group_layers(
            lambda spec, layer_id: decode_key(spec, layer_id) + (spec.scale, spec.logit_cap, spec.k_scale,
                                                                 spec.v_scale))
        self.workspace = self.route.make_workspace(
            max_batch=self.req_to_token_pool.req_to_token.shape[0], max_seq_len=self.max_context_len,
            geometries={(s.num_q_heads, s.num_kv_heads, s.head_dim) for s in self.attention_specs},
            device=self.device, verify_draft_len=self.verify_draft_len)

    def _group_layers(self, key_of) -> tuple[list, list]:
        """``(group_of_layer, leaders)``: the attention layers grouped by ``key_of(spec, layer_id)``, each layer's
        group index by layer id (None for a layer without attention) and each group's first layer."""
        groups: dict = {}
        group_of_layer: list = [None] * (max(self.layer_plan.attention_layer_ids, default=-1) + 1)
        leaders: list = []
        for spec, layer_id in zip(self.attention_specs, self.layer_plan.attention_layer_ids):
            key = key_of(spec, layer_id)
            if key not in groups:
                groups[key] = len(leaders)
                leaders.append(layer_id)
            group_of_layer[layer_id] = groups[key]
        return group_of_layer, leaders

    # --- metadata ----------------------------------------------------------------------------------------------
    def _full_to_swa(self) -> Optional[torch.Tensor]:
        if not self.is_swa_pool:
            return None
        mapping = self.token_to_kv_pool.full_to_swa_index_mapping
        if mapping is None:
            raise RuntimeError("inkling: the SWA pool has no full->SWA index mapping registered")
        return mapping

    @staticmethod
    def _check_mode(forward_mode) -> None:
        if forward_mode.is_draft_extend_v2():
            raise UnsupportedFeature("--attention-backend inkling does not support speculative decoding's draft "
                                     f"extend (forward mode {forward_mode.name})")
        if forward_mode.is_dllm_extend():
            raise UnsupportedFeature("--attention-backend inkling does not support diffusion LLM extend")

    def init_forward_metadata(self, forward_batch):
        mode = forward_batch.forward_mode
        if mode.is_idle():
            self.forward_metadata = None
            return
        self._check_mode(mode)
        r2t = self.req_to_token_pool.req_to_token
        extend_seq_lens = None if mode.is_decode() else forward_batch.extend_seq_lens
        seq_lens = forward_batch.seq_lens
        seq_lens_cpu = getattr(forward_batch, "seq_lens_cpu", None)
        verify = None
        if mode.is_target_verify():
            # An extend of D draft tokens per request over its seq_lens cached keys (SGLang's seq_lens exclude them)
            host = seq_lens_cpu if seq_lens_cpu is not None else seq_lens.cpu()
            spec_info = forward_batch.spec_info
            buffers = self._verify_buffers
            if buffers is not None and buffers.owns_mask(getattr(spec_info, "custom_mask", None)):
                # EAGLE wrote this batch's trees into the graph buffer (verify_mask), from its start
                n = host.numel() * draft_count(spec_info) ** 2
                spec_info = SimpleNamespace(draft_token_num=spec_info.draft_token_num, positions=spec_info.positions,
                                            custom_mask=buffers.tree_mask[:n])
            verify = spec_verify_of(spec_info, host)
            d = verify.draft_lens[0]  # spec_info.draft_token_num, the same for every request
            seq_lens = seq_lens + d
            seq_lens_cpu = host + d
            extend_seq_lens = torch.full_like(seq_lens, d)
        max_seq_len = int((seq_lens_cpu if seq_lens_cpu is not None else seq_lens).max())
        md = build_forward_metadata(
            r2t, forward_batch.req_pool_indices, seq_lens, extend_seq_lens=extend_seq_lens,
            windows=self.windows, full_to_swa=self._full_to_swa(), out_cache_loc=forward_batch.out_cache_loc,
            page_size=self.decode_page_size, max_seq_len=max_seq_len, num_slots=self.req_to_token_slots)
        md.verify = verify
        if self._direct_store and forward_batch.out_cache_loc is not None:
            # Every layer of the step writes these slots: checked here once (one device read), not per layer; under
            # SGLang's breakable prefill graph each layer sees a new view of them, with the same values.
            loc = checks.require_slots_once(forward_batch.out_cache_loc, WRITE_SLOTS_NAME, self.req_to_token_slots,
                                            distinct=True)
            md.checked_write_slots = loc.numel()
        if forward_batch.out_cache_loc is not None:
            md.built_for = (md.batch_size, forward_batch.out_cache_loc.numel())
        if md.is_decode and not md.graph and verify is None:
            md.decode_groups = self._plan_decode_groups(md)
        elif not md.is_decode and verify is None and md.built_for is not None:
            md.extend_groups = self._plan_extend_groups(md, rows=md.built_for[1])
        self.forward_metadata = md

    def _plan_decode_groups(self, md: InklingForwardMetadata) -> list:
        """An eager decode step's plan per layer group (``Route.plan_decode_group``; None for a group whose calls
        plan themselves), made here once instead of by each group's first layer."""
        plans = []
        for layer_id in self.decode_group_leaders:
            spec = self.layer_plan.attention_spec(layer_id)
            plans.append(self.route.plan_decode_group(
                self._paged_kv(layer_id, spec), md.decode_keys(spec.window, self.route.reads_page_tables),
                attention_params(spec, rows=md.batch_size), num_q_heads=spec.num_q_heads, batch=md.batch_size,
                max_seq_len=md.max_seq_len, plans=md.plans, workspace=self.workspace))
        return plans

    def _plan_extend_groups(self, md: InklingForwardMetadata, rows: int) -> list:
        """An eager extend step's plan per layer group (``Route.plan_extend_group``; None for a group whose calls
        plan themselves), made here once instead of by each group's first layer."""
        plans = []
        forward_rows = self.extend_new_keys == "forward"
        for layer_id in self.extend_group_leaders:
            spec = self.layer_plan.attention_spec(layer_id)
            rails, qo_indptr = md.extend_keys(spec.window)
            plans.append(self.route.plan_extend_group(
                self._paged_kv(layer_id, spec), rails, qo_indptr, attention_params(spec, rows=rows),
                num_q_heads=spec.num_q_heads, rows=rows, q_dtype=self.model_dtype, forward_rows=forward_rows,
                plans=md.plans))
        return plans

    # --- CUDA graphs (decode) -----------------------------------------------------------------------------------
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        if not self.route.graph_capturable:
            raise RuntimeError(f"inkling: decode CUDA graphs need the Triton route; this backend runs the "
                               f"{self.route.name} route. Pass --disable-cuda-graph")
        if self.speculative_target:
            # SGLang sizes a target's verify graphs max_bs x D tokens (decode_cuda_graph_runner: max_num_token)
            draft_len, rest = divmod(max_num_tokens, max_bs)
            if rest or draft_len < 1:
                raise ValueError(f"inkling: a speculative target's CUDA graphs need max_num_tokens = max_bs x D (the "
                                 f"draft tokens per request), got {max_num_tokens} for max_bs {max_bs}")
            self._verify_buffers = VerifyGraphBuffers(max_bs, draft_len, self.max_context_len, self.windows,
                                                      self.device, swa=self.is_swa_pool)
            from sglang.srt.layers.attention.verify_mask import VerifyMask
            from sglang.srt.speculative.eagle_utils import TreeMaskMode
            self._verify_mask = VerifyMask(buffer=self._verify_buffers.tree_mask, mode=TreeMaskMode.QLEN_ONLY,
                                           max_bs=max_bs, is_read=True)
            logger.info("inkling: verify CUDA graphs: up to %d requests of %d draft tokens", max_bs, draft_len)
            return
        self._graph_buffers = DecodeGraphBuffers(max_bs, self.max_context_len, self.windows, self.device,
                                                 swa=self.is_swa_pool, page_size=self.decode_page_size)

    @property
    def verify_mask(self):
        """The verify graphs' tree mask as SGLang's ``VerifyMask`` (QLEN_ONLY: ``[D, D]`` per request): EAGLE's
        tree kernel writes each batch's trees there in place (eagle_worker_common), so a replay copies none. None
        without verify graphs (EAGLE then sends its FULL-layout mask)."""
        return self._verify_mask

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        mode = forward_batch.forward_mode
        if mode.is_target_verify():
            self.forward_metadata = self._verify_graph_metadata(forward_batch, in_capture)
            return
        if self._graph_buffers is None:
            raise RuntimeError("inkling: init_cuda_graph_state was not called before graph metadata")
        if not mode.is_decode_or_idle():
            raise UnsupportedFeature(f"inkling: CUDA graphs cover decode and target verify, got forward mode "
                                     f"{mode.name}")
        bs = forward_batch.batch_size
        out_cache_loc = None
        if self.is_swa_pool:
            # At replay SGLang's view holds bs padded rows but only the real rows' out_cache_loc.
            out_cache_loc = forward_batch.out_cache_loc
            real = bs - int(getattr(forward_batch, "num_padding", 0) or 0)
            if out_cache_loc is None or out_cache_loc.numel() not in (real, bs):
                got = None if out_cache_loc is None else tuple(out_cache_loc.shape)
                raise ValueError(f"inkling: decode graph metadata needs out_cache_loc for the {real} real requests "
                                 f"(or all {bs} rows) with a hybrid SWA pool, got {got}")
            out_cache_loc = out_cache_loc[:real]
        # SGLang's padded seq_lens_cpu (padding rows 1, as on the device): the maps are built from it without a
        # device read, which would stall the GPU before every replay (one sync when a batch has none).
        seq_lens_cpu = getattr(forward_batch, "seq_lens_cpu", None)
        host = seq_lens_cpu[:bs] if seq_lens_cpu is not None else forward_batch.seq_lens[:bs].cpu()
        md = self._graph_buffers.refill(
            self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices[:bs], forward_batch.seq_lens[:bs],
            full_to_swa=self._full_to_swa(), out_cache_loc=out_cache_loc, seq_lens_host=host,
            gather_slots=self.route.gather_rail_slots)
        md.graph = True
        md.max_seq_len = self.max_context_len
        # what the route cannot plan inside the graph (the GPU route: FlashInfer's decode)
        self.route.plan_graph_step(md, self.attention_specs, host, kv_format=self.kv_format,
                                   max_bs=self._graph_buffers.max_bs, max_seq_len=self.max_context_len)
        self.forward_metadata = md

    def _verify_graph_metadata(self, forward_batch, in_capture: bool) -> InklingForwardMetadata:
        """A TARGET_VERIFY graph's metadata: SGLang's padded view (``batch_size`` rows, ``num_padding`` of them
        padding; at replay ``out_cache_loc`` and ``spec_info`` are the live batch's) refilled into the verify
        buffers. At capture the runner's mask is all True and sized for its largest batch: the trees are left as
        they are (the capture's outputs are discarded)."""
        buffers = self._verify_buffers
        if buffers is None:
            raise RuntimeError("inkling: init_cuda_graph_state was not called for a speculative target before "
                               "its verify graph metadata")
        bs = forward_batch.batch_size
        real = bs - int(getattr(forward_batch, "num_padding", 0) or 0)
        spec_info = forward_batch.spec_info
        d = draft_count(spec_info)
        if d != buffers.draft_len:
            raise ValueError(f"inkling: spec_info.draft_token_num is {d}; the verify graphs were built for "
                             f"{buffers.draft_len} draft tokens per request")
        mask = None if in_capture else getattr(spec_info, "custom_mask", None)
        if mask is None and not in_capture:
            raise ValueError("inkling: a verify graph replay needs spec_info.custom_mask (the draft trees)")
        out_cache_loc = None
        if self.is_swa_pool:
            out_cache_loc = forward_batch.out_cache_loc
            if out_cache_loc is None or out_cache_loc.numel() not in (real * d, bs * d):
                got = None if out_cache_loc is None else tuple(out_cache_loc.shape)
                raise ValueError(f"inkling: verify graph metadata needs out_cache_loc for the {real} x {d} real draft "
                                 f"tokens (or all {bs} x {d}) with a hybrid SWA pool, got {got}")
            out_cache_loc = out_cache_loc[:real * d]
        seq_lens_cpu = getattr(forward_batch, "seq_lens_cpu", None)
        host = seq_lens_cpu[:bs] if seq_lens_cpu is not None else forward_batch.seq_lens[:bs].cpu()
        return buffers.refill(self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices[:bs],
                              forward_batch.seq_lens[:bs], forward_batch.positions, mask, num_real=real,
                              seq_lens_host=host, full_to_swa=self._full_to_swa(), out_cache_loc=out_cache_loc,
                              gather_slots=self.route.gather_rail_slots)

    # --- CPU graph runner (--enable-torch-compile on CPU) --------------------------------------------------------
    # SGLang's CPUGraphRunner torch.compiles the model's decode forward per batch size and calls these duck-typed
    # hooks. Attention stays eager inside the compiled model (``_attend`` is torch.compiler.disable'd): its rails
    # are dynamic per batch, and the torch route loops over requests on the host.
    def init_cpu_graph_state(self, max_bs: int, max_num_tokens: int):
        pass  # metadata is rebuilt eagerly for every replay (the runner calls init_forward_metadata)

    def get_cpu_graph_seq_len_fill_value(self):
        return 1  # padded rows: one key, req_to_token row 0, slot 0 (the padding sink)

    def init_forward_metadata_capture_cpu_graph(self, bs, num_tokens, req_pool_indices, seq_lens, out_cache_loc,
                                                encoder_lens, forward_mode, spec_info):
        if not forward_mode.is_decode():
            raise UnsupportedFeature(f"inkling: the CPU graph runner captures decode only, got {forward_mode.name}")
        if encoder_lens is not None or spec_info is not None:
            raise UnsupportedFeature("inkling: CPU graph capture with encoder lens or speculative info")
        self.init_forward_metadata(SimpleNamespace(
            forward_mode=forward_mode, req_pool_indices=req_pool_indices[:bs], seq_lens=seq_lens[:bs],
            seq_lens_cpu=None, out_cache_loc=out_cache_loc[:num_tokens], extend_seq_lens=None))

    # --- forward -----------------------------------------------------------------------------------------------
    def _layer_spec(self, layer) -> LayerSpec:
        """The layer's record (built at construction); the per-call checks are its tensors' shapes only."""
        return self.layer_plan.attention_spec(layer.layer_id)

    def _paged_kv(self, layer_id: int, spec: LayerSpec):
        """The layer's pool buffers as a PagedKV, built (and checked) on the layer's first call and again only if
        the pool hands out other buffers."""
        pool = self.token_to_kv_pool
        k_buffer = pool.get_key_buffer(layer_id)
        v_buffer = pool.get_value_buffer(layer_id)
        kv = self._layer_kv.get(layer_id)
        if kv is not None and kv.k_buffer is k_buffer and kv.v_buffer is v_buffer:
            return kv
        kv = self._layer_kv[layer_id] = self._build_paged_kv(layer_id, spec, k_buffer, v_buffer)
        return kv

    def _build_paged_kv(self, layer_id: int, spec: LayerSpec, k_buffer, v_buffer):
        pool = self.token_to_kv_pool
        sfk = sfv = None
        if self.kv_format.block_scaled:
            sfk, sfv = pool.get_kv_scale_buffer(layer_id)
        return kv_views.paged_kv(self.kv_format, k_buffer, v_buffer, page_size=self.page_size, k_scales=sfk,
                                 v_scales=sfv, k_scale=spec.k_scale, v_scale=spec.v_scale)

    def _store(self, layer, spec: LayerSpec, forward_batch, k, v, kwargs) -> None:
        md = self.forward_metadata
        k_desc, v_desc = kwargs.get("k_descale"), kwargs.get("v_descale")
        if (k_desc is None) != (v_desc is None):
            raise ValueError("k_descale and v_descale must be given together (pre-quantized MXFP8 K/V)")
        if k_desc is not None and k.dtype != mxfp8.DATA_DTYPE:
            raise ValueError(f"k_descale/v_descale come with float8_e4m3fn K/V, got {k.dtype}")
        if md.graph:
            in_swa = self.is_swa_pool and spec.window is not None
            loc = md.swa_out_cache_loc if in_swa else forward_batch.out_cache_loc
            kv_views.store_kv_unchecked(self._paged_kv(layer.layer_id, spec), loc, k, v, k_block_scales=k_desc,
                                        v_block_scales=v_desc, fused_store=self.route.fused_store)
            return
        n, hkv, d = forward_batch.out_cache_loc.numel(), spec.num_kv_heads, spec.head_dim
        for name, t in (("k", k), ("v", v)):
            if isinstance(t, torch.Tensor):
                checks.require_tensor(t, name, f"one [{hkv}, {d}] row per new token")
            if not isinstance(t, torch.Tensor) or t.numel() != n * hkv * d or (t.dim() and t.shape[0] != n):
                desc = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must hold one [{hkv}, {d}] row per new token ({n}, out_cache_loc's "
                                 f"length), got {desc}")
        if k_desc is None and (k.dtype not in FLOAT_KV_DTYPES or v.dtype not in FLOAT_KV_DTYPES):
            raise TypeError(f"k and v must be bf16/fp16/fp32 (or float8_e4m3fn with k_descale/v_descale: MXFP8 "
                            f"already quantized), got {k.dtype} and {v.dtype}")
        k, v = k.reshape(n, hkv, d), v.reshape(n, hkv, d)
        if k_desc is None and md.checked_write_slots == n:
            # K/V are bf16/fp16/fp32 rows of the layer's shape; the slots were checked in init_forward_metadata,
            # and this is a lookup unless out_cache_loc is another tensor or was written since (then one read)
            checks.require_slots_once(forward_batch.out_cache_loc, WRITE_SLOTS_NAME, self.req_to_token_slots,
                                      distinct=True)
            kv_views.store_kv_unchecked(self._paged_kv(layer.layer_id, spec), forward_batch.out_cache_loc, k, v,
                                        fused_store=self.route.fused_store)
            return
        loc = KVWriteLoc.for_layer(forward_batch, layer, swa_loc=md.swa_out_cache_loc)
        if k_desc is not None:
            self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v, k_desc, v_desc)
        elif self.kv_format.tensor_scaled:
            self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v, spec.k_scale, spec.v_scale)
        else:
            self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v, None, None)

    @torch.compiler.disable
    def _attend(self, decode: bool, q, k, v, layer, forward_batch, save_kv_cache, kwargs):
        md = self.forward_metadata
        if md is None or md.is_decode != decode:
            raise RuntimeError(f"inkling: forward_{'decode' if decode else 'extend'} without matching metadata "
                               "(init_forward_metadata was not called for this batch)")
        spec = self._layer_spec(layer)
        rows = q.shape[0]
        if call_args.layer_params_only(kwargs):  # the layer's parameters, made on its first call
            params = self._layer_params.get(layer.layer_id)
            if params is None:
                params = self._layer_params[layer.layer_id] = call_args.attention_params(spec, kwargs, rows)
        else:
            params = call_args.attention_params(spec, kwargs, rows)
        # The query and K/V are checked before the store writes: a bad call leaves the pool as it was.
        q3 = layer_step.prepare_query(q, spec, self.route, self.model_dtype, kwargs.get("q_descale"))
        new_tokens = forward_batch.out_cache_loc.numel()
        if not md.graph and rows != new_tokens:
            raise ValueError(f"q must have one row per new token of the batch ({new_tokens}, out_cache_loc's "
                             f"length), got {rows}")
        batch = getattr(forward_batch, "batch_size", md.batch_size)
        if not md.graph and md.built_for is not None and md.built_for != (batch, new_tokens):
            raise RuntimeError(f"inkling: forward_{'decode' if decode else 'extend'} for a batch of "
                               f"{batch} requests and {new_tokens} new tokens, but the step's "
                               f"metadata was built for {md.built_for[0]} and {md.built_for[1]}: "
                               "init_forward_metadata was not called for this batch")
        if save_kv_cache and (k is None) != (v is None):
            raise ValueError("k and v must be given together (save_kv_cache=True stores both)")
        if save_kv_cache and k is not None:
            self._store(layer, spec, forward_batch, k, v, kwargs)
        forward_kv = None
        # A verify step reads every key from the cache, its drafts' as stored, as the decode steps it stands in for
        # read them (the same values over a 16-bit pool; over an 8-bit one, what decoding those tokens would read)
        if not decode and self.extend_new_keys == "forward" and md.verify is None:
            forward_kv = self._forward_kv(k, v, rows, spec)
        decode_group = md.decode_groups[self.decode_group_of_layer[layer.layer_id]] if md.decode_groups else None
        extend_group = md.extend_groups[self.extend_group_of_layer[layer.layer_id]] if md.extend_groups else None
        out = layer_step.attend(self.route, spec, q3, self._paged_kv(layer.layer_id, spec), md,
                                lambda first, last: params, self.workspace, forward_kv=forward_kv,
                                verify=md.verify, decode_group=decode_group, extend_group=extend_group)
        return out.to(self.model_dtype).reshape(rows, spec.num_q_heads * spec.head_dim)

    def _forward_kv(self, k, v, rows: int, spec: LayerSpec):
        """The call's K/V as ``[rows, Hkv, D]`` when they are the forward's float values (the model passes K/V
        already quantized, or none, when it stored them itself in e4m3: the extend then reads the cache)."""
        if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.is_floating_point()
                and v.is_floating_point() and k.dtype != mxfp8.DATA_DTYPE and v.dtype != mxfp8.DATA_DTYPE):
            if "no float K/V" not in self._notes:
                self._notes.add("no float K/V")
                logger.info("inkling: an extend call without the forward's float K/V reads its new keys from the "
                            "cache (k: %s)", None if k is None else k.dtype)
            return None
        shape = (rows, spec.num_kv_heads, spec.head_dim)
        return k.reshape(shape), v.reshape(shape)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self._attend(True, q, k, v, layer, forward_batch, save_kv_cache, kwargs)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        self._check_mode(forward_batch.forward_mode)
        return self._attend(False, q, k, v, layer, forward_batch, save_kv_cache, kwargs)

    def support_triton(self):
        return self.route.runs_triton
