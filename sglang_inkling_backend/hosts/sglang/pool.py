"""SGLang KV pools backed by the core ``InklingKVPool``.

``InklingMHATokenToKVPool`` subclasses SGLang's ``MHATokenToKVPool``, so the allocator, radix cache, ``SWAKVPool``
and every reader of ``k_buffer`` / ``get_key_buffer`` keep working unchanged; only the storage and the write door are
the core's:

- buffers: the core pool's per-layer ``[size + page_size, Hkv, D]`` data (slot 0 the padding sink, as SGLang's) and,
  for MXFP8, its zero-initialised scale buffers in SGLang's layout (interleaved ``[pages, Hkv, 32, page//32, D//32]``
  at page size 128, flat ``[slots, Hkv, D//32]`` otherwise). ``get_kv_scale_buffer`` returns them viewed as
  ``float8_e8m0fnu``, the dtype SGLang's MXFP8 consumers (the Inkling model, FA4) expect;
- ``set_kv_buffer``: bf16 K/V are quantized by the core (MXFP8: SGLang's exact recipe; fp8_e4m3: divided by the
  per-tensor scale, saturating); already-quantized MXFP8 K/V with their block scales (what the Inkling model sends as
  ``k_descale``/``v_descale``) are stored as they are;
- ``move_kv_cache`` / ``get_cpu_copy`` / ``load_cpu_copy`` carry the scale bytes with their data.

One format per class (``inkling_pool_class(fmt)``), so SGLang can build the pool from a class alone (it does inside
``SWAKVPool``).
"""
from __future__ import annotations

import functools
import logging
from typing import Optional

import torch
from sglang.srt.mem_cache.memory_pool import GPU_MEMORY_TYPE_KV_CACHE, MHATokenToKVPool, unwrap_write_loc

from sglang_inkling_backend import checks
from sglang_inkling_backend.checks import UnsupportedFeature
from sglang_inkling_backend.hosts.sglang.cache_dtypes import pool_format
from sglang_inkling_backend.kv_formats import KVFormat, as_kv_format
from sglang_inkling_backend.kv_pool import InklingKVPool
from sglang_inkling_backend.layer_plan import LayerPlan, LayerSpec
from sglang_inkling_backend.scale_layout import INTERLEAVED_PAGE_SIZE

logger = logging.getLogger(__name__)

E8M0 = getattr(torch, "float8_e8m0fnu", None)


# set_kv_buffer's loc is the step's out_cache_loc (its SWA slots for a windowed layer of a hybrid pool)
WRITE_LOC_NAME = "loc (the step's out_cache_loc)"


class InklingMHATokenToKVPool(MHATokenToKVPool):
    """An MHA token-to-KV pool whose storage and writes are the core ``InklingKVPool``'s."""

    KV_FORMAT: KVFormat = KVFormat.BF16

    def __init__(self, size: int, page_size: int, dtype: torch.dtype, head_num: int, head_dim: int,
                 layer_num: int, device: str, enable_memory_saver: bool, v_head_dim: Optional[int] = None, **kwargs):
        if v_head_dim is not None and v_head_dim != head_dim:
            raise ValueError(f"the inkling KV pool needs v_head_dim == head_dim, got {v_head_dim} and {head_dim}")
        if kwargs.get("post_capture_active"):
            raise ValueError("the inkling KV pool does not support post-capture KV backing")
        checks.require_device(device)  # before SGLang's pool sets up anything on it
        super().__init__(size, page_size, dtype, head_num, head_dim, layer_num, device, enable_memory_saver,
                         v_head_dim=v_head_dim, **kwargs)

    # --- storage -----------------------------------------------------------------------------------------------
    def _create_buffers(self):
        if self.head_dim != self.v_head_dim:
            raise ValueError(f"the inkling KV pool needs v_head_dim == head_dim, got {self.v_head_dim} and "
                             f"{self.head_dim}")
        self.core = None
        if self.layer_num:  # a hybrid model's sub-pool may have no layers (e.g. the full side of an all-SWA model)
            spec = LayerSpec(num_q_heads=self.head_num, num_kv_heads=self.head_num, head_dim=self.head_dim)
            plan = LayerPlan([spec] * self.layer_num)
            # Layer ids inside the core pool are local (0 .. layer_num-1); SGLang's are offset by start_layer.
            with self.memory_saver_adapter.region(GPU_MEMORY_TYPE_KV_CACHE):
                self.core = InklingKVPool(plan, size=self.size, page_size=self.page_size, kv_format=self.KV_FORMAT,
                                          device=self.device)
            self.store_dtype = self.core.store_dtype
        self.k_buffer = [self.core.get_key_buffer(i) for i in range(self.layer_num)]
        self.v_buffer = [self.core.get_value_buffer(i) for i in range(self.layer_num)]
        if self.KV_FORMAT.block_scaled:
            scales = [self.core.get_kv_scale_buffer(i) for i in range(self.layer_num)]
            view = (lambda t: t.view(E8M0)) if E8M0 is not None else (lambda t: t)
            self.k_scale_buffer = [view(sfk) for sfk, _ in scales]
            self.v_scale_buffer = [view(sfv) for _, sfv in scales]
            self.mxfp8_sf_interleaved = self.page_size == INTERLEAVED_PAGE_SIZE
        else:
            self.k_scale_buffer = self.v_scale_buffer = None
        self.native_k_scale_buffer = self.native_v_scale_buffer = None
        self.dq_k_buffer = self.dq_v_buffer = None
        self._kv_buffer_descs = self._build_kv_buffer_descs()
        self._init_data_ptrs_and_strides()

    def _mha_scale_buffers(self):
        """Scale buffers as SGLang's device-pool description names them (MXFP8: interleaved at page 128)."""
        if not self.KV_FORMAT.block_scaled:
            return None
        from sglang.srt.mem_cache.device_pool_info import KVScaleBuffers, KVScaleLayout

        return KVScaleBuffers(k=tuple(self.k_scale_buffer), v=tuple(self.v_scale_buffer),
                              layout=KVScaleLayout.MXFP8_INTERLEAVED if self.mxfp8_sf_interleaved
                              else KVScaleLayout.TOKEN)

    @property
    def kv_format(self) -> KVFormat:
        return self.KV_FORMAT

    def _local(self, layer_id: int) -> int:
        local = layer_id - self.start_layer
        if not 0 <= local < self.layer_num:
            raise ValueError(f"layer {layer_id} is not in this pool (layers {self.start_layer}.."
                             f"{self.start_layer + self.layer_num - 1})")
        return local

    def _get_key_buffer(self, layer_id: int):
        return self.k_buffer[self._local(layer_id)]

    def _get_value_buffer(self, layer_id: int):
        return self.v_buffer[self._local(layer_id)]

    def get_kv_scale_buffer(self, layer_id: int):
        """MXFP8 ``(sfk, sfv)`` as ``float8_e8m0fnu`` views, SGLang's dtype (``.view(torch.uint8)`` for bytes)."""
        if not self.KV_FORMAT.block_scaled:
            raise ValueError(f"get_kv_scale_buffer needs an mxfp8 pool, this one is {self.KV_FORMAT}")
        local = self._local(layer_id)
        return self.k_scale_buffer[local], self.v_scale_buffer[local]

    def scale_layout(self, layer_id: int):
        return self.core.scale_layout(self._local(layer_id))

    # --- writes ------------------------------------------------------------------------------------------------
    def set_kv_buffer(self, layer, loc_info, cache_k: torch.Tensor, cache_v: torch.Tensor, k_scale=None,
                      v_scale=None, layer_id_override: Optional[int] = None, dcp_kv_mask=None):
        if dcp_kv_mask is not None:
            raise UnsupportedFeature("the inkling KV pool does not support dcp_kv_mask (decode context parallelism)")
        loc, _, _ = unwrap_write_loc(loc_info)
        self._check_physical_write_loc(loc_info, "set_kv_buffer (inkling)")
        if layer_id_override is None and not hasattr(layer, "layer_id"):
            raise TypeError(f"layer must be SGLang's attention layer (with a layer_id), got {type(layer).__name__}")
        if layer_id_override is not None:
            checks.require_int(layer_id_override, "layer_id_override")
        layer_id = layer_id_override if layer_id_override is not None else layer.layer_id
        local = self._local(layer_id)
        if _is_block_scales(k_scale) or _is_block_scales(v_scale):
            # Already-quantized MXFP8 K/V with one UE8M0 byte per 32 channels (the Inkling model's k/v_descale).
            if not self.KV_FORMAT.block_scaled:
                raise ValueError(f"block scales (k_scale/v_scale tensors of shape [N, Hkv, D//32]) need an mxfp8 "
                                 f"pool, this one is {self.KV_FORMAT}")
            if not (_is_block_scales(k_scale) and _is_block_scales(v_scale)):
                raise ValueError("k_scale and v_scale must both be block-scale tensors for pre-quantized MXFP8 K/V")
            self.core.set_mxfp8_kv_buffer(local, loc, cache_k, k_scale, cache_v, v_scale, loc_name=WRITE_LOC_NAME)
            return
        ks, vs = _scalar(k_scale, "k_scale"), _scalar(v_scale, "v_scale")
        if not self.KV_FORMAT.tensor_scaled:
            # bf16 / MXFP8 pools store what they get (MXFP8 computes its own block scales); a per-tensor scale other
            # than 1 would have to be divided out first, which is SGLang's contract for a plain fp8 pool only.
            if (ks not in (None, 1.0)) or (vs not in (None, 1.0)):
                raise ValueError(f"a per-tensor k_scale/v_scale ({ks}, {vs}) applies to fp8_e4m3 pools only; this "
                                 f"pool is {self.KV_FORMAT}")
            ks = vs = None
        self.core.set_kv_buffer(local, loc, cache_k, cache_v, k_scale=ks, v_scale=vs, loc_name=WRITE_LOC_NAME)

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor):
        if self.layer_num:
            self.core.move_kv_cache(tgt_loc, src_loc)

    def _cpu_copy_slots(self, indices, distinct: bool = False) -> torch.Tensor:
        num_slots = min(int(self.k_buffer[local].shape[0]) for local in range(self.layer_num))
        return checks.require_slots(indices, "indices", num_slots, distinct=distinct)

    def get_cpu_copy(self, indices, mamba_indices=None, req_pool_index=None):
        """Per layer: ``[k, v, k_scale_bytes, v_scale_bytes]`` of ``indices`` on the CPU (scales None unless MXFP8)."""
        out = []
        if not self.layer_num:
            return out
        indices = self._cpu_copy_slots(indices).to(self.k_buffer[0].device)
        for local in range(self.layer_num):
            k, v = self.k_buffer[local][indices].cpu(), self.v_buffer[local][indices].cpu()
            sk = sv = None
            if self.KV_FORMAT.block_scaled:
                layout = self.core.scale_layout(local)
                sk, sv = self.core.get_kv_scale_buffer(local)
                sk, sv = layout.gather(sk, indices).cpu(), layout.gather(sv, indices).cpu()
            out.append([k, v, sk, sv])
        return out

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None, req_pool_index=None):
        """``get_cpu_copy``'s output written back at ``indices``: every layer's entry is checked (count, shapes,
        dtypes, the MXFP8 scale bytes) and the indices (in the pool, none twice) before the first write."""
        if not self.layer_num:
            return
        indices = self._cpu_copy_slots(indices, distinct=True)
        if not isinstance(kv_cache_cpu, (list, tuple)) or len(kv_cache_cpu) != self.layer_num:
            raise ValueError(f"kv_cache_cpu must hold one [k, v, k_scales, v_scales] entry per layer "
                             f"({self.layer_num}), got {type(kv_cache_cpu).__name__} of "
                             f"{len(kv_cache_cpu) if isinstance(kv_cache_cpu, (list, tuple)) else '?'}")
        n = indices.numel()
        for local, entry in enumerate(kv_cache_cpu):
            if not isinstance(entry, (list, tuple)) or len(entry) != 4:
                raise ValueError(f"kv_cache_cpu[{local}] must be [k, v, k_scales, v_scales]")
            buf = self.k_buffer[local]
            for name, t in zip(("k", "v"), entry[:2]):
                if isinstance(t, torch.Tensor):  # a meta tensor would fail at its copy, after earlier layers' writes
                    checks.require_tensor(t, f"kv_cache_cpu[{local}]'s {name}")
                if not isinstance(t, torch.Tensor) or tuple(t.shape) != (n, *buf.shape[1:]) or t.dtype != buf.dtype:
                    raise ValueError(f"kv_cache_cpu[{local}]'s {name} must be {buf.dtype} of shape "
                                     f"{(n, *buf.shape[1:])}, got "
                                     f"{f'{t.dtype} {tuple(t.shape)}' if isinstance(t, torch.Tensor) else t!r}")
            if self.KV_FORMAT.block_scaled:
                layout = self.core.scale_layout(local)
                want = (n, layout.num_kv_heads, layout.blocks_per_head)  # ScaleLayout.gather's shape
                for name, t in zip(("k_scales", "v_scales"), entry[2:]):
                    if isinstance(t, torch.Tensor):
                        checks.require_tensor(t, f"kv_cache_cpu[{local}]'s {name}")
                    if not isinstance(t, torch.Tensor) or tuple(t.shape) != want or t.dtype != torch.uint8:
                        raise ValueError(f"kv_cache_cpu[{local}]'s {name} must be uint8 scale bytes of shape {want}, "
                                         f"got {f'{t.dtype} {tuple(t.shape)}' if isinstance(t, torch.Tensor) else t!r}")
            elif entry[2] is not None or entry[3] is not None:  # get_cpu_copy gives None here
                raise ValueError(f"kv_cache_cpu[{local}]'s k_scales and v_scales must be None for a "
                                 f"{self.KV_FORMAT} pool (it has no scale bytes)")
        indices = indices.to(self.k_buffer[0].device)
        for local in range(self.layer_num):
            k, v, sk, sv = kv_cache_cpu[local]
            self.k_buffer[local][indices] = k.to(self.k_buffer[local].device)
            self.v_buffer[local][indices] = v.to(self.v_buffer[local].device)
            if self.KV_FORMAT.block_scaled:
                layout = self.core.scale_layout(local)
                sfk, sfv = self.core.get_kv_scale_buffer(local)
                layout.scatter(sfk, indices, sk.to(sfk.device))
                layout.scatter(sfv, indices, sv.to(sfv.device))

    def set_kv_buffer_prefix_valid(self, *args, **kwargs):
        raise UnsupportedFeature("prefix-valid commit is not supported by the inkling KV pool")


def _is_block_scales(scale) -> bool:
    return isinstance(scale, torch.Tensor) and scale.dim() >= 2


def _scalar(scale, name: str) -> Optional[float]:
    if scale is None:
        return None
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1:
            raise ValueError(f"{name} must be a per-tensor scale (one value) or [N, Hkv, D//32] block scales, got "
                             f"shape {tuple(scale.shape)}")
    return checks.require_positive_real(scale, name)


@functools.lru_cache(maxsize=None)
def inkling_pool_class(kv_format: KVFormat | str) -> type:
    """The pool class for one KV format (cached: one class per format, so isinstance checks stay stable)."""
    fmt = as_kv_format(kv_format, "inkling KV pool format")
    name = f"InklingMHATokenToKVPool_{fmt.value}"
    return type(name, (InklingMHATokenToKVPool,), {"KV_FORMAT": fmt, "__module__": __name__})


def build_token_to_kv_pool(configurator, original, *, sizes, is_dsa_model, is_dsv4_model, req_to_token_pool):
    """``KVCacheConfigurator._build_token_to_kv_pool`` for models the inkling backend serves."""
    import sglang.srt.mem_cache.kv_cache_configurator as kc
    from sglang.srt.configs.model_config import is_minimax_sparse
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    if configurator.use_mla_backend or is_dsa_model or is_dsv4_model:
        raise ValueError("--attention-backend inkling serves multi-head (MHA/GQA) attention; this model's KV cache is "
                         "MLA/DSA. Choose another --attention-backend")
    if configurator.kv_shard_rank is not None:
        raise ValueError("--enable-kv-cache-sharding is not supported with --attention-backend inkling")
    if configurator._page_major_enabled():
        raise ValueError("--enable-page-major-kv-layout is not supported with --attention-backend inkling")
    if kc.get_schedule().prefill_only_disable_kv_cache:
        raise ValueError("--prefill-only-disable-kv-cache is not supported with --attention-backend inkling")
    if is_minimax_sparse(configurator.model_config.hf_config):
        raise ValueError("MiniMax sparse attention is not supported with --attention-backend inkling")
    kv_format = pool_format(configurator.kv_cache_dtype_str, configurator.kv_cache_dtype)
    pool_cls = inkling_pool_class(kv_format)
    model_config = configurator.model_config
    parallel = kc.get_parallel()
    head_num = model_config.get_num_kv_heads(parallel.attn_tp_size, parallel.attn_dcp_size)
    common = dict(page_size=configurator.pool_page_size, dtype=configurator.kv_cache_dtype, head_num=head_num,
                  head_dim=model_config.head_dim, device=configurator.device,
                  enable_memory_saver=kc.get_exec().features.enable_memory_saver)
    if configurator.is_hybrid_swa:
        extra = {}
        if configurator.is_hybrid_swa_compress:
            extra = dict(swa_head_num=max(1, model_config.hf_text_config.swa_num_key_value_heads
                                          // parallel.attn_tp_size),
                         swa_head_dim=model_config.swa_head_dim, swa_v_head_dim=model_config.swa_v_head_dim,
                         v_head_dim=model_config.v_head_dim)
        size_swa = (sizes.full_max_total_num_tokens if configurator.draft_swa_full_capacity
                    else sizes.swa_max_total_num_tokens)
        pool = SWAKVPool(size=sizes.full_max_total_num_tokens, size_swa=size_swa,
                         swa_attention_layer_ids=configurator.layer_info.swa_attention_layer_ids,
                         full_attention_layer_ids=configurator.layer_info.full_attention_layer_ids,
                         token_to_kv_pool_class=pool_cls, enable_kv_cache_copy=False, **common, **extra)
    elif configurator.mambaish_config:
        # Hybrid linear models: SGLang builds the container; its full-attention leaf comes from
        # _hybrid_full_attention_pool_class, which the inkling hook answers with pool_cls.
        pool = original(configurator, sizes=sizes, is_dsa_model=is_dsa_model, is_dsv4_model=is_dsv4_model,
                        req_to_token_pool=req_to_token_pool)
    else:
        pool = pool_cls(sizes.max_total_num_tokens, v_head_dim=model_config.v_head_dim,
                        layer_num=configurator.layer_info.num_effective_layers,
                        start_layer=configurator.layer_info.start_layer, end_layer=configurator.layer_info.end_layer,
                        enable_alt_stream=not kc.get_disagg().enable_pdmux, enable_kv_cache_copy=False, **common)
    logger.info("inkling: KV pool %s (%s KV, page size %d)", type(pool).__name__, kv_format,
                configurator.pool_page_size)
    return pool
