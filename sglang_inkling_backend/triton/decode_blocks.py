"""Decode stage 1, the block kernel: ``decode_blocks_kernel``, for pools whose requests own whole pages (a page
table, or a CSR whose token ``t`` lives in slot ``page_table[t // P] * P + t % P``: SGLang's paged allocator, and
the only layout an MXFP8 pool has: page 128). A tile of ``BLOCK_N`` keys (``BLOCK_N`` divides ``P``) is one run of
contiguous slots: the kernel reads one index per tile instead of one per key, and every address of the tile is
that slot plus a constant pattern, which the software pipeline can prefetch several tiles ahead.

The head dimension is processed as ``NB = D / 32`` channel blocks, each its own ``[BLOCK_N, 32]`` tile (a tuple
of NB tensors; no reshapes, so each tile goes from the load to its dot without a layout change), and every product
is taken transposed, keys and channels on the dots' M side and the G query heads of the KV head on the N side:
- logits ``[BLOCK_N, G] = K_j @ q_j^T`` summed over the blocks j, each block's times its K scales (``2**(e - 127)``
  from the exponent bits, one value per key), so K needs only the exact e4m3 -> fp16 conversion;
- output ``[32, G] += V_j^T @ (p^T * V scales of block j)``, one accumulator per block, in units of the largest V
  scale seen in that block (the probabilities times ``2**(e - unit) <= 1`` are rounded to fp16; V in fp16 is exact
  for e4m3). V is loaded as ``[channels, keys]``, which Triton streams through shared memory like K.
Heads on the N side: an mma is 8 wide in N but 16 tall in M, so G = 8 (or 4) heads fill (half) a dot instead of
padding it to 16 rows. Against the same kernel with heads on M this halves the dots, the accumulator registers and
the softmax work per key. No step reduces across the tile
except the softmax's max and sum over keys. bf16 / fp16 pools use the same kernel without scales; per-tensor fp8
applies its two scalars.

Semantics are the reference's (``reference.attention.paged_decode_attention``), like ``decode_tiles_kernel``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .device import (as_compute, decode_logits, fold_sinks, gdc_launch_dependents, log2e, page_tile_first_slot,
                     q_power_of_two_norm, scale_offsets, split_bounds)


@triton.jit
def scale_columns(sf, NB: tl.constexpr):
    """A ``[BLOCK_N, NB]`` tile of scale bytes (NB in 1, 2, 4, 8) as a tuple of NB ``[BLOCK_N]`` columns, by
    register-local splits (one load per key instead of one per key and block)."""
    N: tl.constexpr = sf.shape[0]
    if NB == 1:
        cols = (tl.reshape(sf, (N,)),)
    elif NB == 2:
        cols = tl.split(sf)
    elif NB == 4:
        a, b = tl.split(tl.reshape(sf, (N, 2, 2)))  # a: columns 0, 2; b: 1, 3
        a0, a2 = tl.split(a)
        b1, b3 = tl.split(b)
        cols = (a0, b1, a2, b3)
    else:
        a, b = tl.split(tl.reshape(sf, (N, 4, 2)))  # a: 0, 2, 4, 6; b: 1, 3, 5, 7
        a0, a1 = tl.split(tl.reshape(a, (N, 2, 2)))  # a0: 0, 4; a1: 2, 6
        b0, b1 = tl.split(tl.reshape(b, (N, 2, 2)))  # b0: 1, 5; b1: 3, 7
        c0, c4 = tl.split(a0)
        c2, c6 = tl.split(a1)
        c1, c5 = tl.split(b0)
        c3, c7 = tl.split(b1)
        cols = (c0, c1, c2, c3, c4, c5, c6, c7)
    return cols


@triton.jit
def decode_blocks_kernel(
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
    KV_FORMAT: tl.constexpr, PAGE: tl.constexpr, INTERLEAVED: tl.constexpr, PV_DTYPE: tl.constexpr,
    HAS_REL_BIAS: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_CAP: tl.constexpr, HAS_SINKS: tl.constexpr,
    DIRECT: tl.constexpr, PAGE_TABLE: tl.constexpr, KV_PAGE: tl.constexpr, TRIGGER_MERGE: tl.constexpr = False,
):
    NB: tl.constexpr = D // 32
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    if TRIGGER_MERGE:  # plan.pdl_merge: the merge may launch now (it waits for this grid before reading)
        gdc_launch_dependents()

    kv_start, seq_len, first, tok_begin, tok_end = split_bounds(lens_ptr, b, split, split_len, max_splits, window,
                                                                BLOCK_N, HAS_WINDOW, True, PAGE_TABLE)  # page-aligned tiles
    if tok_begin >= tok_end:
        return
    q_pos = seq_len - 1

    offs_g = tl.arange(0, G_PAD)
    offs_c = tl.arange(0, 32)
    mask_g = offs_g < G
    heads = h * G + offs_g
    q_cols = q_ptr + b * stride_qb + heads[None, :] * stride_qh + offs_c[:, None]  # q^T: [32 channels, heads]
    q_max = 0.0
    for j in tl.static_range(NB):
        q_max = tl.maximum(q_max, tl.max(tl.max(tl.abs(tl.load(q_cols + 32 * j, mask=mask_g[None, :],
                                                                  other=0.0).to(tl.float32)), 1), 0))
    qk_scale = sm_scale * log2e()
    if KV_FORMAT == 1:
        qk_scale = qk_scale * k_scale
    if KV_FORMAT == 0:
        q_norm = 1.0
        Q_DTYPE: tl.constexpr = PV_DTYPE
    else:
        q_norm, qk_scale = q_power_of_two_norm(q_max, qk_scale)
        Q_DTYPE: tl.constexpr = tl.float32 if PV_DTYPE == tl.float32 else tl.float16
    qts = ()
    accs = ()
    units = ()
    for j in tl.static_range(NB):
        qj = tl.load(q_cols + 32 * j, mask=mask_g[None, :], other=0.0).to(tl.float32) * q_norm
        qts = qts + (qj.to(Q_DTYPE),)
        accs = accs + (tl.zeros([32, G_PAD], tl.float32),)
        units = units + (tl.zeros([], tl.int32) + 1,)
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)

    offs_t = tl.arange(0, BLOCK_N)
    offs_j = tl.arange(0, NB)
    k_tile = (offs_t * stride_k_slot)[:, None] + offs_c[None, :]
    # V^T as loaded: [32 channels, BLOCK_N keys]. Triton then streams V through shared memory with cp.async like
    # K (a [keys, channels] load followed by a transpose is prefetched into registers instead): 158 registers
    # against 249 at head_dim 128, 987 loop instructions against 1142 (triton 3.6 offline, 1 warp, 3 stages)
    v_tile = (offs_t * stride_v_slot)[None, :] + offs_c[:, None]
    if PAGE_TABLE:
        idx_ptr = index_ptr + b.to(tl.int64) * stride_index_row
    else:
        idx_ptr = index_ptr + kv_start
    for start in range(tok_begin, tok_end, BLOCK_N):
        offs_n = start + offs_t
        mask_n = offs_n < tok_end
        if HAS_WINDOW:
            mask_n = mask_n & (offs_n >= first)
        slot0 = page_tile_first_slot(idx_ptr, start, PAGE_TABLE, KV_PAGE)
        k_base = k_ptr + (slot0 * stride_k_slot + h * stride_k_head)
        v_base = v_ptr + (slot0 * stride_v_slot + h * stride_v_head)
        if KV_FORMAT == 2:
            sf_off = scale_offsets(slot0, offs_t, h, HKV, NB, PAGE, INTERLEAVED)

        qk = tl.zeros([BLOCK_N, G_PAD], tl.float32)
        if KV_FORMAT == 2:  # both tiles' scale bytes, one load per key each
            k_cols = scale_columns(tl.load(ksf_ptr + sf_off[:, None] + offs_j[None, :], mask=mask_n[:, None],
                                           other=127), NB)
            v_cols = scale_columns(tl.load(vsf_ptr + sf_off[:, None] + offs_j[None, :], mask=mask_n[:, None],
                                           other=0), NB)
        for j in tl.static_range(NB):
            kj = tl.load(k_base + k_tile + 32 * j, mask=mask_n[:, None], other=0.0)
            qkj = tl.dot(as_compute(kj, Q_DTYPE), qts[j])
            if KV_FORMAT == 2:
                qk += qkj * (k_cols[j].to(tl.int32) << 23).to(tl.float32, bitcast=True)[:, None]
            else:
                qk += qkj

        qk = decode_logits(qk, qk_scale, start, offs_n, mask_n, q_pos, rel_bias_ptr + b * stride_rb_row, heads,
                           mask_g, stride_rb_head, rel_extent, logit_cap, BLOCK_N, HAS_REL_BIAS, HAS_CAP,
                           KEYS_FIRST=True)

        m_new = tl.maximum(m_i, tl.max(qk, 0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[None, :])
        l_i = l_i * alpha + tl.sum(p, 0)
        moved = tl.min(alpha, 0) != 1.0
        new_accs = ()
        new_units = ()
        for j in tl.static_range(NB):
            vj = tl.load(v_base + v_tile + 32 * j, mask=mask_n[None, :], other=0.0)
            acc = accs[j]
            if KV_FORMAT == 2:
                e = v_cols[j].to(tl.int32)
                unit = tl.maximum(units[j], tl.max(e, 0))
                rel = tl.maximum(e - unit, -126)
                pj = p * ((rel + 127) << 23).to(tl.float32, bitcast=True)[:, None]
                if moved or unit != units[j]:
                    acc = acc * (alpha * ((units[j] - unit + 127) << 23).to(tl.float32, bitcast=True))[None, :]
                new_units = new_units + (unit,)
                new_accs = new_accs + (tl.dot(as_compute(vj, PV_DTYPE), pj.to(PV_DTYPE), acc),)
            else:
                if moved:
                    acc = acc * alpha[None, :]
                new_accs = new_accs + (tl.dot(as_compute(vj, PV_DTYPE), p.to(PV_DTYPE), acc),)
        accs = new_accs
        if KV_FORMAT == 2:
            units = new_units
        m_i = m_new

    if DIRECT and HAS_SINKS:
        scale_old, l_i, m_i = fold_sinks(m_i, l_i, sinks_ptr, heads, mask_g)
    else:
        scale_old = tl.full([G_PAD], 1.0, tl.float32)
    o_scale = scale_old / l_i
    if KV_FORMAT == 1:
        o_scale = o_scale * v_scale
    part_row = (b * (HKV * G) + heads).to(tl.int64) * max_splits + split
    for j in tl.static_range(NB):
        o = accs[j] * o_scale[None, :]
        if KV_FORMAT == 2:
            o = o * (units[j] << 23).to(tl.float32, bitcast=True)
        if DIRECT:
            tl.store(out_ptr + b * stride_ob + heads[None, :] * stride_oh + 32 * j + offs_c[:, None],
                     o.to(out_ptr.dtype.element_ty), mask=mask_g[None, :])
        else:
            tl.store(part_o_ptr + part_row[None, :] * D + 32 * j + offs_c[:, None], o, mask=mask_g[None, :])
    if not DIRECT:
        tl.store(part_lse_ptr + part_row, m_i + tl.log2(l_i), mask=mask_g)
