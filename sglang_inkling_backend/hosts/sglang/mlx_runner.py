"""Wiring the Inkling MLX path into SGLang 0.5.23's MLX runner (Apple silicon, ``--attention-backend inkling``).

SGLang's MLX runner never builds a torch attention backend (its stub runner's ``init_attention_backends`` is a
no-op), so ``--attention-backend inkling`` is honoured on Apple by hooking the runner itself, once per worker,
right after ``MlxTpModelWorker._init_model_runner`` built it (``register_mlx_hooks``):

- the full-attention pool becomes ``InklingMlxAttentionKVPool``: the constructor and methods of SGLang's
  ``MlxAttentionKVPool`` (prefill sync, prefix-hit reads and ``clear`` keep working), MXFP8 storage
  (uint8 e4m3 + UE8M0 scales in the core layout, ~0.52x the bf16 bytes);
- the fused RoPE + pool-scatter AOT kernel slot (``runner._aot_kernels.rope``, SGLang's
  ``MlxAOTRoPEKernel``) gets ``inkling_rope_pool_fused``: the Inkling Metal kernel (MLX-ops twin off Apple,
  with a log line), quantizing k and v into the MXFP8 pool on the way;
- the per-step context factory (``runner._build_batched_decode_context``) becomes
  ``InklingDecodeContextFactory``: SGLang's own ``BatchedDecodeContext`` with both layer maps taken from the
  core ``LayerPlan`` (checked against SGLang's layout) and new-token slots that raise instead of silently
  degrading to RoPE-only.

- the full-attention layers' ``MLXAttentionWrapper`` becomes ``InklingMLXAttentionWrapper``: at decode it
  calls the fused kernel with ``full_kv_pool_index_by_layer[layer]`` and then attends over the MXFP8 pool
  (``decode_attention_mxfp8``, Metal kernel on Apple) through ``req_to_token``; it still writes SGLang's
  per-request cache, whose offsets drive the runner. Sliding-window layers keep SGLang's wrapper
  (``mx.fast.rope``, per-request windowed caches).

Where SGLang's runner keeps no pool (radix cache disabled, or a model with sliding-window layers: it skips the
pool because nothing would read it), the Inkling decode path stays off and says so in the log.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Optional

import mlx.core as mx
import numpy as np
import torch

from sglang_inkling_backend.layer_plan import LayerPlan, LayerSpec
from sglang_inkling_backend.mlx import mxfp8_ops
from sglang_inkling_backend.mlx import rope_scatter as rs
from sglang_inkling_backend.mlx.context import new_token_slots
from sglang_inkling_backend.mlx.kv_pool import MlxMXFP8KVPool

logger = logging.getLogger(__name__)

from sglang_inkling_backend.hosts.sglang import BACKEND_NAME
MLX_WORKER_INIT_TARGET = "sglang.srt.hardware_backend.mlx.tp_worker.MlxTpModelWorker._init_model_runner"


# ---- the pool ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MXFP8BufferRef:
    """What ``InklingMlxAttentionKVPool.k_buffer[i]`` holds: a reference to pool buffer i (k or v). SGLang's
    wrapper passes ``kv_pool.k_buffer[i]`` to the AOT kernel and rebinds the entry to what the kernel returns;
    a reference survives both, and the kernel finds the data and scale tiers through it."""

    pool: "InklingMlxAttentionKVPool"
    index: int
    kind: str  # "k" or "v"


class InklingMlxAttentionKVPool:
    """Drop-in for SGLang's ``MlxAttentionKVPool`` with MXFP8 storage. ``dtype`` is the model's KV dtype:
    what ``get_kv`` returns (dequantized) for prefix hits."""

    def __init__(self, pool_size: int, num_layers: int, n_kv_heads: int, head_dim: int, dtype=mx.float16):
        self.pool_size = pool_size
        self.num_layers = num_layers
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.mxfp8 = MlxMXFP8KVPool(pool_size, num_layers, n_kv_heads, head_dim, page_size=1)
        self.k_buffer = [MXFP8BufferRef(self, i, "k") for i in range(num_layers)]
        self.v_buffer = [MXFP8BufferRef(self, i, "v") for i in range(num_layers)]
        bf16_bytes = 2 * pool_size * n_kv_heads * head_dim * 2 * num_layers
        logger.info("InklingMlxAttentionKVPool: %d slots x %d layers x %d heads x %d dim, MXFP8 "
                    "(%.1f MB; bf16 would be %.1f MB)", pool_size, num_layers, n_kv_heads, head_dim,
                    self.num_bytes() / 2 ** 20, bf16_bytes / 2 ** 20)

    def num_bytes(self) -> int:
        return sum(a.nbytes for a in self.all_buffers())

    def _slots(self, slots: mx.array) -> mx.array:
        slots = mx.array(slots).astype(mx.int32).reshape(-1)
        if slots.size and (mx.min(slots).item() < 0 or mx.max(slots).item() >= self.pool_size):
            raise ValueError(f"slots must lie in [0, {self.pool_size})")
        return slots

    def set_kv(self, layer_id: int, slots: mx.array, k: mx.array, v: mx.array) -> None:
        """Quantize and store ``k, v [N, Hkv, D]`` at ``slots`` of pool buffer ``layer_id``."""
        self.mxfp8.check_pool_index(layer_id)
        slots = self._slots(slots)
        expected = (slots.shape[0], self.n_kv_heads, self.head_dim)
        if tuple(k.shape) != expected or tuple(v.shape) != expected:
            raise ValueError(f"k and v must have shape {expected}, got {tuple(k.shape)} and {tuple(v.shape)}")
        k_data, k_scales = mxfp8_ops.quantize(k)
        v_data, v_scales = mxfp8_ops.quantize(v)
        self.mxfp8.write_rows(layer_id, slots, k_data, k_scales, v_data, v_scales)

    def get_kv(self, layer_id: int, slots: mx.array) -> tuple[mx.array, mx.array]:
        self.mxfp8.check_pool_index(layer_id)
        return self.mxfp8.read_kv(layer_id, self._slots(slots), self.dtype)

    def get_kv_all_layers(self, slots: mx.array) -> tuple[mx.array, mx.array]:
        pairs = [self.get_kv(i, slots) for i in range(self.num_layers)]
        return mx.stack([k for k, _ in pairs]), mx.stack([v for _, v in pairs])

    def set_kv_all_layers(self, slots: mx.array, k_all: mx.array, v_all: mx.array) -> None:
        for i in range(self.num_layers):
            self.set_kv(i, slots, k_all[i], v_all[i])

    def all_buffers(self) -> list[mx.array]:
        p = self.mxfp8
        return p.k_buffer + p.v_buffer + p.k_scale_buffer + p.v_scale_buffer

    def clear(self) -> None:
        self.mxfp8 = MlxMXFP8KVPool(self.pool_size, self.num_layers, self.n_kv_heads, self.head_dim, page_size=1)


# ---- the fused kernel in SGLang's AOT slot -------------------------------------------------------------------

_implementation = "auto"  # "metal" on Apple; off Apple "auto" runs the twin and logs why


def inkling_rope_pool_fused(q, k, v, positions, slots, k_pool, v_pool, *, head_dim, num_qo_heads, num_kv_heads,
                            rope_base):
    """``sgl_kernel.metal.rope_pool_fused``'s signature. MXFP8 pool buffers (``MXFP8BufferRef``) get the fused
    RoPE + quantize + scatter; plain float pool buffers get the float variant."""
    if isinstance(k_pool, MXFP8BufferRef) or isinstance(v_pool, MXFP8BufferRef):
        if not (isinstance(k_pool, MXFP8BufferRef) and isinstance(v_pool, MXFP8BufferRef)
                and k_pool.pool is v_pool.pool and k_pool.index == v_pool.index
                and (k_pool.kind, v_pool.kind) == ("k", "v")):
            raise ValueError(f"k_pool and v_pool must be the k and v buffers of one MXFP8 pool layer, "
                             f"got {k_pool!r} and {v_pool!r}")
        if (q.shape[1], k.shape[1]) != (num_qo_heads, num_kv_heads):
            raise ValueError(f"q/k heads {q.shape[1]}/{k.shape[1]} differ from num_qo_heads/num_kv_heads "
                             f"{num_qo_heads}/{num_kv_heads}")
        q_rot, k_rot = rs.rope_scatter_mxfp8(q, k, v, positions, slots, k_pool.pool.mxfp8, k_pool.index,
                                             rs.RopeParams(float(rope_base), int(head_dim)), _implementation)
        return q_rot, k_rot, k_pool, v_pool
    return rs.rope_pool_fused(q, k, v, positions, slots, k_pool, v_pool, head_dim=head_dim,
                              num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, rope_base=rope_base,
                              implementation=_implementation)


def unsupported_rope_reason(rope: Any, head_dim: int) -> Optional[str]:
    """Why a layer's RoPE module cannot use the fused kernel (SGLang's own eligibility rules), or None."""
    if rope is None:
        return "the attention module has no rope"
    if getattr(rope, "traditional", False):
        return "traditional (interleaved) RoPE"
    dims = int(getattr(rope, "dims", 0) or 0)
    if dims != head_dim:
        return f"partial rotary ({dims} of {head_dim} dims)"
    if getattr(rope, "base", None) is None or getattr(rope, "_freqs", None) is not None:
        return "scaled RoPE with precomputed frequencies (YaRN / Llama-3 / SuScaled)"
    if float(getattr(rope, "mscale", 1.0)) != 1.0 or float(getattr(rope, "scale", 1.0)) != 1.0:
        return "RoPE with scale or mscale != 1"
    return None


def build_rope_kernel(sample_attn: Any, n_kv_heads: int, head_dim: int):
    """SGLang's ``MlxAOTRoPEKernel`` carrying ``inkling_rope_pool_fused``; a disabled one (with a log line saying
    why) when the model's RoPE is one the kernel does not compute."""
    from sglang.srt.hardware_backend.mlx.aot import MlxAOTRoPEKernel
    from sglang.srt.hardware_backend.mlx.kv_cache.attention_contract import get_num_heads

    inner = getattr(sample_attn, "_inner", sample_attn)
    rope = getattr(inner, "rope", None)
    reason = unsupported_rope_reason(rope, head_dim)
    if reason is not None:
        logger.warning("inkling MLX: fused RoPE + MXFP8 pool-scatter kernel off (%s); mx.fast.rope is used", reason)
        return MlxAOTRoPEKernel()
    config = {"head_dim": int(head_dim), "rope_dim": int(head_dim), "num_qo_heads": int(get_num_heads(inner)),
              "num_kv_heads": int(n_kv_heads)}
    return MlxAOTRoPEKernel(base=float(rope.base), config=config, rope_pool_fused=inkling_rope_pool_fused)


# ---- the layer plan and the per-step context factory ---------------------------------------------------------


def plan_from_cache_layout(layout: Any, num_q_heads: int, num_kv_heads: int, head_dim: int,
                           rope_theta: Optional[float] = None) -> LayerPlan:
    """The core ``LayerPlan`` of SGLang's ``MlxModelCacheLayout``; its full-attention map must agree."""
    attention = set(layout.attention_layer_indices)
    specs = [LayerSpec(window=layout.window_size(i), num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                       head_dim=head_dim, rope_theta=rope_theta) if i in attention else LayerSpec(has_attention=False)
             for i in range(layout.num_layers)]
    plan = LayerPlan(specs)
    for name in ("attention_pool_index_by_layer", "full_kv_pool_index_by_layer"):
        if getattr(plan, name) != dict(getattr(layout, name)):
            raise ValueError(f"{name} differs between the layer plan {getattr(plan, name)} and SGLang's MLX "
                             f"layout {dict(getattr(layout, name))}")
    return plan


class InklingDecodeContextFactory:
    """``runner._build_batched_decode_context``: SGLang's ``BatchedDecodeContext`` with both maps from the core
    plan and the fused kernel's new-token slots read from ``req_to_token`` (raising on a missing entry)."""

    def __init__(self, runner: Any, plan: LayerPlan):
        self.runner = runner
        self.plan = plan

    def __call__(self, caches: list[list[Any]], req_ids: list[str]):
        from sglang.srt.hardware_backend.mlx.aot import MlxAOTKernelContext, MlxAOTRoPEContext
        from sglang.srt.hardware_backend.mlx.kv_cache.attention_wrapper import BatchedDecodeContext

        runner = self.runner
        attention_layers = list(self.plan.attention_layer_ids)
        seq_lens = [caches[i][attention_layers[0]].offset for i in range(len(req_ids))]
        aot = MlxAOTKernelContext()
        kernel = runner._aot_kernels.rope
        if kernel.enabled and runner._attention_kv_pool is not None:
            if runner._req_to_token_pool is None:
                raise ValueError("the fused RoPE + pool-scatter kernel needs the runner's req_to_token_pool")
            missing = [rid for rid in req_ids if rid not in runner._req_pool_idx]
            if missing:
                raise ValueError(f"requests without a req_to_token row: {missing}")
            rows = [runner._req_pool_idx[rid] for rid in req_ids]
            slots = new_token_slots(runner._req_to_token_pool.req_to_token, rows, seq_lens)
            aot = MlxAOTKernelContext(rope=MlxAOTRoPEContext(kernel, runner._attention_kv_pool, slots))
        ctx = BatchedDecodeContext(
            batch_size=len(req_ids),
            seq_lens=seq_lens,
            attention_layer_caches=[[caches[i][layer] for i in range(len(req_ids))] for layer in attention_layers],
            attention_pool_index_by_layer=self.plan.attention_pool_index_by_layer,
            full_kv_pool_index_by_layer=self.plan.full_kv_pool_index_by_layer,
            aot=aot,
        )
        ctx.inkling_kv = None
        if aot.rope is not None and isinstance(runner._attention_kv_pool, InklingMlxAttentionKVPool):
            # Request b's keys: the pool slots of positions 0..seq_len (its new token last).
            table = runner._req_to_token_pool.req_to_token  # torch, on the CPU in SGLang's MLX runner
            indices = torch.cat([table[row, : n + 1] for row, n in zip(rows, seq_lens)]).to(torch.int32)
            indptr = np.concatenate([[0], np.cumsum(np.asarray(seq_lens) + 1)]).astype(np.int32)
            ctx.inkling_kv = (mx.array(indptr), mx.array(indices.numpy()))
        return ctx


# ---- the attention wrapper of full-attention layers ----------------------------------------------------------


@functools.lru_cache(maxsize=None)
def make_inkling_wrapper_class():
    """``InklingMLXAttentionWrapper``, a subclass of SGLang's ``MLXAttentionWrapper`` (built lazily: SGLang's
    class exists only where its MLX modules import)."""
    from sglang.srt.hardware_backend.mlx.kv_cache.attention_wrapper import MLXAttentionWrapper

    from sglang_inkling_backend.mlx.decode_attention import decode_attention_mxfp8

    class InklingMLXAttentionWrapper(MLXAttentionWrapper):
        """Decode of a full-attention layer over the MXFP8 pool; everything else as SGLang's wrapper."""

        def _batched_decode(self, x, ctx):
            if self._window_size is not None or getattr(ctx, "inkling_kv", None) is None:
                return super()._batched_decode(x, ctx)
            inner, batch = self._inner, ctx.batch_size
            n_heads, n_kv_heads = self._n_heads, self._n_kv_heads
            q_out, keys, values = inner.q_proj(x), inner.k_proj(x), inner.v_proj(x)
            head_dim = self._head_dim or keys.shape[-1] // n_kv_heads
            gate = None
            if q_out.shape[-1] == n_heads * head_dim:
                queries = q_out.reshape(batch, 1, n_heads, head_dim)
            elif q_out.shape[-1] == 2 * n_heads * head_dim:  # gated attention, as SGLang's wrapper handles it
                queries, gate = mx.split(q_out.reshape(batch, 1, n_heads, 2 * head_dim), 2, axis=-1)
                gate = gate.reshape(batch, 1, n_heads * head_dim)
            else:
                raise RuntimeError(f"Unexpected q_proj output shape {q_out.shape} for {type(inner).__name__}")
            keys = keys.reshape(batch, 1, n_kv_heads, head_dim)
            values = values.reshape(batch, 1, n_kv_heads, head_dim)
            if self._has_q_norm:
                queries = inner.q_norm(queries)
            if self._has_k_norm:
                keys = inner.k_norm(keys)
            q, k, v = queries[:, 0], keys[:, 0], values[:, 0]  # [B, H, D]
            rope_ctx = ctx.aot.rope
            pool = rope_ctx.kv_pool
            pool_index = ctx.full_kv_pool_index_by_layer[self._layer_idx]
            q_rot, k_rot, _, _ = rope_ctx.kernel.rope_pool_fused(
                q, k, v, ctx.offsets, rope_ctx.new_token_slots, pool.k_buffer[pool_index],
                pool.v_buffer[pool_index], head_dim=head_dim, num_qo_heads=n_heads, num_kv_heads=n_kv_heads,
                rope_base=rope_ctx.kernel.base)
            # SGLang's per-request cache still gets the token: its offsets drive the runner's bookkeeping.
            caches = ctx.attention_layer_caches[ctx.attention_pool_index_by_layer[self._layer_idx]]
            for i in range(batch):
                caches[i].write_token(k_rot[i][None, :, None, :], v[i][None, :, None, :])
            kv_indptr, kv_indices = ctx.inkling_kv
            mxfp8_pool = pool.mxfp8
            out = decode_attention_mxfp8(
                q_rot, mxfp8_pool.k_buffer[pool_index], mxfp8_pool.k_scale_buffer[pool_index],
                mxfp8_pool.v_buffer[pool_index], mxfp8_pool.v_scale_buffer[pool_index], kv_indptr, kv_indices,
                softmax_scale=self._scale, sinks=self._sinks, implementation=_implementation)
            out = out.astype(x.dtype).reshape(batch, 1, n_heads * head_dim)
            if gate is not None:
                out = out * mx.sigmoid(gate)
            return inner.o_proj(out)

    return InklingMLXAttentionWrapper


def swap_full_layer_wrappers(layout: Any) -> int:
    """Replace the ``MLXAttentionWrapper`` of every full-attention layer by ``InklingMLXAttentionWrapper``."""
    from sglang.srt.hardware_backend.mlx.kv_cache.attention_wrapper import MLXAttentionWrapper

    wrapper_class = make_inkling_wrapper_class()
    swapped = 0
    for layer_idx in layout.full_attention_layer_indices:
        layer, attr = layout.layers[layer_idx], layout.attention_attr(layer_idx)
        current = getattr(layer, attr)
        if isinstance(current, MLXAttentionWrapper) and not isinstance(current, wrapper_class):
            setattr(layer, attr, wrapper_class(current._inner, layer_idx, window_size=current._window_size))
            swapped += 1
    return swapped


# ---- installing on a runner, and the SGLang hook -------------------------------------------------------------


def install_on_runner(runner: Any) -> LayerPlan:
    """Switch one ``MlxModelRunner`` (already built: model loaded and patched, layout known) to the Inkling path."""
    from sglang.srt.hardware_backend.mlx.kv_cache.attention_kv_pool import MlxAttentionKVPool

    if getattr(runner, "_inkling_plan", None) is not None:
        return runner._inkling_plan
    layout = runner._cache_layout
    n_kv_heads, head_dim, _ = runner._get_attn_config()
    from sglang.srt.hardware_backend.mlx.kv_cache.attention_contract import get_num_heads

    rope_layer = (layout.full_attention_layer_indices or layout.attention_layer_indices)[0]
    sample = runner._attention_module_for_layer(rope_layer)  # a full layer: Gemma's first layer is a sliding one
    rope = getattr(sample, "rope", None)
    plan = plan_from_cache_layout(layout, int(get_num_heads(sample)), int(n_kv_heads), int(head_dim),
                                  float(rope.base) if getattr(rope, "base", None) is not None else None)
    kernel = build_rope_kernel(sample, n_kv_heads, head_dim)
    if kernel.enabled:
        runner._aot_kernels.rope = kernel
        runner._aot_kernels.selected_kernel_names = ("inkling_rope_pool_fused_mxfp8",)

    original_init_cache_pools = runner.init_cache_pools

    def init_cache_pools(req_to_token_pool):
        original_init_cache_pools(req_to_token_pool)
        pool = runner._attention_kv_pool
        if isinstance(pool, MlxAttentionKVPool):
            runner._attention_kv_pool = InklingMlxAttentionKVPool(pool.pool_size, pool.num_layers, pool.n_kv_heads,
                                                                  pool.head_dim, pool.dtype)
        elif pool is None:
            logger.warning("inkling MLX: SGLang's runner keeps no full-attention pool here (radix cache disabled, "
                           "or sliding-window layers); decode stays on SGLang's per-request caches")

    runner.init_cache_pools = init_cache_pools
    if kernel.enabled:
        swap_full_layer_wrappers(layout)
    runner._build_batched_decode_context = InklingDecodeContextFactory(runner, plan)
    runner._inkling_plan = plan
    logger.info("inkling MLX path installed: %d full / %d sliding-window attention layers, MXFP8 pool, fused "
                "kernel %s", len(plan.full_layer_ids), len(plan.windowed_layer_ids),
                "on" if kernel.enabled else "off")
    return plan


def inkling_selected() -> bool:
    """Whether this process serves ``--attention-backend inkling`` (prefill or decode)."""
    from sglang.srt.runtime_context import attention_backends

    return BACKEND_NAME in tuple(attention_backends())


def _after_init_model_runner(result, worker, *args, **kwargs):
    if inkling_selected():
        install_on_runner(worker._mlx_runner)
    return result


def register_mlx_hooks() -> None:
    """Called by the plugin's entry point on Apple silicon: install the runner hook (idempotent)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    registered = [fn for _, fn, _ in HookRegistry._hooks.get(MLX_WORKER_INIT_TARGET, [])]
    if _after_init_model_runner not in registered:
        HookRegistry.register(MLX_WORKER_INIT_TARGET, _after_init_model_runner, HookType.AFTER)
