"""Decode stage 1, the tile kernel: ``decode_tiles_kernel``, one program per (request, KV head, split of the
request's keys), all ``G = Hq / Hkv`` query heads of that KV head together (the heads are the dots' M side, padded
to 16 rows), K and V read as ``[BLOCK_N, D]`` tiles.

Slots come one index per key from the CSR (``kv_indptr``, ``kv_indices``: any slot per token), or with
``PAGED`` from one index per page-aligned tile: the CSR entry of the tile's first key when requests own whole
pages, or the page table's page id (``PAGE_TABLE``). ``plan.choose_config`` picks it for pools read per token,
16-bit pools and small 8-bit batches; the block kernel (``decode_blocks``) takes the larger page-aligned batches.

8-bit tiles go to fp16 (``FP16_TILES``; exact for e4m3): MXFP8 blocks times ``2**(e - e_max)`` relative to the
tile's largest scale, ``2**(e_max - 127)`` applied to the dot's result (``dequant_tile_relative``); q normalised
by a power of two so fp16 holds it. The output accumulates in units of the last V tile's common scale and is
rescaled only when a row's max or that unit changes. 16-bit pools dot in their own dtype.

Semantics are the reference's (``reference.attention.paged_decode_attention``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .device import (as_compute, decode_logits, dequant_tile, dequant_tile_relative, fold_sinks,
                     gdc_launch_dependents, load_raw_page_tile, load_raw_tile, log2e, page_tile_first_slot,
                     q_power_of_two_norm, split_bounds)


@triton.jit
def decode_tiles_kernel(
    q_ptr, k_ptr, v_ptr, ksf_ptr, vsf_ptr,
    lens_ptr, index_ptr, stride_index_row,
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
    DIRECT: tl.constexpr, FP16_TILES: tl.constexpr, PAGED: tl.constexpr, PAGE_TABLE: tl.constexpr,
    KV_PAGE: tl.constexpr, TRIGGER_MERGE: tl.constexpr = False,
):
    # lens_ptr / index_ptr: kv_indptr / kv_indices (CSR), or seq_lens / page_table (PAGE_TABLE: page ids of
    # KV_PAGE slots, a row every stride_index_row entries). PAGE is the scale layout's page, not KV_PAGE.
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    if TRIGGER_MERGE:  # plan.pdl_merge: the merge may launch now (it waits for this grid before reading)
        gdc_launch_dependents()

    # PAGED (whole pages): tiles start at multiples of BLOCK_N (a divisor of the page), so a tile is one run of
    # contiguous slots found from one index
    kv_start, seq_len, first, tok_begin, tok_end = split_bounds(lens_ptr, b, split, split_len, max_splits, window,
                                                                BLOCK_N, HAS_WINDOW, PAGED, PAGE_TABLE)
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
    qk_scale = sm_scale * log2e()
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

    offs_t = tl.arange(0, BLOCK_N)
    if PAGE_TABLE:
        idx_ptr = index_ptr + b.to(tl.int64) * stride_index_row
    else:
        idx_ptr = index_ptr + kv_start
    for start in range(tok_begin, tok_end, BLOCK_N):
        offs_n = start + offs_t
        mask_n = offs_n < tok_end
        if PAGED:
            if HAS_WINDOW:
                mask_n = mask_n & (offs_n >= first)
            slot0 = page_tile_first_slot(idx_ptr, start, PAGE_TABLE, KV_PAGE)
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
                k16 = as_compute(k_raw, tl.float16)
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
                v16 = as_compute(v_raw, tl.float16)
                rescale = alpha
            if tl.min(rescale, 0) != 1.0 or tl.max(rescale, 0) != 1.0:
                acc = acc * rescale[:, None]
            acc = tl.dot(p.to(tl.float16).to(DOT_DTYPE), v16.to(DOT_DTYPE), acc)
        else:
            v = dequant_tile(v_raw, v_sf, D, BLOCK_N, KV_FORMAT, DOT_DTYPE)
            acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v)
        m_i = m_new

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
