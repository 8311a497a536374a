"""Fused RoPE + pool scatter for the new decode tokens, as a Metal kernel and as its MLX-ops twin.

Semantics (SGLang's ``rope_pool_fused``): half-split (NeoX) rotation in fp32 with
``inv_i = base^(-2i/D)``, ``theta = position * inv_i``, ``out[i] = x1 cos - x2 sin``,
``out[i + D/2] = x1 sin + x2 cos``, rounded back to the input dtype; q and k rotated, v not. For every
token with ``slot >= 0``, rotated k and raw v go to the pool buffer of the layer's full-attention index;
``slot < 0`` skips the write (masked explicitly: in MLX ``a[-1] = x`` would write the last row).

Two pools: a float pool (``rope_pool_fused``, a drop-in for ``sgl_kernel.metal.rope_pool_fused``) and
an MXFP8 pool (``rope_scatter_mxfp8``), where k (as rounded to the input dtype, i.e. what the float
pool would hold) and v are quantized to e4m3 + UE8M0 on the way, byte-identical to the core quantizer.

The kernel computes the rotated rows (and their MXFP8 bytes); the write into the pool is an MLX
scatter, because ``mx.fast.metal_kernel`` cannot alias an output onto an input buffer. MLX donates the
pool buffer to the scatter when nothing else holds it, so the write is in place in practice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx

from sglang_inkling_backend.mlx import metal_kernels as mk
from sglang_inkling_backend.mlx import mxfp8_ops
from sglang_inkling_backend.mlx.kv_pool import MlxMXFP8KVPool

_FLOAT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)


@dataclass(frozen=True)
class RopeParams:
    """Plain NeoX RoPE over the whole head: base and head_dim, nothing scaled."""

    base: float
    head_dim: int

    def __post_init__(self) -> None:
        if not (isinstance(self.base, (int, float)) and math.isfinite(self.base) and self.base > 1.0):
            raise ValueError(f"rope base must be a finite number > 1, got {self.base!r}")
        if not isinstance(self.head_dim, int) or self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"head_dim must be a positive even int, got {self.head_dim!r}")

    def inv_freq(self) -> mx.array:
        """float32 [D/2]: base^(-2i/D), computed in double and rounded once, shared by kernel and twin."""
        d = self.head_dim
        return mx.array([self.base ** (-2.0 * i / d) for i in range(d // 2)], dtype=mx.float32)


def _check_rows(name: str, x: mx.array, tokens: int | None, head_dim: int) -> None:
    if x.ndim != 3 or x.shape[2] != head_dim or (tokens is not None and x.shape[0] != tokens):
        expected = f"[{tokens if tokens is not None else 'T'}, heads, {head_dim}]"
        raise ValueError(f"{name} must have shape {expected}, got {tuple(x.shape)}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")


def _check_inputs(q, k, v, positions, rope: RopeParams) -> None:
    _check_rows("q", q, None, rope.head_dim)
    tokens = q.shape[0]
    _check_rows("k", k, tokens, rope.head_dim)
    if v is not None:
        _check_rows("v", v, tokens, rope.head_dim)
        if v.shape != k.shape:
            raise ValueError(f"v must have the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if k.dtype != q.dtype or (v is not None and v.dtype != q.dtype):
        raise TypeError("q, k and v must share one dtype")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of kv heads ({k.shape[1]})")
    if positions.shape != (tokens,) or positions.dtype != mx.int32:
        raise ValueError(f"positions must be int32 [{tokens}], got {positions.dtype} {tuple(positions.shape)}")


def _slot_rows(slots: mx.array, tokens: int, pool_size: int) -> tuple[mx.array, mx.array] | None:
    """Validate ``slots`` and return (token rows, slots) of the tokens to write, or None if none."""
    if slots.shape != (tokens,) or slots.dtype != mx.int32:
        raise ValueError(f"slots must be int32 [{tokens}], got {slots.dtype} {tuple(slots.shape)}")
    values = slots.tolist()
    too_large = [s for s in values if s >= pool_size]
    if too_large:
        raise ValueError(f"slots must be < pool size {pool_size} (negative = skip), got {too_large}")
    rows = [t for t, s in enumerate(values) if s >= 0]
    if not rows:
        return None
    return mx.array(rows, dtype=mx.int32), mx.array([values[t] for t in rows], dtype=mx.int32)


# ---- the MLX-ops twin ------------------------------------------------------------------------------


def _rotate_ops(x: mx.array, positions: mx.array, inv_freq: mx.array) -> mx.array:
    half = x.shape[-1] // 2
    theta = positions.astype(mx.float32)[:, None] * inv_freq[None, :]  # [T, D/2], fp32 as in the kernel
    cos, sin = mx.cos(theta)[:, None, :], mx.sin(theta)[:, None, :]
    xf = x.astype(mx.float32)
    x1, x2 = xf[..., :half], xf[..., half:]
    return mx.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def rope_qk_ops(q, k, positions, rope: RopeParams) -> tuple[mx.array, mx.array]:
    inv_freq = rope.inv_freq()
    return _rotate_ops(q, positions, inv_freq), _rotate_ops(k, positions, inv_freq)


def rope_qk_mxfp8_ops(q, k, v, positions, rope: RopeParams) -> list[mx.array]:
    """(q_rot, k_rot, k_data, k_scales, v_data, v_scales): the outputs of the MXFP8 kernel."""
    q_rot, k_rot = rope_qk_ops(q, k, positions, rope)
    k_data, k_scales = mxfp8_ops.quantize(k_rot)
    v_data, v_scales = mxfp8_ops.quantize(v)
    return [q_rot, k_rot, k_data, k_scales, v_data, v_scales]


# ---- the Metal kernel launches --------------------------------------------------------------------


def rope_qk_launch(q, k, positions, rope: RopeParams) -> mk.MetalLaunch:
    tokens, hq, d = q.shape
    hk = k.shape[1]
    grid = (hq + hk, tokens, 1)
    return mk.MetalLaunch(
        inputs=[q, k, positions, rope.inv_freq()],
        output_shapes=[q.shape, k.shape],
        output_dtypes=[q.dtype, k.dtype],
        grid=grid,
        threadgroup=mk.threadgroup_for(grid),
        template=[("T", q.dtype), ("HEAD_DIM", d), ("NUM_QO_HEADS", hq), ("NUM_KV_HEADS", hk)],
    )


def rope_qk_mxfp8_launch(q, k, v, positions, rope: RopeParams) -> mk.MetalLaunch:
    tokens, hq, d = q.shape
    hk = k.shape[1]
    grid = (hq + 2 * hk, tokens, 1)
    scale_shape = (tokens, hk, d // mxfp8_ops.BLOCK)
    return mk.MetalLaunch(
        inputs=[q, k, v, positions, rope.inv_freq()],
        output_shapes=[q.shape, k.shape, k.shape, scale_shape, k.shape, scale_shape],
        output_dtypes=[q.dtype, k.dtype, mx.uint8, mx.uint8, mx.uint8, mx.uint8],
        grid=grid,
        threadgroup=mk.threadgroup_for(grid),
        template=[("T", q.dtype), ("HEAD_DIM", d), ("NUM_QO_HEADS", hq), ("NUM_KV_HEADS", hk)],
    )


# ---- public entry points --------------------------------------------------------------------------


def rope_qk(q, k, positions, rope: RopeParams, implementation: str = "auto") -> tuple[mx.array, mx.array]:
    """Rotate q [T, Hq, D] and k [T, Hk, D] at ``positions`` [T] (no pool write)."""
    _check_inputs(q, k, None, positions, rope)
    if mk.resolve_implementation(implementation, "inkling rope") == "metal":
        q_rot, k_rot = mk.run_metal(mk.ROPE_QK, rope_qk_launch(q, k, positions, rope))
        return q_rot, k_rot
    return rope_qk_ops(q, k, positions, rope)


def rope_pool_fused(q, k, v, positions, slots, k_pool, v_pool, *, head_dim, num_qo_heads, num_kv_heads,
                    rope_base, implementation: str = "auto"):
    """Drop-in for ``sgl_kernel.metal.rope_pool_fused`` over a float pool ``[P, Hk, D]``.

    Returns ``(q_rot, k_rot, k_pool, v_pool)``; the pools are updated in place and returned, as the
    upstream primitive's outputs alias its input pools."""
    rope = RopeParams(float(rope_base), int(head_dim))
    _check_inputs(q, k, v, positions, rope)
    if q.shape[1] != num_qo_heads or k.shape[1] != num_kv_heads:
        raise ValueError(
            f"q/k heads {q.shape[1]}/{k.shape[1]} differ from num_qo_heads/num_kv_heads "
            f"{num_qo_heads}/{num_kv_heads}"
        )
    if k_pool.ndim != 3 or k_pool.shape[1:] != k.shape[1:] or v_pool.shape != k_pool.shape:
        raise ValueError(f"k_pool and v_pool must be [P, {k.shape[1]}, {head_dim}], got "
                         f"{tuple(k_pool.shape)} and {tuple(v_pool.shape)}")
    if k_pool.dtype != q.dtype or v_pool.dtype != q.dtype:
        raise TypeError(f"pool dtype must equal q dtype {q.dtype}, got {k_pool.dtype}/{v_pool.dtype}")
    to_write = _slot_rows(slots, q.shape[0], k_pool.shape[0])
    q_rot, k_rot = rope_qk(q, k, positions, rope, implementation)
    if to_write is not None:
        rows, valid_slots = to_write
        k_pool[valid_slots] = k_rot[rows]
        v_pool[valid_slots] = v[rows]
    return q_rot, k_rot, k_pool, v_pool


def rope_scatter_mxfp8(q, k, v, positions, slots, pool: MlxMXFP8KVPool, full_kv_pool_index: int,
                       rope: RopeParams, implementation: str = "auto") -> tuple[mx.array, mx.array]:
    """Rotate q and k, quantize k_rot and v to MXFP8, and write them at ``slots`` into the pool
    buffers ``full_kv_pool_index``. Returns ``(q_rot, k_rot)`` in the input dtype."""
    _check_inputs(q, k, v, positions, rope)
    if not isinstance(pool, MlxMXFP8KVPool):
        raise TypeError(f"pool must be an MlxMXFP8KVPool, got {type(pool).__name__}")
    pool.check_pool_index(full_kv_pool_index)
    if (k.shape[1], k.shape[2]) != (pool.num_kv_heads, pool.head_dim):
        raise ValueError(
            f"k has {k.shape[1]} heads x {k.shape[2]} dims, the pool {pool.num_kv_heads} x {pool.head_dim}"
        )
    to_write = _slot_rows(slots, q.shape[0], pool.num_slots)
    if mk.resolve_implementation(implementation, "inkling rope + MXFP8 scatter") == "metal":
        outputs = mk.run_metal(mk.ROPE_QK_MXFP8, rope_qk_mxfp8_launch(q, k, v, positions, rope))
    else:
        outputs = rope_qk_mxfp8_ops(q, k, v, positions, rope)
    q_rot, k_rot, k_data, k_scales, v_data, v_scales = outputs
    if to_write is not None:
        rows, valid_slots = to_write
        pool.write_rows(full_kv_pool_index, valid_slots, k_data[rows], k_scales[rows], v_data[rows], v_scales[rows])
    return q_rot, k_rot
