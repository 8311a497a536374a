"""Decode attention over an MXFP8 pool on MLX: a Metal kernel and its MLX-ops twin.

Same contract as the core oracle ``reference.attention.paged_decode_attention`` over an MXFP8 ``PagedKV``:
request b's keys are the pool slots ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` in position order, its one
query sits at the last of them (position ``L - 1``). For key j at distance ``d = L - 1 - j``::

    logit = (q . k_j) * softmax_scale (+ rel_bias[b, h, d] if d < rel_extent)
    logit = cap * tanh(logit / cap)                   if logit_cap > 0
    kept  = window is None or d <= window - 1
    p     = softmax over kept keys (+ one sink logit per head in the denominator when sinks are given)

GQA: query head h reads KV head ``h // (Hq // Hkv)``. Data are e4m3 bytes (uint8 ``[P, Hkv, D]``), scales
UE8M0 bytes in the core ``ScaleLayout`` for ``page_size`` (interleaved for 128, flat otherwise). Output
float32 ``[B, Hq, D]``.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx

from sglang_inkling_backend.mlx import metal_kernels as mk
from sglang_inkling_backend.mlx import mxfp8_ops
from sglang_inkling_backend.scale_layout import ScaleLayout

_FLOAT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)


def _request_lengths(kv_indptr: mx.array, batch: int, nnz: int) -> list[int]:
    if kv_indptr.ndim != 1 or kv_indptr.shape[0] != batch + 1 or kv_indptr.dtype != mx.int32:
        raise ValueError(f"kv_indptr must be int32 [{batch + 1}], got {kv_indptr.dtype} {tuple(kv_indptr.shape)}")
    bounds = kv_indptr.tolist()
    if bounds[0] != 0 or any(b < a for a, b in zip(bounds, bounds[1:])) or bounds[-1] > nnz:
        raise ValueError(f"kv_indptr must start at 0, be non-decreasing and end <= {nnz}, got {bounds}")
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    if min(lengths) < 1:
        raise ValueError(f"every request needs at least its new token's key, got lengths {lengths}")
    return lengths


def _validate(q, k_data, k_scales, v_data, v_scales, kv_indptr, kv_indices, page_size, window, sinks, rel_bias):
    if q.ndim != 3 or q.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"q must be a float [B, Hq, D] array, got {q.dtype} {tuple(q.shape)}")
    batch, hq, d = q.shape
    if k_data.ndim != 3 or k_data.dtype != mx.uint8 or k_data.shape[2] != d:
        raise ValueError(f"k_data must be uint8 [P, Hkv, {d}] (e4m3 bytes), got {k_data.dtype} {tuple(k_data.shape)}")
    if v_data.shape != k_data.shape or v_data.dtype != mx.uint8:
        raise ValueError(f"v_data must be uint8 {tuple(k_data.shape)}, got {v_data.dtype} {tuple(v_data.shape)}")
    num_slots, hkv, _ = k_data.shape
    if hq % hkv:
        raise ValueError(f"q heads ({hq}) must be a multiple of the pool's kv heads ({hkv})")
    layout = ScaleLayout.for_pool(num_slots, hkv, d, page_size)
    for name, sf in (("k_scales", k_scales), ("v_scales", v_scales)):
        if sf is None:
            raise ValueError(f"{name} is required: an MXFP8 pool has one UE8M0 byte per 32 channels")
        if sf.dtype != mx.uint8 or tuple(sf.shape) != tuple(layout.shape):
            raise ValueError(f"{name} must be uint8 {tuple(layout.shape)} (page_size={page_size}), "
                             f"got {sf.dtype} {tuple(sf.shape)}")
    if kv_indices.ndim != 1 or kv_indices.dtype != mx.int32:
        raise ValueError(f"kv_indices must be 1-D int32, got {kv_indices.dtype} {tuple(kv_indices.shape)}")
    lengths = _request_lengths(kv_indptr, batch, kv_indices.shape[0])
    used = kv_indices[: sum(lengths)]
    if used.size and (int(mx.min(used)) < 0 or int(mx.max(used)) >= num_slots):
        raise ValueError(f"kv_indices must be slots in [0, {num_slots})")
    if window is not None and (not isinstance(window, int) or window <= 0):
        raise ValueError(f"window must be None or a positive int, got {window!r}")
    if sinks is not None and tuple(sinks.shape) != (hq,):
        raise ValueError(f"sinks must have shape [{hq}], got {tuple(sinks.shape)}")
    if rel_bias is not None and (rel_bias.ndim != 3 or tuple(rel_bias.shape[:2]) != (batch, hq)):
        raise ValueError(f"rel_bias must have shape [{batch}, {hq}, rel_extent], got {tuple(rel_bias.shape)}")
    return lengths


# ---- the MLX-ops twin ------------------------------------------------------------------------------


def decode_attention_mxfp8_ops(q, k_data, k_scales, v_data, v_scales, kv_indptr, kv_indices, lengths, *,
                               softmax_scale, page_size, window, logit_cap, sinks, rel_bias) -> mx.array:
    batch, hq, d = q.shape
    hkv = k_data.shape[1]
    group = hq // hkv
    width = max(lengths)
    starts = kv_indptr.tolist()[:-1]
    # [B, width] pool slots, right-padded with slot 0 (masked out below)
    slot_rows = [kv_indices[s:s + n].tolist() + [0] * (width - n) for s, n in zip(starts, lengths)]
    slots = mx.array(slot_rows, dtype=mx.int32).reshape(-1)
    position = mx.arange(width)[None, :]
    lengths_col = mx.array(lengths)[:, None]
    distance = lengths_col - 1 - position  # [B, width]
    keep = position < lengths_col
    if window is not None:
        keep = keep & (distance <= window - 1)

    def dequantized(data, sf):
        scales = sf.reshape(-1)[mxfp8_ops.scale_offsets(slots, hkv, d, page_size)]
        return mxfp8_ops.dequantize(data[slots], scales).reshape(batch, width, hkv, d)

    k = dequantized(k_data, k_scales)
    v = dequantized(v_data, v_scales)
    qg = q.astype(mx.float32).reshape(batch, hkv, group, d)
    logits = mx.einsum("bhgd,blhd->bhgl", qg, k) * softmax_scale
    if rel_bias is not None:
        extent = rel_bias.shape[-1]
        index = mx.broadcast_to(mx.clip(distance, 0, extent - 1)[:, None, None, :], (batch, hkv, group, width))
        bias = mx.take_along_axis(rel_bias.astype(mx.float32).reshape(batch, hkv, group, extent), index, axis=-1)
        logits = logits + mx.where((distance < extent)[:, None, None, :], bias, 0.0)
    if logit_cap > 0:
        logits = logit_cap * mx.tanh(logits / logit_cap)
    logits = mx.where(keep[:, None, None, :], logits, -mx.inf)
    if sinks is not None:
        sink = mx.broadcast_to(sinks.astype(mx.float32).reshape(1, hkv, group, 1), (batch, hkv, group, 1))
        probs = mx.softmax(mx.concatenate([logits, sink], axis=-1), axis=-1)[..., :-1]
    else:
        probs = mx.softmax(logits, axis=-1)
    out = mx.einsum("bhgl,blhd->bhgd", probs, v)
    return out.reshape(batch, hq, d)


# ---- the Metal kernel launch ----------------------------------------------------------------------


def decode_mxfp8_launch(q, k_data, k_scales, v_data, v_scales, kv_indptr, kv_indices, *, softmax_scale,
                        page_size, window, logit_cap, sinks, rel_bias) -> mk.MetalLaunch:
    batch, hq, d = q.shape
    hkv = k_data.shape[1]
    rel_extent = 0 if rel_bias is None else rel_bias.shape[-1]
    grid = (d // mxfp8_ops.BLOCK, hq, batch)
    return mk.MetalLaunch(
        inputs=[
            q, k_data, k_scales, v_data, v_scales, kv_indptr, kv_indices,
            mx.array([softmax_scale, logit_cap], dtype=mx.float32),
            mx.zeros((1,), mx.float32) if sinks is None else sinks.astype(mx.float32),
            mx.zeros((1,), mx.float32) if rel_bias is None else rel_bias.astype(mx.float32),
        ],
        output_shapes=[(batch, hq, d)],
        output_dtypes=[mx.float32],
        grid=grid,
        threadgroup=mk.threadgroup_for(grid),
        template=[
            ("T", q.dtype), ("HEAD_DIM", d), ("NUM_QO_HEADS", hq), ("NUM_KV_HEADS", hkv),
            ("PAGE_SIZE", page_size), ("WINDOW", 0 if window is None else window),
            ("HAS_SINKS", sinks is not None), ("REL_EXTENT", rel_extent),
        ],
    )


def decode_attention_mxfp8(q: mx.array, k_data: mx.array, k_scales: mx.array, v_data: mx.array,
                           v_scales: mx.array, kv_indptr: mx.array, kv_indices: mx.array, *,
                           softmax_scale: float, page_size: int = 1, window: Optional[int] = None,
                           logit_cap: float = 0.0, sinks: Optional[mx.array] = None,
                           rel_bias: Optional[mx.array] = None, implementation: str = "auto") -> mx.array:
    """Decode attention of ``q [B, Hq, D]`` over one layer of an MXFP8 pool -> float32 ``[B, Hq, D]``."""
    lengths = _validate(q, k_data, k_scales, v_data, v_scales, kv_indptr, kv_indices, page_size, window,
                        sinks, rel_bias)
    if logit_cap < 0:
        raise ValueError(f"logit_cap must be >= 0 (0 disables it), got {logit_cap}")
    options = dict(softmax_scale=float(softmax_scale), page_size=page_size, window=window,
                   logit_cap=float(logit_cap), sinks=sinks, rel_bias=rel_bias)
    if mk.resolve_implementation(implementation, "inkling MXFP8 decode attention") == "metal":
        launch = decode_mxfp8_launch(q, k_data, k_scales, v_data, v_scales, kv_indptr, kv_indices, **options)
        return mk.run_metal(mk.DECODE_MXFP8, launch)[0]
    return decode_attention_mxfp8_ops(q, k_data, k_scales, v_data, v_scales, kv_indptr, kv_indices, lengths,
                                      **options)
