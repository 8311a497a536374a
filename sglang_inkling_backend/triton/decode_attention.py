"""Paged decode attention in Triton over bf16/fp16/fp32, per-tensor fp8 and MXFP8 KV pools.

One query token per request. Split-KV (flash-decoding): stage 1 runs one program per (request, KV head, split of
the request's keys) and processes all ``G = Hq / Hkv`` query heads of that KV head together with ``tl.dot``, so
every KV byte is read once; stage 2 merges the splits' partial results (skipped when a batch needs one split), one
program per (request, query head, block of channels): small batches spread it over more programs
(``choose_merge_block_d``: 12-33% off a single request's time on an H200, s5-call1).

Two stage-1 kernels:
- ``_decode_split_kernel`` (here, "tiles"): any slot per token (one index load per key), or with ``page_size``
  page-aligned tiles whose slots come from one index. MXFP8 K/V tiles go to fp16 (exact for e4m3), each 32-block
  times ``2**(e - e_max)`` relative to the tile's largest scale, ``2**(e_max - 127)`` applied to the dot's result
  (``dequant_tile_relative``); the output accumulates in units of the last V tile's common scale and is rescaled
  only when a row's max or that unit changes.
- ``decode_paged._decode_paged_split_kernel`` ("blocks"): pools of whole pages; each 32-channel block its own
  tile and dot, K's scales applied to the block's logits and V's to the probabilities, every product transposed so
  the query heads are the dots' N side, V loaded as ``[channels, keys]`` by default (see that module).
Scales are made from the UE8M0 byte's exponent bits (``byte << 23`` as float32 is ``2**(byte - 127)``; ``exp2``
per element halves the speed on an H200, see ``../shared/bench``). Either way the output is within bf16 rounding
of float64 attention on the same quantized K/V (gpu_tests/check_triton_gpu.py).

``choose_config`` picks the kernel, tile, warps, pipeline depth and split policy per batch from H200 sweeps
(bench/results/README.md has the numbers and how they compare with FlashInfer).

Semantics are ``sglang_inkling_backend.reference.attention.paged_decode_attention``: logit = q.k * scale
(+ rel_bias[b, h, d] for distance d < rel_extent), then the logit cap, keys within the window, optional sinks.

Use ``plan_decode`` once per batch (it picks the configuration and split count and allocates the partial buffers)
and ``run_decode`` per layer, or ``paged_decode_attention`` for both at once.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Optional

import torch
import triton
import triton.language as tl

from .. import mxfp8
from ..reference.attention import AttentionParams, PagedKV

logger = logging.getLogger(__name__)

# KV formats (constexpr in the kernels)
KV_FLOAT = 0  # bf16 / fp16 / fp32 buffers
KV_FP8 = 1  # float8_e4m3fn with a per-tensor k_scale / v_scale
KV_MXFP8 = 2  # float8_e4m3fn with a UE8M0 scale per 32 channels

LOG2E = 1.4426950408889634
MIN_SPLIT_TOKENS = 256  # fewer keys per split and the merge costs more than the parallelism gains
DEFAULT_BLOCK_N = 64


# ---------------------------------------------------------------------------------------------------------------
# Shared device helpers (also used by the extend kernel)
# ---------------------------------------------------------------------------------------------------------------
@triton.jit
def e8m0_to_float(byte):
    """UE8M0 byte -> 2**(byte - 127) as float32, from the exponent bits (exact for bytes 1..254)."""
    return (byte.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def scale_offsets(slots, h, HKV: tl.constexpr, NB: tl.constexpr, PAGE: tl.constexpr,
                  INTERLEAVED: tl.constexpr):
    """Offset of the first scale byte of (slot, head h) in the pool's scale buffer (see ``ScaleLayout``)."""
    if INTERLEAVED:
        page = slots // PAGE
        po = slots % PAGE
        return (((page * HKV + h) * 32 + po % 32) * (PAGE // 32) + po // 32) * NB
    else:
        return (slots * HKV + h) * NB



@triton.jit
def load_raw_tile(buf_ptr, sf_ptr, slots, mask_n, h, stride_slot, stride_head,
                  HKV: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr,
                  PAGE: tl.constexpr, INTERLEAVED: tl.constexpr):
    """The stored bytes of rows ``slots`` of head ``h``: ``[BLOCK_N, D]`` in the pool's dtype and, for MXFP8, the
    scale bytes ``[BLOCK_N, D // 32]`` (a zero placeholder otherwise). Masked rows read as 0 (scale byte 127)."""
    NB: tl.constexpr = D // 32
    rows = slots * stride_slot + h * stride_head
    x = tl.load(buf_ptr + rows[:, None] + tl.arange(0, D)[None, :], mask=mask_n[:, None], other=0.0)
    if KV_FORMAT == 2:
        sf = tl.load(sf_ptr + scale_offsets(slots, h, HKV, NB, PAGE, INTERLEAVED)[:, None]
                     + tl.arange(0, NB)[None, :], mask=mask_n[:, None], other=127)
    else:
        sf = tl.zeros([BLOCK_N, NB], tl.uint8)
    return x, sf


@triton.jit
def page_tile_scale_offsets(slot0, offs_t, h, HKV: tl.constexpr, NB: tl.constexpr, PAGE: tl.constexpr,
                            INTERLEAVED: tl.constexpr):
    """``scale_offsets`` for the contiguous slots ``slot0 + offs_t`` of one page-aligned tile: a scalar base plus
    32-bit offsets (interleaved: (page, head) atoms of [32, PAGE // 32, NB] bytes; the tile stays in one page)."""
    if INTERLEAVED:
        po = (slot0 % PAGE).to(tl.int32) + offs_t
        return ((slot0 // PAGE) * HKV + h) * (PAGE * NB) + ((po % 32) * (PAGE // 32) + po // 32) * NB
    else:
        return (slot0 * HKV + h) * NB + offs_t * (HKV * NB)


@triton.jit
def load_raw_page_tile(buf_ptr, sf_ptr, slot0, offs_t, mask_n, h, stride_slot, stride_head,
                       HKV: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr,
                       PAGE: tl.constexpr, INTERLEAVED: tl.constexpr):
    """``load_raw_tile`` for the contiguous slots ``slot0 + offs_t`` (one page-aligned tile): the addresses are a
    scalar base plus 32-bit offsets that are the same for every tile."""
    NB: tl.constexpr = D // 32
    base = buf_ptr + (slot0 * stride_slot + h * stride_head)
    x = tl.load(base + (offs_t * stride_slot)[:, None] + tl.arange(0, D)[None, :], mask=mask_n[:, None], other=0.0)
    if KV_FORMAT == 2:
        sf = tl.load(sf_ptr + page_tile_scale_offsets(slot0, offs_t, h, HKV, NB, PAGE, INTERLEAVED)[:, None]
                     + tl.arange(0, NB)[None, :], mask=mask_n[:, None], other=127)
    else:
        sf = tl.zeros([BLOCK_N, NB], tl.uint8)
    return x, sf


@triton.jit
def dequant_tile(x, sf, D: tl.constexpr, BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr,
                 DOT_DTYPE: tl.constexpr):
    """A raw tile as DOT_DTYPE; MXFP8 blocks times their scale (a power of two: exact). The per-tensor fp8 scale is
    NOT applied here (the caller folds it into the logits / the output)."""
    if KV_FORMAT == 2:
        NB: tl.constexpr = D // 32
        x3 = tl.reshape(x.to(tl.float32), (BLOCK_N, NB, 32))
        x = tl.reshape(x3 * e8m0_to_float(sf)[:, :, None], (BLOCK_N, D))
    return x.to(DOT_DTYPE)


@triton.jit
def dequant_tile_relative(x, sf, mask_n, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """An MXFP8 tile as fp16 relative to its largest scale, and that scale: ``(tile16, 2**(e_max - 127))``.

    e4m3 -> fp16 is one packed conversion per two elements and exact; each 32-block is then multiplied by
    ``2**(e - e_max) <= 1`` (exact while the tile's block exponents span at most 15, a factor of 32768; beyond that
    the smallest elements of the far-smaller blocks round in fp16's subnormal range, an absolute error under
    2**-24 of the tile's largest block scale). The common factor ``2**(e_max - 127)`` is applied to the dot's
    result, a scalar per tile. This replaces a float32 multiply per element (and its register footprint)."""
    NB: tl.constexpr = D // 32
    sfi = tl.where(mask_n[:, None], sf.to(tl.int32), 0)
    e_max = tl.max(tl.max(sfi, 1), 0)
    rel = tl.maximum(sfi - e_max, -126)
    factor = ((rel + 127) << 23).to(tl.float32, bitcast=True).to(tl.float16)  # 0 below fp16's 2**-24
    x3 = tl.reshape(x.to(tl.float16), (BLOCK_N, NB, 32)) * factor[:, :, None]
    return tl.reshape(x3, (BLOCK_N, D)), (e_max << 23).to(tl.float32, bitcast=True)


@triton.jit
def load_kv_tile(buf_ptr, sf_ptr, slots, mask_n, h, stride_slot, stride_head,
                 HKV: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr,
                 PAGE: tl.constexpr, INTERLEAVED: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Rows ``slots`` of head ``h`` as a dequantized ``[BLOCK_N, D]`` tile in DOT_DTYPE (masked rows are 0)."""
    x, sf = load_raw_tile(buf_ptr, sf_ptr, slots, mask_n, h, stride_slot, stride_head, HKV, D, BLOCK_N, KV_FORMAT,
                          PAGE, INTERLEAVED)
    return dequant_tile(x, sf, D, BLOCK_N, KV_FORMAT, DOT_DTYPE)


@triton.jit
def soft_cap(x, cap):
    """cap * tanh(x / cap), tanh through exp2 (portable to the interpreter and AMD)."""
    y = x / cap
    t = tl.exp2(-2.0 * 1.4426950408889634 * tl.abs(y))
    th = (1.0 - t) / (1.0 + t)
    return cap * tl.where(y < 0, -th, th)


@triton.jit
def scale_logits(qk, qk_scale, HAS_CAP: tl.constexpr):
    """Raw q.k times ``qk_scale`` (which includes log2(e)): base-2 logits, or natural ones when a cap will apply (the
    cap is on the natural logit, after the bias)."""
    if HAS_CAP:
        return qk * (qk_scale / 1.4426950408889634)
    return qk * qk_scale


@triton.jit
def add_logit_bias(qk, bias, HAS_CAP: tl.constexpr):
    """``scale_logits``' logits plus a natural-unit bias (float32)."""
    if HAS_CAP:
        return qk + bias
    return qk + bias * 1.4426950408889634


@triton.jit
def cap_logits(qk, logit_cap, HAS_CAP: tl.constexpr):
    """``scale_logits``' logits (bias added) as base-2 logits, through the soft cap when there is one."""
    if HAS_CAP:
        return soft_cap(qk, logit_cap) * 1.4426950408889634
    return qk


@triton.jit
def decode_logits(qk, qk_scale, start, offs_n, mask_n, q_pos, bias_row_ptr, heads, mask_g, stride_rb_head,
                  rel_extent, logit_cap, BLOCK_N: tl.constexpr, HAS_REL_BIAS: tl.constexpr, HAS_CAP: tl.constexpr,
                  KEYS_FIRST: tl.constexpr = False):
    """A decode tile's raw q.k -> base-2 logits: times ``qk_scale`` (which includes log2(e)), plus the relative bias
    within ``rel_extent`` of the query (``bias_row_ptr``: this request's ``[Hq, rel_extent]`` row), the logit cap
    on the natural-base logit after the bias, and -inf for keys outside ``mask_n``. ``qk`` is ``[heads, keys]``,
    or ``[keys, heads]`` with ``KEYS_FIRST``."""
    if KEYS_FIRST:
        key_mask = mask_n[:, None]
    else:
        key_mask = mask_n[None, :]
    qk = scale_logits(qk, qk_scale, HAS_CAP)
    if HAS_REL_BIAS:
        dist = q_pos - offs_n
        if start + BLOCK_N - 1 > q_pos - rel_extent:
            in_reach = mask_n & (dist < rel_extent)
            if KEYS_FIRST:
                bias = tl.load(bias_row_ptr + heads[None, :] * stride_rb_head + dist[:, None],
                               mask=mask_g[None, :] & in_reach[:, None], other=0.0).to(tl.float32)
            else:
                bias = tl.load(bias_row_ptr + heads[:, None] * stride_rb_head + dist[None, :],
                               mask=mask_g[:, None] & in_reach[None, :], other=0.0).to(tl.float32)
            qk = add_logit_bias(qk, bias, HAS_CAP)
    qk = cap_logits(qk, logit_cap, HAS_CAP)
    return tl.where(key_mask, qk, float("-inf"))


@triton.jit
def split_bounds(kv_indptr_ptr, b, split, split_len, window, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr,
                 PAGE_ALIGNED: tl.constexpr):
    """Request ``b``'s first rail entry, its key count, the first key its window sees, and split ``split``'s key
    range ``[tok_begin, tok_end)`` (empty when the split has no keys). ``PAGE_ALIGNED``: splits start at multiples
    of BLOCK_N from the tile holding ``first`` (whole pages: a tile never crosses a page; keys before ``first`` are
    masked by the caller)."""
    kv_start = tl.load(kv_indptr_ptr + b).to(tl.int64)
    seq_len = (tl.load(kv_indptr_ptr + b + 1) - tl.load(kv_indptr_ptr + b)).to(tl.int32)
    first = 0
    if HAS_WINDOW:
        first = tl.maximum(seq_len - window, 0)
    if PAGE_ALIGNED:
        tok_begin = (first // BLOCK_N) * BLOCK_N + split * split_len
    else:
        tok_begin = first + split * split_len
    tok_end = tl.minimum(tok_begin + split_len, seq_len)
    return kv_start, seq_len, first, tok_begin, tok_end


@triton.jit
def q_power_of_two_norm(q_max, qk_scale):
    """q * 2**(127 - E) has |q| < 2 (E: the biased exponent of max|q|): exact in fp16 for bf16 q down to 2**-14 of
    its largest element. Returns that factor and ``qk_scale`` times 2**(E - 127), which moves into the logits."""
    q_exp = (q_max.to(tl.int32, bitcast=True) >> 23) & 0xFF
    return ((254 - q_exp) << 23).to(tl.float32, bitcast=True), qk_scale * (q_exp << 23).to(tl.float32, bitcast=True)


@triton.jit
def fold_sinks(m_i, l_i, sinks_ptr, heads, mask_g):
    """Add each head's sink logit to the softmax state: returns (the factor for the output so far, l_i, m_i)."""
    sink = tl.load(sinks_ptr + heads, mask=mask_g, other=0.0).to(tl.float32) * 1.4426950408889634
    m_fin = tl.maximum(m_i, sink)
    scale_old = tl.exp2(m_i - m_fin)
    return scale_old, l_i * scale_old + tl.exp2(sink - m_fin), m_fin


# ---------------------------------------------------------------------------------------------------------------
# Stage 1: one program per (request, KV head, split)
# ---------------------------------------------------------------------------------------------------------------
@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, ksf_ptr, vsf_ptr,
    kv_indptr_ptr, kv_indices_ptr,
    rel_bias_ptr, sinks_ptr,
    out_ptr, part_o_ptr, part_lse_ptr,
    stride_qb, stride_qh,
    stride_k_slot, stride_k_head, stride_v_slot, stride_v_head,
    stride_rb_row, stride_rb_head, rel_extent,
    stride_ob, stride_oh,
    sm_scale, k_scale, v_scale, logit_cap, window,
    split_len, max_splits,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, HKV: tl.constexpr, BLOCK_N: tl.constexpr,
    KV_FORMAT: tl.constexpr, PAGE: tl.constexpr, INTERLEAVED: tl.constexpr, DOT_DTYPE: tl.constexpr,
    HAS_REL_BIAS: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_CAP: tl.constexpr, HAS_SINKS: tl.constexpr,
    DIRECT: tl.constexpr, PREFETCH: tl.constexpr, FP16_TILES: tl.constexpr, PAGED: tl.constexpr = False,
):
    # FP16_TILES (fp8 and MXFP8 pools): K/V tiles go to fp16 (exact for e4m3), MXFP8 scales relative to the tile's
    # largest (dequant_tile_relative), q normalised by a power of two so fp16 holds it; the dots run in fp16 and
    # the common factors are applied to their results. Otherwise tiles are dequantized in float32 to DOT_DTYPE.
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)

    # PAGED (whole pages): tiles start at multiples of BLOCK_N (a divisor of the page), so a tile is one run of
    # contiguous slots found from one index
    kv_start, seq_len, first, tok_begin, tok_end = split_bounds(kv_indptr_ptr, b, split, split_len, window, BLOCK_N,
                                                                HAS_WINDOW, PAGED)
    if tok_begin >= tok_end:
        return
    q_pos = seq_len - 1

    offs_g = tl.arange(0, G_PAD)
    mask_g = offs_g < G
    heads = h * G + offs_g
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_g[:, None], other=0.0).to(tl.float32)
    # logits in base 2: exp2 is the native instruction
    qk_scale = sm_scale * 1.4426950408889634
    if KV_FORMAT == 1:
        qk_scale = qk_scale * k_scale
    if FP16_TILES:
        q_norm, qk_scale = q_power_of_two_norm(tl.max(tl.max(tl.abs(q), 1), 0), qk_scale)
        q = (q * q_norm).to(tl.float16)
    q = q.to(DOT_DTYPE)

    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    acc_unit = 1.0  # FP16_TILES: the output is acc * acc_unit

    # PREFETCH: the raw K/V bytes of the next tile and the slots of the one after are loaded one iteration ahead
    # (register double buffering), so memory latency overlaps the current tile's math instead of serialising
    # index load -> K load -> V load in every iteration.
    offs_t = tl.arange(0, BLOCK_N)
    idx_ptr = kv_indices_ptr + kv_start
    if PREFETCH:
        mask_0 = tok_begin + offs_t < tok_end
        slots_0 = tl.load(idx_ptr + tok_begin + offs_t, mask=mask_0, other=0).to(tl.int64)
        k_raw, k_sf = load_raw_tile(k_ptr, ksf_ptr, slots_0, mask_0, h, stride_k_slot, stride_k_head,
                                    HKV, D, BLOCK_N, KV_FORMAT, PAGE, INTERLEAVED)
        v_raw, v_sf = load_raw_tile(v_ptr, vsf_ptr, slots_0, mask_0, h, stride_v_slot, stride_v_head,
                                    HKV, D, BLOCK_N, KV_FORMAT, PAGE, INTERLEAVED)
        next_mask = tok_begin + BLOCK_N + offs_t < tok_end
        next_slots = tl.load(idx_ptr + tok_begin + BLOCK_N + offs_t, mask=next_mask, other=0).to(tl.int64)

    for start in range(tok_begin, tok_end, BLOCK_N):
        offs_n = start + offs_t
        mask_n = offs_n < tok_end
        if PREFETCH:
            k_next, k_sf_next = load_raw_tile(k_ptr, ksf_ptr, next_slots, next_mask, h, stride_k_slot,
                                              stride_k_head, HKV, D, BLOCK_N, KV_FORMAT, PAGE, INTERLEAVED)
            v_next, v_sf_next = load_raw_tile(v_ptr, vsf_ptr, next_slots, next_mask, h, stride_v_slot,
                                              stride_v_head, HKV, D, BLOCK_N, KV_FORMAT, PAGE, INTERLEAVED)
            after_mask = start + 2 * BLOCK_N + offs_t < tok_end
            after_slots = tl.load(idx_ptr + start + 2 * BLOCK_N + offs_t, mask=after_mask, other=0).to(tl.int64)
        else:
            if PAGED:
                if HAS_WINDOW:
                    mask_n = mask_n & (offs_n >= first)
                slot0 = tl.load(idx_ptr + start).to(tl.int64)
                k_raw, k_sf = load_raw_page_tile(k_ptr, ksf_ptr, slot0, offs_t, mask_n, h, stride_k_slot,
                                                 stride_k_head, HKV, D, BLOCK_N, KV_FORMAT, PAGE, INTERLEAVED)
                v_raw, v_sf = load_raw_page_tile(v_ptr, vsf_ptr, slot0, offs_t, mask_n, h, stride_v_slot,
                                                 stride_v_head, HKV, D, BLOCK_N, KV_FORMAT, PAGE, INTERLEAVED)
            else:
                slots = tl.load(idx_ptr + offs_n, mask=mask_n, other=0).to(tl.int64)
                k_raw, k_sf = load_raw_tile(k_ptr, ksf_ptr, slots, mask_n, h, stride_k_slot, stride_k_head,
                                            HKV, D, BLOCK_N, KV_FORMAT, PAGE, INTERLEAVED)
                v_raw, v_sf = load_raw_tile(v_ptr, vsf_ptr, slots, mask_n, h, stride_v_slot, stride_v_head,
                                            HKV, D, BLOCK_N, KV_FORMAT, PAGE, INTERLEAVED)

        tile_scale = qk_scale
        if FP16_TILES:
            if KV_FORMAT == 2:
                k16, k_tile_scale = dequant_tile_relative(k_raw, k_sf, mask_n, D, BLOCK_N)
                tile_scale = qk_scale * k_tile_scale
            else:
                k16 = k_raw.to(tl.float16)
            qk = tl.dot(q, tl.trans(k16.to(DOT_DTYPE)))
        else:
            qk = tl.dot(q, tl.trans(dequant_tile(k_raw, k_sf, D, BLOCK_N, KV_FORMAT, DOT_DTYPE)))
        qk = decode_logits(qk, tile_scale, start, offs_n, mask_n, q_pos, rel_bias_ptr + b * stride_rb_row, heads,
                           mask_g, stride_rb_head, rel_extent, logit_cap, BLOCK_N, HAS_REL_BIAS, HAS_CAP)

        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if FP16_TILES:
            # acc holds the output in units of acc_unit (a power of two: the last MXFP8 V tile's common scale), so
            # the dot accumulates into it directly; acc is rescaled only when a row's max moved or the unit changed,
            # which on long contexts is rare (one multiply per acc element saved per tile)
            if KV_FORMAT == 2:
                v16, v_tile_scale = dequant_tile_relative(v_raw, v_sf, mask_n, D, BLOCK_N)
                rescale = alpha * (acc_unit / v_tile_scale)
                acc_unit = v_tile_scale
            else:
                v16 = v_raw.to(tl.float16)
                rescale = alpha
            if tl.min(rescale, 0) != 1.0 or tl.max(rescale, 0) != 1.0:
                acc = acc * rescale[:, None]
            acc = tl.dot(p.to(tl.float16).to(DOT_DTYPE), v16.to(DOT_DTYPE), acc)
        else:
            v = dequant_tile(v_raw, v_sf, D, BLOCK_N, KV_FORMAT, DOT_DTYPE)
            acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v)
        m_i = m_new
        if PREFETCH:
            k_raw, k_sf, v_raw, v_sf = k_next, k_sf_next, v_next, v_sf_next
            next_slots, next_mask = after_slots, after_mask

    if KV_FORMAT == 1:
        acc = acc * v_scale
    if DIRECT and HAS_SINKS:
        scale_old, l_i, m_i = fold_sinks(m_i, l_i, sinks_ptr, heads, mask_g)
    else:
        scale_old = tl.full([G_PAD], 1.0, tl.float32)
    o = acc * (scale_old * acc_unit / l_i)[:, None]
    if DIRECT:
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=mask_g[:, None])
    else:
        # part_o [B, Hq, max_splits, D], part_lse [B, Hq, max_splits]
        part_row = (b * (HKV * G) + heads).to(tl.int64) * max_splits + split
        tl.store(part_o_ptr + part_row[:, None] * D + offs_d[None, :], o, mask=mask_g[:, None])
        tl.store(part_lse_ptr + part_row, m_i + tl.log2(l_i), mask=mask_g)


# ---------------------------------------------------------------------------------------------------------------
# Stage 2: merge the splits of one (request, query head)
# ---------------------------------------------------------------------------------------------------------------
@triton.jit
def _decode_merge_kernel(
    part_o_ptr, part_lse_ptr, kv_indptr_ptr, sinks_ptr, out_ptr,
    stride_ob, stride_oh, window, split_len, max_splits,
    HQ: tl.constexpr, D: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, ALIGN: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # ALIGN: stage 1's splits start at a multiple of ALIGN keys before the window (block_n for page-aligned tiles).
    # One program per (request, query head, BLOCK_D channels): small batches spread the merge over more programs.
    b = tl.program_id(0)
    hq = tl.program_id(1)
    seq_len = (tl.load(kv_indptr_ptr + b + 1) - tl.load(kv_indptr_ptr + b)).to(tl.int32)
    n_keys = seq_len
    if HAS_WINDOW:
        n_keys = seq_len - (tl.maximum(seq_len - window, 0) // ALIGN) * ALIGN
    n_splits = (n_keys + split_len - 1) // split_len
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_s = tl.arange(0, SPLIT_BLOCK)
    row0 = (b * HQ + hq).to(tl.int64) * max_splits
    m = tl.load(part_lse_ptr + row0)  # split 0 always exists: a finite start, so no -inf - -inf below
    l = tl.zeros_like(m)
    acc = tl.zeros([BLOCK_D], tl.float32)
    # SPLIT_BLOCK splits at a time: their loads are independent, so their latencies overlap
    for s0 in range(0, n_splits, SPLIT_BLOCK):
        mask_s = s0 + offs_s < n_splits
        lse = tl.load(part_lse_ptr + row0 + s0 + offs_s, mask=mask_s, other=float("-inf"))
        o = tl.load(part_o_ptr + (row0 + s0 + offs_s)[:, None] * D + offs_d[None, :], mask=mask_s[:, None],
                    other=0.0)
        m_new = tl.maximum(m, tl.max(lse, 0))
        a = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new)
        acc = acc * a + tl.sum(o * w[:, None], 0)
        l = l * a + tl.sum(w, 0)
        m = m_new
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + hq).to(tl.float32) * 1.4426950408889634
        m_new = tl.maximum(m, sink)
        a = tl.exp2(m - m_new)
        acc = acc * a
        l = l * a + tl.exp2(sink - m_new)
    tl.store(out_ptr + b * stride_ob + hq * stride_oh + offs_d, (acc / l).to(out_ptr.dtype.element_ty))


# ---------------------------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------------------------
def kv_format(kv: PagedKV) -> int:
    if kv.is_mxfp8:
        return KV_MXFP8
    if kv.k_buffer.dtype == mxfp8.DATA_DTYPE:
        return KV_FP8
    return KV_FLOAT


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # the interpreter: any number works, use an H200's


@dataclass
class DecodePlan:
    """Per-batch decisions and scratch buffers, reused by every layer of one decode step."""

    batch: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    window: Optional[int]
    num_splits: int
    split_len: int
    block_n: int
    num_warps: int
    num_stages: int
    part_o: Optional[torch.Tensor]  # [B, Hq, num_splits, D] float32, None when one split suffices
    part_lse: Optional[torch.Tensor]  # [B, Hq, num_splits] float32 (base-2 log-sum-exp)
    # Tile-kernel variants (plan_decode's configuration comes from choose_config): the register prefetch was within
    # 5% of the default in the first H200 sweep and spilled at head_dim 256, so it is off.
    prefetch: bool = False  # load the next tile's K/V while computing this one (see the kernel)
    fp16_tiles: bool = True  # fp8/MXFP8: fp16 tiles with tile-relative scales (see dequant_tile_relative)
    # Requests own whole pages of this many slots (token t in slot page_table[t // P] * P + t % P), so a tile of
    # block_n keys is one run of contiguous slots, found from one index (None: any slot per token).
    page_size: Optional[int] = None
    kernel: str = "tiles"  # "tiles" (_decode_split_kernel); "blocks" (decode_paged: a dot per 32-channel block, the
    # query heads on the dots' N side)
    # "blocks" only: load V as [channels, keys] so Triton streams it through shared memory like K (155 registers
    # against 248 at head_dim 128; 1.15-1.17x faster at its large points with the same splits, s4-call1)
    load_v_transposed: bool = False
    compiled: object = None  # the last launched stage-1 kernel (Triton's CompiledKernel), for reports
    # Extra Triton launch options for the stage-1 kernel (e.g. {"maxnreg": 128}); for variant sweeps, not planned
    launch_options: dict = field(default_factory=dict)
    # Stage 2 runs one program per (request, query head, merge_block_d channels) (choose_merge_block_d)
    merge_block_d: Optional[int] = None

    @property
    def paged(self) -> bool:
        return self.page_size is not None


def choose_num_splits(batch: int, num_kv_heads: int, max_keys: int, num_sms: int, block_n: int,
                      waves: int = 8, min_split: int = MIN_SPLIT_TOKENS, resident: Optional[int] = None) -> int:
    """Enough (request, head, split) programs to fill the GPU about ``waves`` times over (an H200 sweep: 1280
    programs beat 640 by 13% at 4/1/256, B=128, 16k keys), never a split shorter than ``min_split`` keys.

    ``resident`` (programs of this kernel that fit on one SM at once): instead, at most one round of resident
    programs, ``resident * num_sms``, so that every program starts at once and none waits for a second, mostly
    empty round (H200, transposed-V block kernel: one round beat 2, 3 and 32 or 64 waves' worth by 1-4% at the
    large points and by 13-20% at B=8, 32k keys, where 2048 programs were 1.3 rounds of 1584)."""
    programs = batch * num_kv_heads
    if resident is not None:
        want = max(1, resident * num_sms // programs)
    else:
        want = max(1, math.ceil(waves * num_sms / programs))
    cap = max(1, math.ceil(max_keys / max(min_split, block_n)))
    return min(want, cap)


def choose_merge_block_d(batch: int, num_q_heads: int, head_dim: int, num_sms: int) -> int:
    """Channels per merge program: the whole head while (request, query head) pairs give a program per SM, else
    halved (down to 32 channels) until they do, so a single request's merge (16 heads: 16 programs, each reading
    its splits 32 at a time) is spread over up to 4x as many programs, each reading its splits at once."""
    block_d = head_dim
    while block_d % 64 == 0 and batch * num_q_heads * (head_dim // block_d) < num_sms:
        block_d //= 2
    return block_d


def choose_config(batch: int, num_kv_heads: int, head_dim: int, max_keys: int, page_size: Optional[int],
                  kv_dtype: Optional[torch.dtype]) -> dict:
    """Kernel configuration for a batch, from the H200 runs (bench/results/README.md: section "Decode" and the
    session notes under it).

    With whole pages and an 8-bit pool:
    - enough work for 512+ programs of 256-key splits: the block kernel with the heads on the dots' N side and V
      loaded transposed ("blocks", load_v_transposed: 32-key tiles, one warp per program, no block-wide barrier,
      K and V streamed by cp.async), split into one round of resident programs (12 per SM at head_dim 128, 8 at
      256). It beat the untransposed-V and session 2's heads-on-M block kernels at every large point of the H200
      sweeps (bench/results/2026-11-29-s4-call1, -call2);
    - little work (under 32768 keys over all (request, KV head) pairs), or one or two pairs at head_dim 256: 64-key
      tiles on 4 warps, two waves of splits of >= 64 keys (a short batch's time is its serial tiles plus the
      merge; the block kernel tied or lost there, s4-call5, s5-call2);
    - one or two pairs over more keys (a single request at head_dim <= 128): the block kernel, one round of
      resident programs of >= 64 keys (1.21-1.28x FlashInfer bf16 at 16/2/128, 16k and 32k keys, where the tile
      kernel ran 1.08-1.18x, s5-call2);
    - in between: the same block kernel, splits of >= 64 keys for about 4 programs per SM (1.18-1.22x
      FlashInfer bf16 where the tile kernel ran 0.97-1.03x, s4-call3 and -call5; at 64/8/128, one request of 4k
      keys, 1.26x where the tile kernel ran 1.10x, s5-call2).
    Otherwise (per-token indices, or 16-bit pools) the tile kernel: 64-key tiles, 2 warps (4 at head_dim 256, where
    2 spill), 8 waves of splits of >= 256 keys."""
    eight_bit = kv_dtype is None or kv_dtype.itemsize == 1
    wide = head_dim > 128
    middle = dict(kernel="tiles", block_n=DEFAULT_BLOCK_N, num_warps=4 if wide else 2, num_stages=3 if wide else 2,
                  waves=8, min_split=MIN_SPLIT_TOKENS)
    if page_size is not None and page_size % 64:  # small pages: the largest tile inside one (pages < 16: error)
        return dict(middle, block_n=32 if page_size % 32 == 0 else 16)
    if page_size is None or not eight_bit:
        return middle
    programs_at_256 = batch * num_kv_heads * -(-max_keys // MIN_SPLIT_TOKENS)
    blocks = dict(kernel="blocks", block_n=32, num_warps=1, num_stages=3)  # V loaded transposed (plan_decode)
    # the block kernel's programs per SM at 155 (head_dim 128) / 238 (256) registers on one warp, 65536 per SM
    # (Triton 3.6; smaller heads fit more, so 12 errs toward less than a round)
    resident = 8 if wide else 12
    if programs_at_256 >= 512:
        return dict(blocks, resident=resident, waves=32, min_split=MIN_SPLIT_TOKENS)  # waves: a caller's kernel
    pairs = batch * num_kv_heads
    if pairs * max_keys < 32768 or (wide and pairs <= 2):
        return dict(kernel="tiles", block_n=64, num_warps=4, num_stages=3, waves=2, min_split=64)
    if pairs <= 2:
        return dict(blocks, resident=resident, waves=4, min_split=64)
    return dict(blocks, waves=4, min_split=64)  # about 4 x SMs programs: 512-1024 beat 256 and 2048 (s4 calls 3, 5)


def plan_decode(kv_indptr: torch.Tensor, *, num_q_heads: int, num_kv_heads: int, head_dim: int,
                window: Optional[int] = None, max_seq_len: Optional[int] = None, num_splits: Optional[int] = None,
                block_n: Optional[int] = None, num_warps: Optional[int] = None, num_stages: Optional[int] = None,
                prefetch: bool = False, fp16_tiles: bool = True, page_size: Optional[int] = None,
                kernel: Optional[str] = None, waves: Optional[int] = None, min_split: Optional[int] = None,
                kv_dtype: Optional[torch.dtype] = None, load_v_transposed: Optional[bool] = None,
                merge_block_d: Optional[int] = None) -> DecodePlan:
    """Pick the kernel configuration and split count for a batch, and allocate the partial buffers.

    ``max_seq_len`` (a host int) avoids reading ``kv_indptr`` back from the device; without it the plan syncs once.
    ``page_size``: the requests own whole pages of this many slots (SGLang's paged allocator; an MXFP8 pool is
    always paged by 128), so each tile's slots are found from one index; ``block_n`` must divide it.
    ``validate_slots(..., page_size=...)`` checks that contract.
    ``kv_dtype``: the pool's element dtype (the configuration differs for 8-bit and 16-bit pools; None: 8-bit).
    ``load_v_transposed`` (kernel "blocks" only; default True there): load V tiles as ``[channels, keys]`` (see
    ``decode_paged``); False keeps the untransposed layout, the slower baseline.
    ``merge_block_d``: channels per merge program (a power of two from 32 to head_dim; None:
    ``choose_merge_block_d``).
    Configuration arguments left at None come from ``choose_config``.
    """
    if not isinstance(kv_indptr, torch.Tensor) or kv_indptr.dim() != 1 or kv_indptr.dtype not in (torch.int32,
                                                                                                   torch.int64):
        raise TypeError("kv_indptr must be a 1-D int32/int64 tensor")
    if kv_indptr.numel() < 2:
        raise ValueError(f"kv_indptr must have batch + 1 >= 2 entries, got {kv_indptr.numel()}")
    for name, value in (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if window is not None and (not isinstance(window, int) or window <= 0):
        raise ValueError(f"window must be None or a positive int, got {window!r}")
    batch = kv_indptr.numel() - 1
    if max_seq_len is None:
        max_seq_len = int(kv_indptr.diff().max())
    else:
        check_max_seq_len(max_seq_len)
    max_keys = max(1, min(max_seq_len, window) if window is not None else max_seq_len)
    chosen = choose_config(batch, num_kv_heads, head_dim, max_keys, page_size, kv_dtype)
    kernel = chosen["kernel"] if kernel is None else kernel
    block_n = chosen["block_n"] if block_n is None else block_n
    num_warps = chosen["num_warps"] if num_warps is None else num_warps
    num_stages = chosen["num_stages"] if num_stages is None else num_stages
    min_split = chosen["min_split"] if min_split is None else min_split
    if load_v_transposed is None:  # the block kernel's faster V layout; False there: the untransposed baseline
        load_v_transposed = kernel == "blocks"
    # Splits by one round of resident programs only for the configuration whose residency choose_config knows;
    # a caller's waves, or another kernel, tile, warp count or V layout, goes by waves
    same = (kernel, block_n, num_warps, load_v_transposed) == (chosen["kernel"], chosen["block_n"],
                                                               chosen["num_warps"], chosen["kernel"] == "blocks")
    resident = chosen.get("resident") if waves is None and same else None
    waves = chosen["waves"] if waves is None else waves
    if not isinstance(load_v_transposed, bool):
        raise TypeError(f"load_v_transposed must be a bool, got {load_v_transposed!r}")
    for name, value in (("block_n", block_n), ("num_warps", num_warps), ("num_stages", num_stages),
                        ("waves", waves), ("min_split", min_split)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    if kernel not in ("tiles", "blocks"):
        raise ValueError(f"kernel must be 'tiles' or 'blocks', got {kernel!r}")
    if load_v_transposed and kernel != "blocks":
        raise ValueError(f"load_v_transposed=True needs kernel='blocks', got kernel={kernel!r}")
    if page_size is not None:
        if not isinstance(page_size, int) or page_size <= 0 or page_size % block_n:
            raise ValueError(f"page_size must be a positive multiple of block_n={block_n}, got {page_size!r}")
        if prefetch:
            raise ValueError("prefetch=True is not implemented for page_size (page-aligned tiles)")
    elif kernel != "tiles":
        raise ValueError(f"kernel={kernel!r} needs page_size (it reads page-aligned tiles)")
    if page_size is not None and window is not None and window < max_seq_len:
        max_keys += block_n - 1  # page-aligned tiles start up to block_n - 1 keys before the window
    if num_splits is None:
        num_splits = choose_num_splits(batch, num_kv_heads, max_keys, _num_sms(kv_indptr.device), block_n,
                                       waves=waves, min_split=min_split, resident=resident)
    if not isinstance(num_splits, int) or num_splits <= 0:
        raise ValueError(f"num_splits must be a positive int, got {num_splits!r}")
    split_len = triton.cdiv(triton.cdiv(max_keys, num_splits), block_n) * block_n
    num_splits = triton.cdiv(max_keys, split_len)
    if merge_block_d is None:
        merge_block_d = choose_merge_block_d(batch, num_q_heads, head_dim, _num_sms(kv_indptr.device))
    elif (not isinstance(merge_block_d, int) or merge_block_d < 32 or merge_block_d > head_dim
          or merge_block_d & (merge_block_d - 1) or head_dim % merge_block_d):
        raise ValueError(f"merge_block_d must be a power of two in [32, head_dim={head_dim}] dividing head_dim, "
                         f"got {merge_block_d!r}")
    part_o = part_lse = None
    if num_splits > 1:
        dev = kv_indptr.device
        part_o = torch.empty((batch, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=dev)
        part_lse = torch.empty((batch, num_q_heads, num_splits), dtype=torch.float32, device=dev)
    return DecodePlan(batch, num_q_heads, num_kv_heads, head_dim, window, num_splits, split_len, block_n,
                      num_warps, num_stages, part_o, part_lse, prefetch, fp16_tiles, page_size, kernel,
                      load_v_transposed, merge_block_d=merge_block_d)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _dot_dtype(kv: PagedKV):
    # The Triton interpreter's tl.dot gives garbage for bf16 operands (seen with triton 3.9 on the CPU: errors of
    # 1e10 on a 16x16 product), so interpreted runs dot in float32; the GPU tests cover the bf16 path.
    if interpreting():
        return tl.float32
    if kv.k_buffer.dtype == torch.float16:
        return tl.float16
    if kv.k_buffer.dtype == torch.float32:
        return tl.float32
    return tl.bfloat16


def check_query_and_pool(q: torch.Tensor, kv: PagedKV, params: AttentionParams,
                         out: Optional[torch.Tensor]) -> None:
    """Checks shared by decode and extend (``q [rows, Hq, D]``; ``rel_bias [rows, Hq, rel_extent]``)."""
    if not isinstance(kv, PagedKV):
        raise TypeError(f"kv must be a PagedKV, got {type(kv).__name__}")
    if not isinstance(params, AttentionParams):
        raise TypeError(f"params must be an AttentionParams, got {type(params).__name__}")
    if not isinstance(q, torch.Tensor) or q.dim() != 3 or q.dtype not in (torch.bfloat16, torch.float16,
                                                                          torch.float32):
        desc = f"{tuple(q.shape)} {q.dtype}" if isinstance(q, torch.Tensor) else type(q).__name__
        raise TypeError(f"q must be a [rows, Hq, D] bf16/fp16/fp32 tensor, got {desc}")
    rows, hq, d = q.shape
    if q.stride(-1) != 1:
        raise ValueError("q must be contiguous in its last (head_dim) dimension")
    if d != kv.head_dim:
        raise ValueError(f"q's head_dim {d} does not match the pool's {kv.head_dim}")
    if d < 32 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two >= 32 for the Triton kernels, got {d}")
    if hq % kv.num_kv_heads:
        raise ValueError(f"q's head count {hq} must be a multiple of the pool's KV heads {kv.num_kv_heads}")
    for name, t in (("k_buffer", kv.k_buffer), ("v_buffer", kv.v_buffer)):
        if t.device != q.device:
            raise ValueError(f"kv.{name} is on {t.device}, q on {q.device}")
        if t.stride(-1) != 1:
            raise ValueError(f"kv.{name} must be contiguous in head_dim")
    if kv.is_mxfp8:
        for name in ("k_scales", "v_scales"):
            t = getattr(kv, name)
            if t.device != q.device:
                raise ValueError(f"kv.{name} is on {t.device}, q on {q.device}")
            if not t.is_contiguous():
                raise ValueError(f"kv.{name} must be contiguous")
    if params.rel_bias is not None:
        rb = params.rel_bias
        if rb.dim() != 3 or tuple(rb.shape[:2]) != (rows, hq) or rb.shape[2] < 1:
            raise ValueError(f"params.rel_bias must have shape [{rows}, {hq}, rel_extent], got {tuple(rb.shape)}")
        if rb.stride(-1) != 1 or rb.device != q.device:
            raise ValueError("params.rel_bias must be contiguous in its last dim and on q's device")
    if params.sinks is not None:
        if tuple(params.sinks.shape) != (hq,) or params.sinks.device != q.device:
            raise ValueError(f"params.sinks must have shape [{hq}] on q's device, got {tuple(params.sinks.shape)}")
    if out is not None:
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (rows, hq, d) or out.stride(-1) != 1:
            raise ValueError(f"out must be a [{rows}, {hq}, {d}] tensor contiguous in its last dim")
        if out.device != q.device or out.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError("out must be bf16/fp16/fp32 on q's device")


def check_index_tensor(name: str, t: torch.Tensor, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be a 1-D int32/int64 tensor")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, q on {device}")


def check_max_seq_len(max_seq_len) -> None:
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len <= 0:
        raise ValueError(f"max_seq_len must be None or a positive int (the longest request's keys), "
                         f"got {max_seq_len!r}")


def check_decode_inputs(q: torch.Tensor, kv: PagedKV, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                        params: AttentionParams, out: Optional[torch.Tensor]) -> None:
    """Shape, dtype and device checks that need no device sync (slot ranges are checked by ``validate_slots``)."""
    check_query_and_pool(q, kv, params, out)
    check_index_tensor("kv_indptr", kv_indptr, q.device)
    check_index_tensor("kv_indices", kv_indices, q.device)
    if kv_indptr.numel() != q.shape[0] + 1:
        raise ValueError(f"kv_indptr must have batch + 1 = {q.shape[0] + 1} entries, got {kv_indptr.numel()}")


def validate_slots(kv: PagedKV, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                   page_size: Optional[int] = None, max_seq_len: Optional[int] = None) -> None:
    """Range checks that read the indices back (one device sync): call once per batch, e.g. at plan time.
    With ``page_size``, also that every request owns whole pages (its token t in slot ``page * P + t % P``); with
    ``max_seq_len``, that no request is longer (the plan covers ``max_seq_len`` keys per request and a longer
    request would lose its last keys)."""
    if int(kv_indptr[0]) != 0 or bool((kv_indptr[1:] < kv_indptr[:-1]).any()):
        raise ValueError("kv_indptr must start at 0 and be non-decreasing")
    total = int(kv_indptr[-1])
    if total > kv_indices.numel():
        raise ValueError(f"kv_indptr[-1]={total} exceeds kv_indices' length {kv_indices.numel()}")
    if bool((kv_indptr[1:] == kv_indptr[:-1]).any()):
        raise ValueError("every decode request needs at least one key (its own), got an empty request")
    if max_seq_len is not None:
        check_max_seq_len(max_seq_len)
        longest = int(kv_indptr.diff().max())
        if longest > max_seq_len:
            raise ValueError(f"max_seq_len={max_seq_len} is below the longest request's {longest} keys "
                             f"(kv_indptr); pass the batch's maximum or None")
    used = kv_indices[:total]
    if used.numel() and (int(used.min()) < 0 or int(used.max()) >= kv.num_slots):
        raise ValueError(f"kv_indices must be slots in [0, {kv.num_slots}), got "
                         f"[{int(used.min())}, {int(used.max())}]")
    if page_size is not None and used.numel():
        used = used.long()
        lengths = kv_indptr[1:] - kv_indptr[:-1]
        pos = torch.arange(total, device=used.device) - torch.repeat_interleave(kv_indptr[:-1].long(), lengths)
        in_page = pos % page_size
        page_first = torch.arange(total, device=used.device) - in_page  # index of the token opening its page
        bad = (used % page_size != in_page) | (used - in_page != used[page_first])
        if bool(bad.any()):
            t = int(bad.nonzero()[0])
            raise ValueError(f"kv_indices are not whole pages of page_size={page_size}: entry {t} (token "
                             f"{int(pos[t])} of its request) is slot {int(used[t])}; token t must be in slot "
                             f"page * {page_size} + t % {page_size} with one page per {page_size} tokens")


def run_decode(plan: DecodePlan, q: torch.Tensor, kv: PagedKV, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
               params: AttentionParams, out: Optional[torch.Tensor] = None, check: bool = True) -> torch.Tensor:
    """One layer's decode attention with a batch's plan. Returns ``out`` ([B, Hq, D], q's dtype by default)."""
    if check:
        check_decode_inputs(q, kv, kv_indptr, kv_indices, params, out)
        if (q.shape[0], q.shape[1], kv.num_kv_heads, q.shape[2]) != (plan.batch, plan.num_q_heads,
                                                                    plan.num_kv_heads, plan.head_dim):
            raise ValueError(f"plan was made for B={plan.batch}, Hq={plan.num_q_heads}, Hkv={plan.num_kv_heads}, "
                             f"D={plan.head_dim}; got q {tuple(q.shape)} with Hkv={kv.num_kv_heads}")
        if params.window != plan.window:
            raise ValueError(f"plan was made for window={plan.window}, params.window={params.window}")
    batch, hq, d = q.shape
    hkv = kv.num_kv_heads
    group = hq // hkv
    if out is None:
        out = torch.empty_like(q)
    fmt = kv_format(kv)
    if fmt == KV_MXFP8:
        ksf, vsf = kv.k_scales.view(torch.uint8), kv.v_scales.view(torch.uint8)
        page, interleaved = kv.layout.page_size, kv.layout.interleaved
    else:
        ksf = vsf = kv.k_buffer  # unused
        page, interleaved = 1, False
    fp16_tiles = plan.fp16_tiles and fmt in (KV_FP8, KV_MXFP8)
    dot_dtype = tl.float32 if interpreting() else (tl.float16 if fp16_tiles else _dot_dtype(kv))
    rb = params.rel_bias
    direct = plan.num_splits == 1
    dummy = out
    grid = (batch, hkv, plan.num_splits)
    if plan.kernel == "blocks":
        pv_dtype = tl.float32 if interpreting() else (_dot_dtype(kv) if fmt == KV_FLOAT else tl.float16)
        kernel = _decode_paged_split_kernel
        variant = dict(PV_DTYPE=pv_dtype, LOAD_V_TRANSPOSED=plan.load_v_transposed)
        g_pad = max(8, triton.next_power_of_2(group))  # the heads are its dots' N side: 8 wide at least
    else:
        g_pad = max(16, triton.next_power_of_2(group))  # the heads are the dots' M side: 16 rows at least
        kernel, variant = _decode_split_kernel, dict(DOT_DTYPE=dot_dtype, PREFETCH=plan.prefetch,
                                                     FP16_TILES=fp16_tiles, PAGED=plan.paged)
    plan.compiled = kernel[grid](  # kept for resource reports (registers, spills)
        q, kv.k_buffer, kv.v_buffer, ksf, vsf,
        kv_indptr, kv_indices,
        rb if rb is not None else dummy, params.sinks if params.sinks is not None else dummy,
        out, plan.part_o if not direct else dummy, plan.part_lse if not direct else dummy,
        q.stride(0), q.stride(1),
        kv.k_buffer.stride(0), kv.k_buffer.stride(1), kv.v_buffer.stride(0), kv.v_buffer.stride(1),
        rb.stride(0) if rb is not None else 0, rb.stride(1) if rb is not None else 0,
        rb.shape[2] if rb is not None else 0,
        out.stride(0), out.stride(1),
        float(params.softmax_scale), float(kv.k_scale), float(kv.v_scale), float(params.logit_cap),
        params.window if params.window is not None else 0,
        plan.split_len, plan.num_splits,
        G=group, G_PAD=g_pad, D=d, HKV=hkv, BLOCK_N=plan.block_n,
        KV_FORMAT=fmt, PAGE=page, INTERLEAVED=interleaved,
        HAS_REL_BIAS=rb is not None, HAS_WINDOW=params.window is not None, HAS_CAP=params.logit_cap > 0,
        HAS_SINKS=params.sinks is not None, DIRECT=direct, **variant,
        num_warps=plan.num_warps, num_stages=plan.num_stages, **plan.launch_options,
    )
    if not direct:
        block_d = plan.merge_block_d or d
        _decode_merge_kernel[(batch, hq, d // block_d)](
            plan.part_o, plan.part_lse, kv_indptr, params.sinks if params.sinks is not None else dummy, out,
            out.stride(0), out.stride(1), params.window if params.window is not None else 0,
            plan.split_len, plan.num_splits,
            HQ=hq, D=d, HAS_WINDOW=params.window is not None, HAS_SINKS=params.sinks is not None,
            # up to 4096 partial values per load round (32 per thread on 4 warps): all splits at once when the
            # merge is spread over channel blocks
            SPLIT_BLOCK=min(max(32, 4096 // block_d), triton.next_power_of_2(plan.num_splits)),
            ALIGN=plan.block_n if plan.paged else 1, BLOCK_D=block_d,
            num_warps=4 if d >= 128 or block_d < d else 2,
        )
    return out


def paged_decode_attention(q: torch.Tensor, kv: PagedKV, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                           params: AttentionParams, *, num_splits: Optional[int] = None,
                           out: Optional[torch.Tensor] = None, max_seq_len: Optional[int] = None,
                           validate: bool = True, plan_options: Optional[dict] = None) -> torch.Tensor:
    """Plan and run in one call (the reference's signature). ``validate`` range-checks the slots and checks that
    ``max_seq_len`` (when given) covers the longest request (one sync); with ``validate=False`` the caller
    guarantees both (a ``max_seq_len`` below a request's length drops that request's last keys).
    ``plan_options`` are passed to ``plan_decode`` (kernel configuration: block_n, num_warps, ...)."""
    check_decode_inputs(q, kv, kv_indptr, kv_indices, params, out)
    if validate:
        validate_slots(kv, kv_indptr, kv_indices, page_size=(plan_options or {}).get("page_size"),
                       max_seq_len=max_seq_len)
    options = {"kv_dtype": kv.k_buffer.dtype, **(plan_options or {})}
    plan = plan_decode(kv_indptr, num_q_heads=q.shape[1], num_kv_heads=kv.num_kv_heads, head_dim=q.shape[2],
                       window=params.window, max_seq_len=max_seq_len, num_splits=num_splits, **options)
    return run_decode(plan, q, kv, kv_indptr, kv_indices, params, out=out, check=False)


from .decode_paged import _decode_paged_split_kernel  # noqa: E402  (it imports this module's helpers)
