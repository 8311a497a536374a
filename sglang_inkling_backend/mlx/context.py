"""The MLX decode context: the MLX-free ``BatchedDecodeContext`` (built by its factory from the layer plan),
with MLX keep-masks and the fused RoPE + MXFP8 pool-scatter state.

What ``decode_context`` gives (torch only, no MLX): both layer maps filled from the plan
(``attention_pool_index_by_layer`` over all attention layers picks the per-request cache,
``full_kv_pool_index_by_layer`` over full layers only picks the pool buffer), ``decode_padding(window)``
memoised per window, and the ValueError when the fused kernel is on and the full-attention map is missing.
What this module adds: ``mx.array`` masks and positions, RoPE parameters taken from a full-attention layer
(Gemma's first attention layer is a sliding one with a different base), and ``MlxFusedRopeScatter``,
the per-step state the attention wrapper calls for a full layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import mlx.core as mx

from sglang_inkling_backend.mlx.decode_context import BatchedDecodeContext, make_decode_context
from sglang_inkling_backend.layer_plan import LayerPlan
from sglang_inkling_backend.mlx.kv_pool import MlxMXFP8KVPool
from sglang_inkling_backend.mlx.rope_scatter import RopeParams, rope_scatter_mxfp8


def mlx_keep_mask(rows: list[list[bool]]) -> mx.array:
    """Boolean keep-mask ``(B, 1, 1, width)``, True keeps the key (what SGLang's MLX SDPA call expects)."""
    return mx.array(rows, dtype=mx.bool_)[:, None, None, :]


def rope_params_from_plan(plan: LayerPlan) -> RopeParams:
    """RoPE parameters of a full-attention layer (``plan.rope_layer()``), never of a sliding one."""
    layer = plan.rope_layer()
    spec = plan.attention_spec(layer)
    if spec.rope_theta is None:
        raise ValueError(f"layer {layer} (the plan's RoPE layer, a full-attention layer) has no rope_theta; "
                         "the fused RoPE kernel needs the base")
    return RopeParams(float(spec.rope_theta), spec.head_dim)


@dataclass
class MlxFusedRopeScatter:
    """The fused RoPE + MXFP8 pool-scatter state of one decode step.

    ``new_token_slots[b]`` is the pool slot of request b's new token (``req_to_token[req, seq_len]``), or
    negative to skip its write. The wrapper calls it for full-attention layers with that layer's
    ``full_kv_pool_index``."""

    rope: RopeParams
    pool: MlxMXFP8KVPool
    new_token_slots: mx.array
    implementation: str = "auto"

    def __post_init__(self):
        if not isinstance(self.pool, MlxMXFP8KVPool):
            raise TypeError(f"pool must be an MlxMXFP8KVPool, got {type(self.pool).__name__}")
        if self.new_token_slots.ndim != 1 or self.new_token_slots.dtype != mx.int32:
            raise ValueError(f"new_token_slots must be 1-D int32, got {self.new_token_slots.dtype} "
                             f"{tuple(self.new_token_slots.shape)}")

    def __call__(self, q: mx.array, k: mx.array, v: mx.array, positions: mx.array,
                 full_kv_pool_index: int) -> tuple[mx.array, mx.array]:
        return rope_scatter_mxfp8(q, k, v, positions, self.new_token_slots, self.pool, full_kv_pool_index,
                                  self.rope, self.implementation)


def new_token_slots(req_to_token: Any, req_pool_indices: Sequence[int], seq_lens: Sequence[int]) -> mx.array:
    """Pool slots of the new tokens: ``req_to_token[req_pool_indices[b], seq_lens[b]]`` (a torch or numpy
    table, as SGLang's ``ReqToTokenPool.req_to_token``). Raises instead of degrading to RoPE-only: a missing
    pool write would leave the MXFP8 pool without the token that decode attention then reads."""
    if len(req_pool_indices) != len(seq_lens):
        raise ValueError(f"req_pool_indices ({len(req_pool_indices)}) and seq_lens ({len(seq_lens)}) differ in length")
    rows, cols = req_to_token.shape
    slots = []
    for row, col in zip(req_pool_indices, seq_lens):
        if not (0 <= row < rows and 0 <= col < cols):
            raise ValueError(f"req_to_token has no entry [{row}, {col}] (shape {tuple(req_to_token.shape)})")
        slots.append(int(req_to_token[row, col]))
    return mx.array(slots, dtype=mx.int32)


def make_mlx_decode_context(plan: LayerPlan, seq_lens: Sequence[int], attention_layer_caches: list[Any],
                            fused_rope_scatter: Optional[MlxFusedRopeScatter] = None) -> BatchedDecodeContext:
    """The core factory with MLX masks: both maps come from the plan, so the missing-map error cannot occur."""
    return make_decode_context(plan, seq_lens, attention_layer_caches, fused_rope_scatter=fused_rope_scatter,
                               mask_factory=mlx_keep_mask)


def positions(ctx: BatchedDecodeContext) -> mx.array:
    """int32 ``[B]`` RoPE positions of the new tokens (= seq_lens)."""
    return mx.array(ctx.offsets, dtype=mx.int32)
