"""An MXFP8 KV pool on the MLX side: uint8 e4m3 data plus UE8M0 scale buffers in the core layout.

SGLang's own MLX pool (``MlxAttentionKVPool``) holds float buffers only. This one holds, per
full-attention layer (index = ``full_kv_pool_index_by_layer[layer]``), ``k_buffer``/``v_buffer``
uint8 ``[num_slots, Hkv, D]`` and ``k_scale_buffer``/``v_scale_buffer`` uint8 shaped by the core's
``ScaleLayout.for_pool(num_slots, Hkv, D, page_size)``, so its bytes are those of the torch pool and of
SGLang's ``MHATokenToKVPoolMXFP8``. Scale buffers start zeroed (0xFF would be NaN). Slot 0 is the
padding slot, as in SGLang's pools; ``num_slots`` counts it (the core pool's ``size + page_size``).
"""

from __future__ import annotations

import mlx.core as mx

from sglang_inkling_backend.mlx import mxfp8_ops
from sglang_inkling_backend.scale_layout import ScaleLayout


class MlxMXFP8KVPool:
    def __init__(self, num_slots: int, num_layers: int, num_kv_heads: int, head_dim: int, page_size: int = 1):
        for name, value in (("num_slots", num_slots), ("num_layers", num_layers), ("num_kv_heads", num_kv_heads)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if head_dim % mxfp8_ops.BLOCK != 0:
            raise ValueError(f"head_dim must be a multiple of {mxfp8_ops.BLOCK}, got {head_dim}")
        self.num_slots = num_slots
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.page_size = page_size
        self.scale_layout = ScaleLayout.for_pool(num_slots, num_kv_heads, head_dim, page_size)
        scale_shape = tuple(self.scale_layout.shape)
        self.k_buffer = [mx.zeros((num_slots, num_kv_heads, head_dim), mx.uint8) for _ in range(num_layers)]
        self.v_buffer = [mx.zeros((num_slots, num_kv_heads, head_dim), mx.uint8) for _ in range(num_layers)]
        self.k_scale_buffer = [mx.zeros(scale_shape, mx.uint8) for _ in range(num_layers)]
        self.v_scale_buffer = [mx.zeros(scale_shape, mx.uint8) for _ in range(num_layers)]

    @property
    def num_layers(self) -> int:
        return len(self.k_buffer)

    def get_kv_scale_buffer(self, pool_index: int) -> tuple[mx.array, mx.array]:
        return self.k_scale_buffer[pool_index], self.v_scale_buffer[pool_index]

    def check_pool_index(self, pool_index: int) -> None:
        if not 0 <= pool_index < self.num_layers:
            raise ValueError(
                f"full_kv_pool_index must be in [0, {self.num_layers}), got {pool_index}"
            )

    def _scatter_scales(self, buffer: mx.array, slots: mx.array, scales: mx.array) -> mx.array:
        if not self.scale_layout.interleaved:
            buffer[slots] = scales
            return buffer
        offsets = mxfp8_ops.scale_offsets(slots, self.num_kv_heads, self.head_dim, self.page_size)
        flat = buffer.reshape(-1)
        flat[offsets.reshape(-1)] = scales.reshape(-1)
        return flat.reshape(buffer.shape)

    def write_rows(self, pool_index: int, slots: mx.array, k_data: mx.array, k_scales: mx.array,
                   v_data: mx.array, v_scales: mx.array) -> None:
        """Store quantized rows at ``slots`` (already validated: 0 <= slot < num_slots, no skips)."""
        self.k_buffer[pool_index][slots] = k_data
        self.v_buffer[pool_index][slots] = v_data
        self.k_scale_buffer[pool_index] = self._scatter_scales(self.k_scale_buffer[pool_index], slots, k_scales)
        self.v_scale_buffer[pool_index] = self._scatter_scales(self.v_scale_buffer[pool_index], slots, v_scales)

    def gather_scales(self, buffer: mx.array, slots: mx.array) -> mx.array:
        """uint8 [N, Hkv, D // 32] scale bytes of ``slots``."""
        offsets = mxfp8_ops.scale_offsets(slots, self.num_kv_heads, self.head_dim, self.page_size)
        return buffer.reshape(-1)[offsets]

    def read_kv(self, pool_index: int, slots: mx.array, dtype=mx.float32) -> tuple[mx.array, mx.array]:
        """Dequantized (k, v) [N, Hkv, D] of ``slots``."""
        k = mxfp8_ops.dequantize(self.k_buffer[pool_index][slots],
                                 self.gather_scales(self.k_scale_buffer[pool_index], slots), dtype)
        v = mxfp8_ops.dequantize(self.v_buffer[pool_index][slots],
                                 self.gather_scales(self.v_scale_buffer[pool_index], slots), dtype)
        return k, v
