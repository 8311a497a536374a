"""One layer's attention over vLLM's block cache, host-free (only torch and the core), so the GPU tests run exactly
this code without vLLM: the per-layer record, the layer's cache view, the K/V store at vLLM's slot mapping, and
attention for a batch (decodes through the route's decode, the rest through its extend). ``backend.InklingVllmImpl``
adapts vLLM's calls to it."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

import torch

from sglang_inkling_backend import checks, kv_formats, kv_views, layer_step
from sglang_inkling_backend.hosts.vllm.batch import VllmBatch, padded_slots
from sglang_inkling_backend.hosts.vllm.block_cache import BlockCacheLayout
from sglang_inkling_backend.layer_plan import LayerSpec, attention_params
from sglang_inkling_backend.attention_inputs import PagedKV


def _require_token_rows(t, name: str, n: int, counted_by: str, heads: int, head_dim: int) -> None:
    """``t`` a floating-point ``[tokens >= n, heads, head_dim]`` or ``[tokens >= n, heads * head_dim]`` tensor (vLLM
    pads its token buffers past the step's ``n`` rows, which ``counted_by`` names)."""
    if not checks.require_tensor(t, name, "a floating-point tensor").is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    width = heads * head_dim
    if t.dim() not in (2, 3) or t.shape[0] < n or math.prod(t.shape[1:]) != width:
        raise ValueError(f"{name} must be [tokens >= {n} ({counted_by}), {heads}, {head_dim}] or [tokens, {width}], "
                         f"got {tuple(t.shape)}")


class LayerAttention:
    # This step's slot mappings, checked (in the cache or -1, no slot twice) and padded (-1 -> the null block), by
    # (pointer, version, length, cache slots, device): every layer of a step stores at its group's one mapping, so it
    # is read back once per step (a device read is a sync) and padded once. Emptied by new_step, which the metadata
    # builder calls first every step: vLLM refills its persistent mapping buffer in place, by a kernel on a GPU (no
    # version bump), once per step. Class state because vLLM hands do_kv_cache_update no step metadata.
    _step_slots: dict = {}

    @classmethod
    def new_step(cls) -> None:
        cls._step_slots = {}

    def __init__(self, spec: LayerSpec, kv_format: kv_formats.KVFormat | str, model_dtype: torch.dtype,
                 sinks: Optional[torch.Tensor] = None):
        if not isinstance(spec, LayerSpec):
            raise TypeError(f"spec must be a LayerSpec, got {type(spec).__name__}")
        kv_format = kv_formats.as_kv_format(kv_format)
        if not isinstance(model_dtype, torch.dtype) or not model_dtype.is_floating_point:
            raise TypeError(f"model_dtype must be a floating-point torch.dtype, got {model_dtype!r}")
        if sinks is not None:
            if isinstance(sinks, torch.Tensor):
                checks.require_tensor(sinks, "sinks", f"a floating-point tensor of shape [{spec.num_q_heads}]")
            if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point() or \
                    tuple(sinks.shape) != (spec.num_q_heads,):
                desc = f"{sinks.dtype} {tuple(sinks.shape)}" if isinstance(sinks, torch.Tensor) \
                    else type(sinks).__name__
                raise ValueError(f"sinks must be a floating-point tensor of shape [{spec.num_q_heads}] (one per "
                                 f"query head), got {desc}")
        self.spec = spec
        self.kv_format = kv_format
        self.model_dtype = model_dtype
        self.sinks = sinks
        self.extend_new_keys = layer_step.extend_new_keys_setting()  # a prefill's own keys from the forward
        self._layouts: dict[int, BlockCacheLayout] = {}
        self._paged: Optional[tuple] = None  # (the kv_cache view's key, its PagedKV): the last view seen

    def bind_fp8_scales(self, k_scale: float, v_scale: float) -> None:
        """The checkpoint's per-tensor fp8 scales, known once weights are loaded (``LayerSpec`` checks them)."""
        k_scale = checks.require_positive_real(k_scale, "k_scale")
        v_scale = checks.require_positive_real(v_scale, "v_scale")
        if (k_scale, v_scale) != (self.spec.k_scale, self.spec.v_scale):
            self.spec = replace(self.spec, k_scale=k_scale, v_scale=v_scale)

    def paged_kv(self, kv_cache: torch.Tensor) -> PagedKV:
        if isinstance(kv_cache, torch.Tensor):
            checks.require_tensor(kv_cache, "kv_cache", "vLLM's 4-D per-layer view [num_blocks, H, N, C]")
        if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() != 4:
            desc = tuple(kv_cache.shape) if isinstance(kv_cache, torch.Tensor) else type(kv_cache).__name__
            raise ValueError(f"kv_cache must be vLLM's 4-D per-layer view [num_blocks, H, N, C], got {desc}")
        # vLLM hands a layer the same view every step: its PagedKV (views of it, checked) is made once. The key
        # holds everything the PagedKV depends on; the PagedKV keeps the view's storage alive, so an equal pointer
        # is the same storage, not a reallocation at the same address.
        key = (kv_cache.data_ptr(), kv_cache.shape, kv_cache.stride(), kv_cache.dtype, kv_cache.device,
               self.spec.k_scale, self.spec.v_scale)
        if self._paged is not None and self._paged[0] == key:
            return self._paged[1]
        block_size = kv_cache.shape[2]
        layout = self._layouts.get(block_size)
        if layout is None:
            layout = self._layouts[block_size] = BlockCacheLayout(self.kv_format, self.spec.num_kv_heads,
                                                                  self.spec.head_dim, block_size)
        kv = layout.paged_kv(kv_cache, k_scale=self.spec.k_scale, v_scale=self.spec.v_scale)
        self._paged = (key, kv)
        return kv

    def store(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
              fused_store=None) -> None:
        """Write the step's K/V at ``slot_mapping`` (one int32/int64 entry per token; -1 is padding, sent to the null
        block; ``key``/``value`` may have more rows, vLLM's padding, which are not written). Every argument is
        checked before the first write; the slots' values too (in the cache or -1, no slot twice) unless a CUDA graph
        is being captured (nothing can be read back then)."""
        checks.require_tensor(slot_mapping, "slot_mapping", "a 1-D int32/int64 tensor of slots")
        if slot_mapping.dtype not in (torch.int32, torch.int64) or slot_mapping.dim() != 1:
            raise TypeError(f"slot_mapping must be a 1-D int32/int64 tensor of slots, got {slot_mapping.dtype} "
                            f"{tuple(slot_mapping.shape)}")
        n = slot_mapping.shape[0]
        for name, t in (("key", key), ("value", value)):
            _require_token_rows(t, name, n, "slot_mapping's entries", self.spec.num_kv_heads, self.spec.head_dim)
        kv = self.paged_kv(kv_cache)
        # a mapping captured into a CUDA graph is neither read (nothing can be read back then) nor memoized (the
        # padded slots must be the graph's own buffer, refilled on every replay)
        capturing = checks.stream_capturing(slot_mapping.device)
        seen = (slot_mapping.data_ptr(), slot_mapping._version, n, kv.num_slots, slot_mapping.device)
        memo = None if capturing else LayerAttention._step_slots.get(seen)
        slots = None if memo is None else memo[1]
        if slots is None:
            slots = padded_slots(slot_mapping)
            if not capturing and n:
                lowest = int(slot_mapping.min())
                if lowest < -1:
                    raise ValueError(f"slot_mapping entries must be slots in [0, {kv.num_slots}) or -1 (padding), "
                                     f"got {lowest}")
                # block 0, vLLM's null block, is the padding sink: never read
                checks.require_slots(slots, "slot_mapping", kv.num_slots, distinct=True,
                                     padding_slots=kv_cache.shape[2])
            if not capturing:  # the mapping is held: no other tensor takes its address while the step lasts
                if len(LayerAttention._step_slots) >= 64:  # a caller without a metadata builder's new_step
                    LayerAttention._step_slots.clear()
                LayerAttention._step_slots[seen] = (slot_mapping, slots)
        kv_views.store_kv_unchecked(kv, slots, key[:n], value[:n], fused_store=fused_store)

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, batch: VllmBatch,
                output: torch.Tensor, key: Optional[torch.Tensor] = None,
                value: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Attention of the batch's ``num_actual_tokens`` query rows into ``output`` (rows past them untouched).
        ``key``/``value``: the step's K/V as the model computed them; over a quantized cache the prefill rows read
        their own new keys from them (``layer_step.forward_rows_keys``; ``INKLING_EXTEND_NEW_KEYS=cache`` reads the
        cache instead)."""
        if not isinstance(batch, VllmBatch):
            raise TypeError(f"batch must be a VllmBatch (the metadata builder's), got {type(batch).__name__}")
        spec, route = self.spec, batch.route
        n = batch.num_actual_tokens
        kv = self.paged_kv(kv_cache)
        if kv_cache.shape[2] != batch.block_size:
            raise ValueError(f"kv_cache blocks must hold the batch's block_size {batch.block_size} tokens, got "
                             f"shape {tuple(kv_cache.shape)}")
        for name, t in (("query", query), ("output", output)):
            _require_token_rows(t, name, n, "num_actual_tokens", spec.num_q_heads, spec.head_dim)
        if not checks.stream_capturing(query.device):
            batch.plans.once(("vLLM batch values", kv.num_slots, spec.window),
                             lambda: batch.check_values(kv_cache.shape[0], spec.window))
        q = layer_step.prepare_query(query[:n], spec, route, self.model_dtype)
        forward_kv = None
        if self.extend_new_keys == "forward" and batch.num_decode_tokens < n and key is not None and value is not None:
            for name, t in (("key", key), ("value", value)):
                _require_token_rows(t, name, n, "num_actual_tokens", spec.num_kv_heads, spec.head_dim)
            shape = (n, spec.num_kv_heads, spec.head_dim)
            forward_kv = (key[:n].reshape(shape), value[:n].reshape(shape))
        # the weights themselves (every kernel reads sinks as float32): AttentionParams checks them finite once per
        # tensor and version; not here at construction, where vLLM has not loaded them yet
        params_of = lambda first, last: attention_params(spec, rows=last - first, sinks=self.sinks)  # noqa: E731
        # Eager: the step's plan per group of layers that plan alike, made by the group's first layer (vLLM's
        # builder sees the layers' specs, not their caches) and shared through the step's plan cache
        decode_group = extend_group = None
        nd = batch.num_decodes
        if not checks.stream_capturing(query.device):
            group_key = self.decode_group_key(kv)
            if nd:
                decode_group = batch.plans.value(("decode group", group_key), lambda: route.plan_decode_group(
                    kv, batch.decode_keys(spec.window, route.reads_page_tables), params_of(0, nd),
                    num_q_heads=spec.num_q_heads, batch=nd, max_seq_len=batch.max_seq_len, plans=batch.plans,
                    workspace=batch.workspace))
            if nd < n:
                group_key += (spec.scale, kv.k_scale, kv.v_scale, forward_kv is not None)
                extend_group = batch.plans.value(("extend group", group_key), lambda: route.plan_extend_group(
                    kv, *batch.extend_keys(spec.window), params_of(nd, n), num_q_heads=spec.num_q_heads,
                    rows=n - nd, q_dtype=q.dtype, forward_rows=forward_kv is not None, plans=batch.plans))
        layer_step.attend(route, spec, q, kv, batch, params_of, batch.workspace,
                          output[:n].view(n, spec.num_q_heads, spec.head_dim), forward_kv=forward_kv,
                          decode_group=decode_group, extend_group=extend_group)
        return output

    def decode_group_key(self, kv: PagedKV) -> tuple:
        """What a decode plan of this layer depends on (window, heads, head_dim, the pool's slots, dtype and
        format) and what decides whether FlashInfer's decode may serve it (sinks, cap): layers with equal keys
        share the step's plan. An extend plan also holds the softmax scale and per-tensor scales (FlashInfer's)."""
        spec = self.spec
        return (spec.window, spec.num_q_heads, spec.num_kv_heads, spec.head_dim, kv.num_slots, kv.k_buffer.dtype,
                kv.kv_format, self.sinks is not None, spec.logit_cap)
