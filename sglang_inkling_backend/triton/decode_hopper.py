"""Decode stage 1 for Hopper (sm_90a), in Gluon: ``decode_hopper_kernel``, for MXFP8 pools of 128-slot pages
(SGLang's layout, interleaved scales) read through a page table or a CSR of whole pages.

The same plan, workspace and merge as the Triton block kernel (``decode_blocks``), and its semantics; what
changes is how the bytes arrive and which instructions do the dots (docs/HOPPER_DECODE.md has the design and the
measurements):
- a tile is one page (128 keys): its K and V rows come in by TMA (two ``[BLOCK_N, D]`` boxes of
  one pool-wide 2-D tensor map, ``[slots, Hkv * D]``) into a ring of ``NUM_STAGES`` shared-memory stages, issued
  ``NUM_STAGES - 1`` tiles ahead of the math on an mbarrier per stage; the tile's scale bytes come one tile ahead
  into registers;
- the dots are warpgroup MMAs (one warpgroup, 4 warps), keys and channels on the M side and the query heads on
  the N side, like the block kernel: logits ``[BLOCK_N, N2] = K_j @ Q_j^T`` per 32-channel block j in e4m3, K
  straight from the TMA stage and Q as two e4m3 parts (see the Q comment in the kernel), each block's result times
  its K scales; output ``[64 channels, N2] += V^T @ P'`` per 64 channels in fp16, V^T from registers (e4m3 ->
  fp16, exact), P' in shared memory;
- ``N2 = 2 * G_PAD`` columns: every head twice. Column c is head ``c % G_PAD`` of the 64-channel half's block
  ``2m + c // G_PAD``: the probabilities of the left columns carry block 2m's V scales, the right ones block
  2m+1's, so one MMA serves both blocks of a half (each output row keeps the columns of its own block). The
  logits are computed for both copies so that probabilities, running maxima and rescale factors all live in the
  one MMA layout.
V's scales are relative to a running per-block unit (the largest V exponent seen, as in ``decode_blocks``), so
probabilities times ``2**(e - unit) <= 1`` stay inside fp16.

Keys outside the split's range or the window: logits -inf, and on a tile that holds any, V's e4m3 NaN bytes made
numbers (a TMA box reads the whole tile, and bytes past a request's last key can be anything).

The kernel's steps (``split_tiles``, ``q_parts_to_shared``, ``issue_k_dots``, ``tile_softmax``, the factors,
``store_half``) are helpers that the warp-specialized kernel (``decode_hopper_ws``) runs too.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)

from ..scale_layout import INTERLEAVED_PAGE_SIZE
from .plan import hopper_head_split
from .device import decode_logits, fold_sinks, gdc_launch_dependents, log2e, q_power_of_two_norm, request_split_len

HOPPER_PAGE = gl.constexpr(INTERLEAVED_PAGE_SIZE)  # its tiles are an MXFP8 pool's pages, scales interleaved per page

# The Triton helpers are plain scalar and elementwise code: the Gluon kernel runs the same functions (one copy of
# the logit pipeline, the split lengths and the sinks), compiled as Gluon.
g_decode_logits = gluon.jit(decode_logits.fn)
g_log2e = gluon.jit(log2e.fn)
g_fold_sinks = gluon.jit(fold_sinks.fn)
g_q_power_of_two_norm = gluon.jit(q_power_of_two_norm.fn)
g_request_split_len = gluon.jit(request_split_len.fn)

HOPPER_NUM_WARPS = 4  # one warpgroup
# The TMA load's name: tma.async_copy_global_to_shared up to Triton 3.6, tma.async_load since (3.9 raises on the
# old name)
tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
# A CTA-wide barrier: gl.thread_barrier up to Triton 3.6, gl.barrier since
cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier
# shared_memory_descriptor._reinterpret up to Triton 3.6, .reinterpret since
PUBLIC_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))


@gluon.jit
def e8m0(byte):
    return (byte.to(gl.int32) << 23).to(gl.float32, bitcast=True)


@gluon.jit
def load_scale_words(sf_ptr, offs, NB: gl.constexpr):
    """The ``NB`` scale bytes of each key (contiguous in the interleaved atom) as 32-bit words of 4 blocks (one
    16-bit word for NB = 2): a tuple of ``max(NB // 4, 1)`` tensors."""
    words = ()
    if NB == 2:
        words = (gl.load(sf_ptr.to(gl.pointer_type(gl.int16)) + offs // 2).to(gl.int32) & 0xFFFF,)
    else:
        for w in gl.static_range(NB // 4):
            words = words + (gl.load(sf_ptr.to(gl.pointer_type(gl.int32)) + offs // 4 + w),)
    return words


@gluon.jit
def tile_slot(row_ptr, start, PAGE: gl.constexpr, PAGE_TABLE: gl.constexpr):
    """The first slot of the tile at key ``start`` (a tile never crosses a page): int32, a TMA coordinate.
    ``row_ptr``: the request's page-table row, or (a CSR of whole pages) its first entry of per-key slots."""
    if PAGE_TABLE:
        slot = gl.load(row_ptr + start // PAGE).to(gl.int32) * PAGE + start % PAGE
    else:
        slot = gl.load(row_ptr + start).to(gl.int32)
    return slot


@gluon.jit
def tile_scale_offsets(slot0, offs_t, h, HKV: gl.constexpr, NB: gl.constexpr, PAGE: gl.constexpr):
    """Offsets of the first scale byte of slots ``slot0 + offs_t`` of head ``h`` (one tile, inside one page):
    ``device.scale_offsets`` for an interleaved pool (one ``(page, head)`` atom of ``[32, PAGE // 32, NB]`` bytes)."""
    page = (slot0 // PAGE).to(gl.int64)
    po = slot0 % PAGE + offs_t
    return (page * HKV + h) * (PAGE * NB) + ((po % 32) * (PAGE // 32) + po // 32) * NB


@gluon.jit
def scale_byte(words, j: gl.constexpr):
    """Block ``j``'s UE8M0 byte (as int32) from ``load_scale_words``."""
    return (words[j // 4] >> (8 * (j % 4))) & 0xFF


@gluon.jit
def max2(a0, a1, b0, b1):
    return gl.maximum(a0, b0), gl.maximum(a1, b1)


@gluon.jit
def max3(a0, a1, a2, b0, b1, b2):
    return gl.maximum(a0, b0), gl.maximum(a1, b1), gl.maximum(a2, b2)


@gluon.jit
def max5(a0, a1, a2, a3, a4, b0, b1, b2, b3, b4):
    return (gl.maximum(a0, b0), gl.maximum(a1, b1), gl.maximum(a2, b2), gl.maximum(a3, b3),
            gl.maximum(a4, b4))


@gluon.jit
def column_maxes(qk, ecols, NH: gl.constexpr):
    """Column maxima over the keys of ``qk`` and of each half's V exponents, in one reduction (one exchange
    between the warps instead of 1 + NH)."""
    if NH == 1:
        maxes = gl.reduce((qk,) + ecols, 0, max2)
    elif NH == 2:
        maxes = gl.reduce((qk,) + ecols, 0, max3)
    else:
        maxes = gl.reduce((qk,) + ecols, 0, max5)
    return maxes


@gluon.jit
def e4m3x2_to_f16(pairs):
    """Two e4m3 bytes of each int16 (low, high) as two fp16 tensors: one packed conversion per pair."""
    return gl.inline_asm_elementwise(
        "{ .reg .b32 t; cvt.rn.f16x2.e4m3x2 t, $2; mov.b32 {$0, $1}, t; }", "=h,=h,h", [pairs],
        dtype=(gl.float16, gl.float16), is_pure=True, pack=1)


@gluon.jit
def load_vt_pairs(vst, m: gl.constexpr, partial, pair_layout: gl.constexpr, a_layout: gl.constexpr,
                  D: gl.constexpr, BLOCK_N: gl.constexpr):
    """V^T of channels [64 m, 64 m + 64) of a tile stage, ``[64, BLOCK_N]`` fp16 (exact for e4m3) in the MMA's A
    layout, read in 16-bit loads: each thread's two rows r and r + 8 of the A operand are the adjacent channels
    2p and 2p + 1 (``vt_channel``), one int16 per key (half the loads of one byte per element; 8% fewer
    instructions per page, bench/results/history/2026-12-02-hopper-kernel-steps/). Row r of the result is channel
    ``64 m + vt_channel(r)``. On a tile with keys outside the split or the window (``partial``; their
    probabilities are 0) the bytes can be anything: only e4m3's NaN (0x7F, 0xFF) would survive a 0 probability,
    and max(x, -448) (IEEE maxNum) turns it into a number, one packed op per two values."""
    SWIZZLE: gl.constexpr = vst.type.layout.swizzle_byte_width
    layout16: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=SWIZZLE, element_bitwidth=16, rank=2)
    if PUBLIC_REINTERPRET:
        v16 = vst.reinterpret(gl.int16, [BLOCK_N, D // 2], layout16)
    else:
        v16 = vst._reinterpret(gl.int16, [BLOCK_N, D // 2], layout16)
    pairs = v16.slice(32 * m, 32, dim=1).permute((1, 0)).load(pair_layout)  # [32 pairs, BLOCK_N]
    lo, hi = e4m3x2_to_f16(pairs)
    x = gl.join(lo, hi)  # [32, BLOCK_N, 2]
    x = gl.reshape(x, [4, 8, BLOCK_N, 2])
    x = gl.permute(x, (0, 3, 1, 2))  # [p // 8, lo/hi, p % 8, key]
    vt = gl.convert_layout(gl.reshape(x, [64, BLOCK_N]), a_layout)
    if partial:
        vt = gl.maximum(vt, gl.full_like(vt, -448.0))
    return vt


@gluon.jit
def vt_channel(r):
    """The channel (within its 64-channel half) of row r of ``load_vt_pairs``' V^T."""
    return 2 * (r % 8 + 8 * (r // 16)) + (r // 8) % 2


@gluon.constexpr_function
def pair_layout_for(block_n):
    """The int16 layout of ``load_vt_pairs``: [32 channel pairs, block_n keys] spread like the MMA's A operand
    (keys k: bit 0 and 3 and up in registers, bits 1-2 the lane's low bits; pairs: the lane's high bits, then
    the warp)."""
    regs = [[0, 1], [0, 8]] + [[0, 16 << i] for i in range((block_n // 16).bit_length() - 1)]
    return gl.DistributedLinearLayout(reg_bases=regs, lane_bases=[[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=[[8, 0], [16, 0]], block_bases=[], shape=[32, block_n])


@gluon.constexpr_function
def mma_layout(n2, k):
    """The warpgroup MMA's accumulator layout over one warpgroup: ``[16, n2, k]`` instructions (k 32 for the e4m3 K
    dots, 16 for the fp16 V dots)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n2, k])


@gluon.jit
def column_heads(h, G: gl.constexpr, G_PAD: gl.constexpr, cols: gl.constexpr):
    """The N side's ``2 * G_PAD`` columns (every head twice): (column index, each column's query head, whether it is
    a real head, ``[1, N2]``: whether it is a half's second-block column)."""
    offs_c = gl.arange(0, 2 * G_PAD, layout=cols)
    head_of_col = offs_c % G_PAD
    return offs_c, h * G + head_of_col, head_of_col < G, gl.expand_dims(offs_c >= G_PAD, 0)


@gluon.jit
def partial_rows(b, heads, split, max_splits, G: gl.constexpr, HKV: gl.constexpr, HEAD_SPLIT: gl.constexpr):
    """Each head's row of the split workspace (``part_o`` / ``part_lse``, as the merge kernel reads them)."""
    return (b * (HKV * HEAD_SPLIT * G) + heads).to(gl.int64) * max_splits + split


@gluon.jit
def output_rows(right, mask_g, rows: gl.constexpr):
    """The 64 rows of an output half and where to store: each row's own block's columns, real heads only."""
    offs_r = gl.arange(0, 64, layout=rows)
    own = gl.expand_dims(offs_r >= 32, 1) == right  # the columns of each row's own block
    return offs_r, own & gl.expand_dims(mask_g, 0)


@gluon.jit
def split_tiles(lens_ptr, table_ptr, stride_table_row, b, split, window, split_len, max_splits,
                BLOCK_N: gl.constexpr, HAS_WINDOW: gl.constexpr, PAGE_TABLE: gl.constexpr):
    """Request ``b``'s split ``split`` as whole tiles: (seq_len, its page-table row or first CSR entry, the first key
    its window sees, the split's keys ``[tok_begin, tok_end)``, empty when ``tok_begin >= tok_end``).
    ``device.split_bounds`` with page-aligned tiles; ``lens_ptr``: seq_lens (``PAGE_TABLE``) or kv_indptr."""
    if PAGE_TABLE:
        seq_len = gl.load(lens_ptr + b).to(gl.int32)
        row_ptr = table_ptr + b.to(gl.int64) * stride_table_row
    else:
        kv_start = gl.load(lens_ptr + b).to(gl.int64)
        seq_len = (gl.load(lens_ptr + b + 1) - gl.load(lens_ptr + b)).to(gl.int32)
        row_ptr = table_ptr + kv_start
    first = seq_len * 0
    if HAS_WINDOW:
        first = gl.maximum(seq_len - window, 0)
    start0 = (first // BLOCK_N) * BLOCK_N
    length = g_request_split_len(seq_len - start0, split_len, max_splits, BLOCK_N)
    tok_begin = start0 + split * length
    tok_end = gl.minimum(tok_begin + length, seq_len)
    return seq_len, row_ptr, first, tok_begin, tok_end


@gluon.jit
def q_parts_to_shared(q_ptr, b, h, stride_qb, stride_qh, sm_scale, G: gl.constexpr, G_PAD: gl.constexpr,
                      NB: gl.constexpr):
    """Q as two e4m3 parts of one scale in shared memory, ``[NB, N2, 32]`` each (block j's channels, every head
    twice): 16 q' = hi + lo with q' = q * 2**(130 - E) (|q'| < 16, E: max|q|'s biased exponent), hi = 16 e4m3(q')
    (exact), lo = e4m3(16 (q' - e4m3(q'))). Both dots chain into one accumulator and give 16 q'.k exactly for bf16
    q down to about 2**-17 of its largest element (relative error 1e-4 on random q and K over 4096 keys, against 0
    for q in fp16), so K's dots run in e4m3 on the stored bytes, with no conversion of K. Returns (hi, lo, the
    logits' scale: sm_scale * log2(e) over the factors applied to q)."""
    N2: gl.constexpr = 2 * G_PAD
    q_blocked: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([N2, 32], gl.float8e4nv)
    offs_qn = gl.arange(0, N2, layout=gl.SliceLayout(1, q_blocked))
    offs_qc = gl.arange(0, 32, layout=gl.SliceLayout(0, q_blocked))
    q_rows = q_ptr + b * stride_qb + gl.expand_dims((h * G + offs_qn % G_PAD) * stride_qh, 1) \
        + gl.expand_dims(offs_qc, 0)
    q_mask = gl.expand_dims(offs_qn % G_PAD < G, 1) & gl.expand_dims(offs_qc < 32, 0)
    q_max = 0.0
    for j in gl.static_range(NB):
        qj = gl.abs(gl.load(q_rows + 32 * j, mask=q_mask, other=0.0).to(gl.float32))
        q_max = gl.maximum(q_max, gl.max(gl.max(qj, 1), 0))
    q_norm, qk_scale = g_q_power_of_two_norm(q_max, sm_scale * g_log2e())
    q_norm = q_norm * 8.0
    qk_scale = qk_scale * 0.0078125  # 1 / (8 * 16)
    q_hi = gl.allocate_shared_memory(gl.float8e4nv, [NB, N2, 32], q_layout)
    q_lo = gl.allocate_shared_memory(gl.float8e4nv, [NB, N2, 32], q_layout)
    for j in gl.static_range(NB):
        qj = gl.load(q_rows + 32 * j, mask=q_mask, other=0.0).to(gl.float32) * q_norm
        hi = qj.to(gl.float8e4nv).to(gl.float32)
        q_hi.index(j).store((hi * 16.0).to(gl.float8e4nv))
        q_lo.index(j).store(((qj - hi) * 16.0).to(gl.float8e4nv))
    return q_hi, q_lo, qk_scale


@gluon.jit
def issue_k_dots(kst, q_hi, q_lo, mma8: gl.constexpr, NB: gl.constexpr, BLOCK_N: gl.constexpr, N2: gl.constexpr):
    """A tile's K dots, issued (asynchronous): per 32-channel block j, ``[BLOCK_N, N2] = K_j @ (hi_j + lo_j)^T`` in
    e4m3, K straight from the TMA stage ``kst``. Returns one accumulator per block (its K scales come after)."""
    zero8 = gl.zeros([BLOCK_N, N2], gl.float32, layout=mma8)
    parts = ()
    for j in gl.static_range(NB):
        kj = kst.slice(32 * j, 32, dim=1)
        dot = warpgroup_mma(kj, q_hi.index(j).permute((1, 0)), zero8, use_acc=False, is_async=True)
        parts = parts + (warpgroup_mma(kj, q_lo.index(j).permute((1, 0)), dot, is_async=True),)
    return parts


@gluon.jit
def tile_softmax(parts, k_sf, v_sf, m_i, l_acc, units, qk_scale, start, offs_n, mask_n, q_pos, bias_row_ptr, heads,
                 mask_g, right, stride_rb_head, rel_extent, logit_cap, mma: gl.constexpr, NB: gl.constexpr,
                 NH: gl.constexpr, BLOCK_N: gl.constexpr, HAS_REL_BIAS: gl.constexpr, HAS_CAP: gl.constexpr):
    """One tile's online softmax from its K dots (``issue_k_dots``; waited for here): the logits (K scales, bias,
    cap, masked keys), one reduction over the tile's keys for the logits' column maxima and each half's V exponent
    maxima, then the probabilities. Returns (p, alpha (the old state's factor), m_new, l_acc, each half's per-column
    V exponents ``ecols``, the new per-column V units)."""
    parts = warpgroup_mma_wait(num_outstanding=0, deps=parts)
    if NB == 1:
        parts = (parts,)
    qk = gl.zeros([BLOCK_N, parts[0].shape[1]], gl.float32, layout=mma)
    for j in gl.static_range(NB):
        qk += gl.convert_layout(parts[j], mma) * gl.expand_dims(e8m0(scale_byte(k_sf, j)), 1)
    qk = g_decode_logits(qk, qk_scale, start, offs_n, mask_n, q_pos, bias_row_ptr, heads, mask_g, stride_rb_head,
                         rel_extent, logit_cap, BLOCK_N, HAS_REL_BIAS, HAS_CAP, KEYS_FIRST=True)
    # one reduction over the page's keys: the logits' max and each column's V exponent max
    ecols = ()
    for m in gl.static_range(NH):
        e0 = gl.expand_dims(gl.where(mask_n, scale_byte(v_sf, 2 * m), 0), 1)
        e1 = gl.expand_dims(gl.where(mask_n, scale_byte(v_sf, 2 * m + 1), 0), 1)
        ecols = ecols + (gl.where(right, e1, e0),)
    maxes = column_maxes(qk, ecols, NH)
    m_new = gl.maximum(m_i, maxes[0])
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(qk - gl.expand_dims(m_new, 0))
    l_acc = l_acc * gl.expand_dims(alpha, 0) + p
    new_units = ()
    for m in gl.static_range(NH):
        new_units = new_units + (gl.maximum(units[m], maxes[1 + m]),)
    return p, alpha, m_new, l_acc, ecols, new_units


@gluon.jit
def v_block_factor(ecol, unit):
    """Each key's V block scale relative to its column's running unit, ``2**(e - unit)`` (<= 1: fp16-safe)."""
    return e8m0(gl.maximum(ecol - gl.expand_dims(unit, 0), -126) + 127)


@gluon.jit
def acc_rescale(alpha, unit, new_unit):
    """The factor on a half's output accumulator when the softmax maximum and its columns' V units move."""
    return alpha * e8m0(unit - new_unit + 127)


@gluon.jit
def output_factor(l_acc, m_i, sinks_ptr, heads, mask_g, DIRECT: gl.constexpr, HAS_SINKS: gl.constexpr):
    """After the last tile: (the per-column factor on the accumulators before their V units, l_i, m_i), the sinks
    folded in when this program writes the final output."""
    l_i = gl.sum(l_acc, 0)
    if DIRECT and HAS_SINKS:
        scale_old, l_i, m_i = g_fold_sinks(m_i, l_i, sinks_ptr, heads, mask_g)
    else:
        scale_old = gl.full(l_i.shape, 1.0, gl.float32, layout=l_i.type.layout)
    return scale_old / l_i, l_i, m_i


@gluon.jit
def store_half(o, m: gl.constexpr, offs_r, store_mask, heads, part_row, out_ptr, part_o_ptr, b, stride_ob, stride_oh,
               D: gl.constexpr, DIRECT: gl.constexpr):
    """One 64-channel half of the output (rows as ``load_vt_pairs``' V^T: ``vt_channel``), to ``out`` or to the
    split's partial rows."""
    chan = 64 * m + gl.expand_dims(vt_channel(offs_r), 1)
    if DIRECT:
        gl.store(out_ptr + b * stride_ob + gl.expand_dims(heads, 0) * stride_oh + chan,
                 o.to(out_ptr.dtype.element_ty), mask=store_mask)
    else:
        gl.store(part_o_ptr + gl.expand_dims(part_row, 0) * D + chan, o, mask=store_mask)


@gluon.jit
def decode_hopper_kernel(
    q_ptr, k_desc, v_desc, ksf_ptr, vsf_ptr,
    lens_ptr, table_ptr, stride_table_row,
    rel_bias_ptr, sinks_ptr,
    out_ptr, part_o_ptr, part_lse_ptr,
    stride_qb, stride_qh,
    stride_rb_row, stride_rb_head, rel_extent,
    stride_ob, stride_oh,
    sm_scale, logit_cap, window,
    split_len, max_splits,
    G: gl.constexpr, G_PAD: gl.constexpr, D: gl.constexpr, HKV: gl.constexpr,
    HAS_REL_BIAS: gl.constexpr, HAS_WINDOW: gl.constexpr, HAS_CAP: gl.constexpr, HAS_SINKS: gl.constexpr,
    DIRECT: gl.constexpr, NUM_STAGES: gl.constexpr, BLOCK_N: gl.constexpr, ONE_P: gl.constexpr = False,
    PAGE_TABLE: gl.constexpr = True, SLOTS_AHEAD: gl.constexpr = True, HEAD_SPLIT: gl.constexpr = 1,
    TRIGGER_MERGE: gl.constexpr = False,
):
    PAGE: gl.constexpr = HOPPER_PAGE
    NB: gl.constexpr = D // 32
    NH: gl.constexpr = D // 64
    N2: gl.constexpr = 2 * G_PAD
    if TRIGGER_MERGE:  # plan.pdl_merge: the merge may launch now (it waits for this grid before reading)
        gdc_launch_dependents()
    b = gl.program_id(0)
    h = gl.program_id(1)  # the program's G query heads: h * G ..; they read KV head kvh
    split = gl.program_id(2)
    kvh = h // HEAD_SPLIT  # HEAD_SPLIT programs share a KV head whose group is larger than one program's G

    seq_len, row_ptr, first, tok_begin, tok_end = split_tiles(
        lens_ptr, table_ptr, stride_table_row, b, split, window, split_len, max_splits, BLOCK_N, HAS_WINDOW,
        PAGE_TABLE)
    if tok_begin >= tok_end:
        return
    q_pos = seq_len - 1
    n_tiles = (tok_end - tok_begin + BLOCK_N - 1) // BLOCK_N

    mma: gl.constexpr = mma_layout(N2, 16)
    mma8: gl.constexpr = mma_layout(N2, 32)
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    cols: gl.constexpr = gl.SliceLayout(0, mma)
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, N2], gl.float16)

    # the ring: K and V pages, one barrier per stage; issue the first NUM_STAGES - 1 pages now
    k_smem = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, BLOCK_N, D], v_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(bars.index(s), count=1)
    col0 = kvh * D
    for s in gl.static_range(NUM_STAGES - 1):
        if s < n_tiles:
            slot = tile_slot(row_ptr, tok_begin + s * BLOCK_N, PAGE, PAGE_TABLE)
            mbarrier.expect(bars.index(s), 2 * BLOCK_N * D)
            tma_load(k_desc, [slot, col0], bars.index(s), k_smem.index(s))
            tma_load(v_desc, [slot, col0], bars.index(s), v_smem.index(s))
    # SLOTS_AHEAD: the first slots of tiles i + 1 and i + 2 ride in registers (slot_1, slot_2), and tile i + 3's is
    # loaded at the top of iteration i and used one iteration later, so no TMA issue (2 or 3 stages) or scale load
    # waits on a page-table read (a dependent global load, twice per tile otherwise)
    last = n_tiles - 1
    slot_1 = tile_slot(row_ptr, tok_begin + gl.minimum(1, last) * BLOCK_N, PAGE, PAGE_TABLE)
    slot_2 = tile_slot(row_ptr, tok_begin + gl.minimum(2, last) * BLOCK_N, PAGE, PAGE_TABLE)

    q_hi, q_lo, qk_scale = q_parts_to_shared(q_ptr, b, h, stride_qb, stride_qh, sm_scale, G, G_PAD, NB)
    P_BUFFERS: gl.constexpr = 1 if ONE_P else NH
    p_smem = gl.allocate_shared_memory(gl.float16, [P_BUFFERS, BLOCK_N, N2], p_layout)
    fence_async_shared()
    cta_barrier()

    offs_c, heads, mask_g, right = column_heads(h, G, G_PAD, cols)
    offs_t = gl.arange(0, BLOCK_N, layout=rows)
    pairs: gl.constexpr = pair_layout_for(BLOCK_N)

    m_i = gl.full([N2], float("-inf"), gl.float32, layout=cols)
    l_acc = gl.zeros([BLOCK_N, N2], gl.float32, layout=mma)  # per-thread partial sums: one reduction at the end
    accs = ()
    units = ()
    for m in gl.static_range(NH):
        accs = accs + (gl.zeros([64, N2], gl.float32, layout=mma),)
        units = units + (gl.full([N2], 1, gl.int32, layout=cols),)  # per column: its block's V unit

    # scale bytes: one page's per key as words of (up to) 4 blocks, the first page now, then one page ahead
    sf_offs = tile_scale_offsets(tile_slot(row_ptr, tok_begin, PAGE, PAGE_TABLE), offs_t, kvh, HKV, NB, PAGE)
    k_sf = load_scale_words(ksf_ptr, sf_offs, NB)
    v_sf = load_scale_words(vsf_ptr, sf_offs, NB)

    for i in range(0, n_tiles):
        start = tok_begin + i * BLOCK_N
        stage = i % NUM_STAGES
        offs_n = start + offs_t
        mask_n = offs_n < tok_end
        if HAS_WINDOW:
            mask_n = mask_n & (offs_n >= first)
        partial = (start + BLOCK_N > tok_end) | (start < first)

        # refill the stage the previous page used (every warp is past it) with the page NUM_STAGES - 1 ahead
        ahead = i + NUM_STAGES - 1
        slot_3 = tile_slot(row_ptr, tok_begin + gl.minimum(i + 3, last) * BLOCK_N, PAGE, PAGE_TABLE)
        if ahead < n_tiles:
            astage = ahead % NUM_STAGES
            if SLOTS_AHEAD and NUM_STAGES == 3:
                aslot = slot_2
            elif SLOTS_AHEAD and NUM_STAGES == 2:
                aslot = slot_1
            else:
                aslot = tile_slot(row_ptr, tok_begin + ahead * BLOCK_N, PAGE, PAGE_TABLE)
            mbarrier.expect(bars.index(astage), 2 * BLOCK_N * D)
            tma_load(k_desc, [aslot, col0], bars.index(astage), k_smem.index(astage))
            tma_load(v_desc, [aslot, col0], bars.index(astage), v_smem.index(astage))
        # the next page's scale bytes, in flight during this page's math
        if SLOTS_AHEAD:
            nslot = slot_1
        else:
            nslot = tile_slot(row_ptr, tok_begin + gl.minimum(i + 1, last) * BLOCK_N, PAGE, PAGE_TABLE)
        nsf_offs = tile_scale_offsets(nslot, offs_t, kvh, HKV, NB, PAGE)
        nk_sf = load_scale_words(ksf_ptr, nsf_offs, NB)
        nv_sf = load_scale_words(vsf_ptr, nsf_offs, NB)

        mbarrier.wait(bars.index(stage), (i // NUM_STAGES) & 1)
        kst = k_smem.index(stage)
        vst = v_smem.index(stage)
        # all the page's K dots at once, then V^T's first half into registers while they run
        parts = issue_k_dots(kst, q_hi, q_lo, mma8, NB, BLOCK_N, N2)
        vt = load_vt_pairs(vst, 0, partial, pairs, a_op, D, BLOCK_N)
        p, alpha, m_i, l_acc, ecols, new_units = tile_softmax(
            parts, k_sf, v_sf, m_i, l_acc, units, qk_scale, start, offs_n, mask_n, q_pos,
            rel_bias_ptr + b * stride_rb_row, heads, mask_g, right, stride_rb_head, rel_extent, logit_cap, mma, NB, NH,
            BLOCK_N, HAS_REL_BIAS, HAS_CAP)

        if ONE_P:
            # one P' buffer for all halves (4 KiB less shared memory): each half's dots finish before the next
            # half's probabilities overwrite it
            new_accs = ()
            for m in gl.static_range(NH):
                f = v_block_factor(ecols[m], new_units[m])
                p_smem.index(0).store((p * f).to(gl.float16))
                if m > 0:
                    vt = load_vt_pairs(vst, m, partial, pairs, a_op, D, BLOCK_N)
                fence_async_shared()
                cta_barrier()
                acc = accs[m] * gl.expand_dims(acc_rescale(alpha, units[m], new_units[m]), 0)
                acc = warpgroup_mma(vt, p_smem.index(0), acc, is_async=True)
                new_accs = new_accs + (warpgroup_mma_wait(num_outstanding=0, deps=(acc,)),)
            accs = new_accs
        else:
            for m in gl.static_range(NH):
                f = v_block_factor(ecols[m], new_units[m])
                p_smem.index(m).store((p * f).to(gl.float16))
            fence_async_shared()
            cta_barrier()
            new_accs = ()
            for m in gl.static_range(NH):
                if m > 0:
                    vt = load_vt_pairs(vst, m, partial, pairs, a_op, D, BLOCK_N)
                acc = accs[m] * gl.expand_dims(acc_rescale(alpha, units[m], new_units[m]), 0)
                new_accs = new_accs + (warpgroup_mma(vt, p_smem.index(m), acc, is_async=True),)
            accs = warpgroup_mma_wait(num_outstanding=0, deps=new_accs)
            if NH == 1:
                accs = (accs,)
        units = new_units
        k_sf = nk_sf
        v_sf = nv_sf
        slot_1 = slot_2  # (dead code without SLOTS_AHEAD)
        slot_2 = slot_3
        # No barrier before the next page refills this stage and rewrites p_smem: each warp issued the V dots (a
        # warpgroup MMA starts when all four warps have issued it, so every warp has loaded V^T) and waited for them.

    for s in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(bars.index(s))

    o_scale, l_i, m_i = output_factor(l_acc, m_i, sinks_ptr, heads, mask_g, DIRECT, HAS_SINKS)
    offs_r, store_mask = output_rows(right, mask_g, rows)
    part_row = partial_rows(b, heads, split, max_splits, G, HKV, HEAD_SPLIT)
    for m in gl.static_range(NH):
        o = accs[m] * gl.expand_dims(o_scale * e8m0(units[m]), 0)
        store_half(o, m, offs_r, store_mask, heads, part_row, out_ptr, part_o_ptr, b, stride_ob, stride_oh, D, DIRECT)
    if not DIRECT:
        gl.store(part_lse_ptr + part_row, m_i + gl.log2(l_i), mask=mask_g & (offs_c < G_PAD))


def hopper_tensor_maps(kv, head_dim: int, block_n: int):
    """The pool-wide TMA descriptors of K and V: each buffer as ``[slots, Hkv * D]`` with a ``[block_n, D]`` box.
    Kept on ``kv`` (a host that keeps one PagedKV per layer builds each layer's pair once, not once per launch; the
    descriptors hold views of the buffers, so they live exactly as long as ``kv``)."""
    key = (kv.k_buffer.data_ptr(), kv.v_buffer.data_ptr(), head_dim, block_n)
    cached = getattr(kv, "_hopper_tensor_maps", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    maps = _build_tensor_maps(kv, head_dim, block_n)
    kv._hopper_tensor_maps = (key, maps)
    return maps


def _build_tensor_maps(kv, head_dim: int, block_n: int):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout.get_default_for([block_n, head_dim], gl.float8e4nv)
    maps = []
    for name in ("k_buffer", "v_buffer"):
        buf = getattr(kv, name)
        slots, hkv, d = buf.shape
        if buf.stride(2) != 1 or buf.stride(1) != d or (buf.stride(0) % 16) or buf.data_ptr() % 16:
            raise ValueError(f"kernel='hopper' reads {name} by TMA: it needs each slot's heads contiguous "
                             f"(strides (s, {d}, 1) with s a multiple of 16, 16-byte aligned), got strides "
                             f"{tuple(buf.stride())}")
        flat = buf.as_strided((slots, hkv * d), (buf.stride(0), 1))
        maps.append(TensorDescriptor(flat, [slots, hkv * d], [buf.stride(0), 1], [block_n, d], layout))
    return maps


def launch_decode_hopper(plan, q, kv, params, out, lens, index, stride_index_row, table, sf, dummy, kernel=None,
                         options=None):
    """Stage 1 on Hopper: one program per (request, KV head, split), as the Triton kernels' grid. ``kernel`` /
    ``options``: another kernel of the same arguments and its launch options (``decode_hopper_ws``'s launcher);
    this module's kernel by default. ``lens`` /
    ``index``: seq_lens and the page table (``table``), or kv_indptr and the per-key slots of whole pages."""
    import triton

    batch, hq, d = q.shape
    hkv = kv.num_kv_heads
    # a benchmark's variant may set the programs per KV head (HEAD_SPLIT 1: GQA 16 on one program)
    head_split = EXTRA_CONSTEXPRS.get("HEAD_SPLIT", hopper_head_split(hq // hkv))
    if (hq // hkv) % head_split:
        raise ValueError(f"HEAD_SPLIT={head_split} does not divide the {hq // hkv} query heads per KV head")
    group = hq // hkv // head_split
    k_map, v_map = hopper_tensor_maps(kv, d, plan.block_n)
    rb = params.rel_bias
    direct = plan.num_splits == 1
    constexprs = dict(
        G=group, G_PAD=max(8, triton.next_power_of_2(group)), D=d, HKV=hkv,
        HAS_REL_BIAS=rb is not None, HAS_WINDOW=params.window is not None, HAS_CAP=params.logit_cap > 0,
        HAS_SINKS=params.sinks is not None, DIRECT=direct, NUM_STAGES=plan.num_stages, BLOCK_N=plan.block_n,
        PAGE_TABLE=table, HEAD_SPLIT=head_split, TRIGGER_MERGE=plan.pdl_merge)
    if kernel is None:
        kernel, options = decode_hopper_kernel, dict(num_warps=HOPPER_NUM_WARPS, **_launch_options(plan))
    constexprs.update(options)
    constexprs.update(EXTRA_CONSTEXPRS)  # a benchmark's variant may replace any of them (G_PAD 4: N = 8 columns)
    if constexprs["G_PAD"] < group:
        raise ValueError(f"G_PAD={constexprs['G_PAD']} holds fewer than the program's {group} query heads")
    kernel[(batch, hkv * head_split, plan.num_splits)](
        q, k_map, v_map, sf[0], sf[1],
        lens, index, stride_index_row,
        rb if rb is not None else dummy, params.sinks if params.sinks is not None else dummy,
        out, plan.part_o if not direct else dummy, plan.part_lse if not direct else dummy,
        q.stride(0), q.stride(1),
        rb.stride(0) if rb is not None else 0, rb.stride(1) if rb is not None else 0,
        rb.shape[2] if rb is not None else 0,
        out.stride(0), out.stride(1),
        float(params.softmax_scale), float(params.logit_cap),
        params.window if params.window is not None else 0,
        plan.split_len, plan.num_splits,
        **constexprs,
    )


# Constexpr overrides for every launch, for a benchmark that times kernel variants in one run (empty otherwise):
# bench/bench_decode.py's BENCH_HOPPER_VARIANTS '{"name": {"constexprs": {"SLOTS_AHEAD": false}}}'
EXTRA_CONSTEXPRS: dict = {}


def _launch_options(plan):
    """Variant constexprs and launch options by stage count (offline ptxas for sm_90a, head_dim 128, 128-key
    tiles; other shapes take the defaults):
    - 2 stages: one P' buffer and at most 168 registers, so 3 programs fit an SM (74.5 KiB of shared memory each;
      64 bytes of spills; slower than the 3-stage kernel on the H200 decode grid);
    - 3 stages (the plan's): 111 KiB and 223 registers on Triton 3.6 (tools/compile_hopper.py), 2 programs per SM."""
    two_stage_128 = plan.num_stages == 2 and plan.block_n == 128 and plan.head_dim == 128
    return {"ONE_P": True, "maxnreg": 168} if two_stage_128 else {}
