"""Decode stage 1 for Hopper, warp-specialized: ``decode_hopper_ws_kernel`` (``DecodeConfig(kernel="hopper_ws")``).

The same plan, workspace, merge, semantics and per-tile math as ``decode_hopper.decode_hopper_kernel`` (its helpers
are this kernel's), split over two warpgroups of one program that work on different tiles at once:
- the softmax warpgroup (the default partition, 4 warps): waits for a tile's K, runs its K dots, the logits and the
  online softmax, and hands the probabilities P' (one ``[BLOCK_N, N2]`` fp16 buffer per 64-channel half, as in the
  one-warpgroup kernel) and each half's accumulator factor to the other warpgroup through shared memory;
- the value warpgroup (a worker partition, 4 warps): loads V^T of the same tile into registers before P' is ready,
  runs the V dots on P', then refills the tile's stage by TMA with the tile ``NUM_STAGES`` ahead (it is the stage's
  last reader: the softmax warpgroup's K dots of that tile finished before its P' was handed over), and at the end
  writes the output.
So the softmax of tile i+1 runs while the V dots of tile i do, where the one-warpgroup kernel runs them in turn
(docs/HOPPER_DECODE.md: one warpgroup per program left no eligible warp in about half the cycles).

Hand-over, ``P_SETS`` P' buffer sets (1 by default; ``p_ready`` / ``p_empty`` per set, one arrival each; tile i
uses set ``i % P_SETS``): with one set the softmax warpgroup computes tile i+1's probabilities in registers while the
value warpgroup still reads tile i's, and stores them once ``p_empty`` says those dots finished; with two it runs up
to two tiles ahead (8 KiB more shared memory at head_dim 128: 2 stages to fit two programs per SM). Each side runs
a partition-wide barrier before it arrives, so the arrival follows every warp's stores or reads, not only the first
thread's. The final output factors go through their own buffer (``o_ready``).

A split with no keys runs no tiles and stores nothing (its page-table and scale reads are clamped to the request's
first tile, or skipped, so they stay inside the buffers).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma, \
    warpgroup_mma_wait

from .decode_hopper import (HOPPER_PAGE, acc_rescale, column_heads, cta_barrier, e8m0, issue_k_dots,
                            launch_decode_hopper, load_scale_words, load_vt_pairs, mma_layout, output_factor,
                            output_rows, pair_layout_for, partial_rows, q_parts_to_shared, split_tiles, store_half,
                            tile_scale_offsets, tile_slot, tile_softmax, tma_load, v_block_factor)
from .device import gdc_launch_dependents
from .mbarrier_ring import ring_slot

g_ring_slot = gluon.jit(ring_slot)  # (buffer, phase parity) of a ring's use: shared with the hand-over model
HOPPER_WS_NUM_WARPS = 4  # the softmax warpgroup; the value warpgroup adds 4 more
HOPPER_WS_VALUE_WARPS = gl.constexpr(4)
# Registers per thread: a launch's maxnreg is what every warp starts with; the value warpgroup drops to
# VALUE_REGS and the softmax warpgroup takes the rest, (MAXNREG * 8 - VALUE_REGS * 4) / 4 per thread. 128 fits two
# programs (16 warps) in one SM's 64K registers.
HOPPER_WS_MAXNREG = 128
HOPPER_WS_VALUE_REGS = gl.constexpr(96)


@gluon.jit
def guarded_tile_slot(row_ptr, start, has_work, PAGE: gl.constexpr, PAGE_TABLE: gl.constexpr):
    """``tile_slot`` for a split that may be empty: slot 0 (a valid pool row) without reading the index when there
    is no work (``start`` may then lie past the request's page-table row or CSR entries)."""
    if PAGE_TABLE:
        page = gl.load(row_ptr + start // PAGE, mask=has_work, other=0).to(gl.int32)
        slot = page * PAGE + start % PAGE
    else:
        slot = gl.load(row_ptr + start, mask=has_work, other=0).to(gl.int32)
    return gl.where(has_work, slot, 0)


@gluon.jit
def ws_softmax_partition(
    q_hi, q_lo, k_smem, p_smem, r_smem, f_smem, kv_ready, p_ready, p_empty, o_ready,
    ksf_ptr, vsf_ptr, row_ptr, bias_row_ptr, sinks_ptr, part_lse_ptr,
    b, h, split, kvh, tok_begin, tok_end, first, n_tiles, has_work, q_pos, qk_scale,
    stride_rb_head, rel_extent, logit_cap, max_splits,
    G: gl.constexpr, G_PAD: gl.constexpr, D: gl.constexpr, HKV: gl.constexpr,
    HAS_REL_BIAS: gl.constexpr, HAS_WINDOW: gl.constexpr, HAS_CAP: gl.constexpr, HAS_SINKS: gl.constexpr,
    DIRECT: gl.constexpr, NUM_STAGES: gl.constexpr, BLOCK_N: gl.constexpr, PAGE_TABLE: gl.constexpr,
    HEAD_SPLIT: gl.constexpr, P_SETS: gl.constexpr,
):
    PAGE: gl.constexpr = HOPPER_PAGE
    NB: gl.constexpr = D // 32
    NH: gl.constexpr = D // 64
    N2: gl.constexpr = 2 * G_PAD
    mma: gl.constexpr = mma_layout(N2, 16)
    mma8: gl.constexpr = mma_layout(N2, 32)
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    cols: gl.constexpr = gl.SliceLayout(0, mma)

    offs_c, heads, mask_g, right = column_heads(h, G, G_PAD, cols)
    offs_t = gl.arange(0, BLOCK_N, layout=rows)

    m_i = gl.full([N2], float("-inf"), gl.float32, layout=cols)
    l_acc = gl.zeros([BLOCK_N, N2], gl.float32, layout=mma)
    units = ()
    for m in gl.static_range(NH):
        units = units + (gl.full([N2], 1, gl.int32, layout=cols),)

    # scale bytes one tile ahead (this tile's now), the page-table entry two ahead
    last = gl.maximum(n_tiles - 1, 0)
    slot_0 = guarded_tile_slot(row_ptr, tok_begin, has_work, PAGE, PAGE_TABLE)
    slot_1 = guarded_tile_slot(row_ptr, tok_begin + gl.minimum(1, last) * BLOCK_N, has_work, PAGE, PAGE_TABLE)
    sf_offs = tile_scale_offsets(slot_0, offs_t, kvh, HKV, NB, PAGE)
    k_sf = load_scale_words(ksf_ptr, sf_offs, NB)
    v_sf = load_scale_words(vsf_ptr, sf_offs, NB)

    for i in range(0, n_tiles):
        start = tok_begin + i * BLOCK_N
        stage, kv_phase = g_ring_slot(i, NUM_STAGES)
        offs_n = start + offs_t
        mask_n = offs_n < tok_end
        if HAS_WINDOW:
            mask_n = mask_n & (offs_n >= first)
        slot_2 = tile_slot(row_ptr, tok_begin + gl.minimum(i + 2, last) * BLOCK_N, PAGE, PAGE_TABLE)
        nsf_offs = tile_scale_offsets(slot_1, offs_t, kvh, HKV, NB, PAGE)
        nk_sf = load_scale_words(ksf_ptr, nsf_offs, NB)
        nv_sf = load_scale_words(vsf_ptr, nsf_offs, NB)

        mbarrier.wait(kv_ready.index(stage), kv_phase)
        parts = issue_k_dots(k_smem.index(stage), q_hi, q_lo, mma8, NB, BLOCK_N, N2)
        p, alpha, m_i, l_acc, ecols, new_units = tile_softmax(
            parts, k_sf, v_sf, m_i, l_acc, units, qk_scale, start, offs_n, mask_n, q_pos, bias_row_ptr, heads,
            mask_g, right, stride_rb_head, rel_extent, logit_cap, mma, NB, NH, BLOCK_N, HAS_REL_BIAS, HAS_CAP)

        # hand P' and the accumulators' factors over once the value warpgroup is done with the last tile's
        ps, p_phase = g_ring_slot(i, P_SETS)
        # the set's previous use released (a fresh barrier passes the flipped parity: a set's first use does not wait)
        mbarrier.wait(p_empty.index(ps), p_phase ^ 1)
        for m in gl.static_range(NH):
            p_smem.index(ps * NH + m).store((p * v_block_factor(ecols[m], new_units[m])).to(gl.float16))
            r_smem.index(ps * NH + m).store(acc_rescale(alpha, units[m], new_units[m]))
        fence_async_shared()  # P' is read by the value warpgroup's MMAs (the async proxy)
        cta_barrier()
        mbarrier.arrive(p_ready.index(ps), count=1)
        units = new_units
        k_sf = nk_sf
        v_sf = nv_sf
        slot_1 = slot_2

    o_scale, l_i, m_i = output_factor(l_acc, m_i, sinks_ptr, heads, mask_g, DIRECT, HAS_SINKS)
    for m in gl.static_range(NH):
        f_smem.index(m).store(o_scale * e8m0(units[m]))
    cta_barrier()
    mbarrier.arrive(o_ready, count=1)
    if not DIRECT:
        part_row = partial_rows(b, heads, split, max_splits, G, HKV, HEAD_SPLIT)
        gl.store(part_lse_ptr + part_row, m_i + gl.log2(l_i), mask=mask_g & (offs_c < G_PAD) & has_work)


@gluon.jit
def ws_value_partition(
    k_desc, v_desc, k_smem, v_smem, p_smem, r_smem, f_smem, kv_ready, p_ready, p_empty, o_ready,
    row_ptr, out_ptr, part_o_ptr,
    b, h, split, kvh, tok_begin, tok_end, first, n_tiles, has_work, stride_ob, stride_oh, max_splits,
    G: gl.constexpr, G_PAD: gl.constexpr, D: gl.constexpr, HKV: gl.constexpr, DIRECT: gl.constexpr,
    NUM_STAGES: gl.constexpr, BLOCK_N: gl.constexpr, PAGE_TABLE: gl.constexpr, HEAD_SPLIT: gl.constexpr,
    P_SETS: gl.constexpr,
):
    PAGE: gl.constexpr = HOPPER_PAGE
    NH: gl.constexpr = D // 64
    N2: gl.constexpr = 2 * G_PAD
    mma: gl.constexpr = mma_layout(N2, 16)
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    cols: gl.constexpr = gl.SliceLayout(0, mma)
    pairs: gl.constexpr = pair_layout_for(BLOCK_N)

    accs = ()
    for m in gl.static_range(NH):
        accs = accs + (gl.zeros([64, N2], gl.float32, layout=mma),)
    col0 = kvh * D
    last = gl.maximum(n_tiles - 1, 0)
    for i in range(0, n_tiles):
        start = tok_begin + i * BLOCK_N
        stage, kv_phase = g_ring_slot(i, NUM_STAGES)
        partial = (start + BLOCK_N > tok_end) | (start < first)
        ahead = i + NUM_STAGES
        aslot = tile_slot(row_ptr, tok_begin + gl.minimum(ahead, last) * BLOCK_N, PAGE, PAGE_TABLE)

        mbarrier.wait(kv_ready.index(stage), kv_phase)
        vst = v_smem.index(stage)
        vt = load_vt_pairs(vst, 0, partial, pairs, a_op, D, BLOCK_N)  # before P' is ready
        ps, p_phase = g_ring_slot(i, P_SETS)
        mbarrier.wait(p_ready.index(ps), p_phase)
        new_accs = ()
        for m in gl.static_range(NH):
            if m > 0:
                vt = load_vt_pairs(vst, m, partial, pairs, a_op, D, BLOCK_N)
            acc = accs[m] * gl.expand_dims(r_smem.index(ps * NH + m).load(cols), 0)
            new_accs = new_accs + (warpgroup_mma(vt, p_smem.index(ps * NH + m), acc, is_async=True),)
        accs = warpgroup_mma_wait(num_outstanding=0, deps=new_accs)
        if NH == 1:
            accs = (accs,)
        cta_barrier()  # every warp's V dots (reads of P' and of the stage) are done
        mbarrier.arrive(p_empty.index(ps), count=1)
        if ahead < n_tiles:
            fence_async_shared()  # the stage's generic-proxy reads (V^T) before the TMA write
            mbarrier.expect(kv_ready.index(stage), 2 * BLOCK_N * D)
            tma_load(k_desc, [aslot, col0], kv_ready.index(stage), k_smem.index(stage))
            tma_load(v_desc, [aslot, col0], kv_ready.index(stage), v_smem.index(stage))

    _, heads, mask_g, right = column_heads(h, G, G_PAD, cols)
    offs_r, store_mask = output_rows(right, mask_g, rows)
    store_mask = store_mask & has_work
    part_row = partial_rows(b, heads, split, max_splits, G, HKV, HEAD_SPLIT)
    mbarrier.wait(o_ready, 0)
    for m in gl.static_range(NH):
        o = accs[m] * gl.expand_dims(f_smem.index(m).load(cols), 0)
        store_half(o, m, offs_r, store_mask, heads, part_row, out_ptr, part_o_ptr, b, stride_ob, stride_oh, D, DIRECT)


@gluon.jit
def decode_hopper_ws_kernel(
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
    DIRECT: gl.constexpr, NUM_STAGES: gl.constexpr, BLOCK_N: gl.constexpr, PAGE_TABLE: gl.constexpr = True,
    HEAD_SPLIT: gl.constexpr = 1, VALUE_REGS: gl.constexpr = HOPPER_WS_VALUE_REGS, P_SETS: gl.constexpr = 1,
    TRIGGER_MERGE: gl.constexpr = False,
):
    """The arguments of ``decode_hopper_kernel`` (one program per request, KV head (times HEAD_SPLIT) and split);
    ``VALUE_REGS``: the value warpgroup's registers (the softmax warpgroup takes the rest of the launch's);
    ``P_SETS``: P' buffer sets between the warpgroups."""
    PAGE: gl.constexpr = HOPPER_PAGE
    NB: gl.constexpr = D // 32
    NH: gl.constexpr = D // 64
    N2: gl.constexpr = 2 * G_PAD
    if TRIGGER_MERGE:  # plan.pdl_merge: the merge may launch now (it waits for this grid before reading)
        gdc_launch_dependents()
    b = gl.program_id(0)
    h = gl.program_id(1)
    split = gl.program_id(2)
    kvh = h // HEAD_SPLIT

    seq_len, row_ptr, first, tok_begin, tok_end = split_tiles(
        lens_ptr, table_ptr, stride_table_row, b, split, window, split_len, max_splits, BLOCK_N, HAS_WINDOW,
        PAGE_TABLE)
    # no early return (the worker warps wait for the partitions): an empty split runs 0 tiles from the request's
    # first tile, which lies inside its page-table row
    has_work = tok_begin < tok_end
    tok_begin = gl.where(has_work, tok_begin, (first // BLOCK_N) * BLOCK_N)
    n_tiles = gl.where(has_work, (tok_end - tok_begin + BLOCK_N - 1) // BLOCK_N, 0)
    q_pos = seq_len - 1

    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, N2], gl.float16)
    vec_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])  # of a row
    k_smem = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float8e4nv, [NUM_STAGES, BLOCK_N, D], v_desc.layout)
    p_smem = gl.allocate_shared_memory(gl.float16, [P_SETS * NH, BLOCK_N, N2], p_layout)
    r_smem = gl.allocate_shared_memory(gl.float32, [P_SETS * NH, N2], vec_layout)  # per tile: each half's factor
    f_smem = gl.allocate_shared_memory(gl.float32, [NH, N2], vec_layout)  # at the end: the output factors
    kv_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [P_SETS, 1], mbarrier.MBarrierLayout())
    p_empty = gl.allocate_shared_memory(gl.int64, [P_SETS, 1], mbarrier.MBarrierLayout())
    o_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(kv_ready.index(s), count=1)
    for s in gl.static_range(P_SETS):
        mbarrier.init(p_ready.index(s), count=1)
        mbarrier.init(p_empty.index(s), count=1)
    mbarrier.init(o_ready, count=1)
    # every stage's first tile now; the value warpgroup refills each stage after its last read of it
    col0 = kvh * D
    for s in gl.static_range(NUM_STAGES):
        if s < n_tiles:
            slot = tile_slot(row_ptr, tok_begin + s * BLOCK_N, PAGE, PAGE_TABLE)
            mbarrier.expect(kv_ready.index(s), 2 * BLOCK_N * D)
            tma_load(k_desc, [slot, col0], kv_ready.index(s), k_smem.index(s))
            tma_load(v_desc, [slot, col0], kv_ready.index(s), v_smem.index(s))
    q_hi, q_lo, qk_scale = q_parts_to_shared(q_ptr, b, h, stride_qb, stride_qh, sm_scale, G, G_PAD, NB)
    fence_async_shared()
    cta_barrier()

    gl.warp_specialize([
        (ws_softmax_partition, (
            q_hi, q_lo, k_smem, p_smem, r_smem, f_smem, kv_ready, p_ready, p_empty, o_ready,
            ksf_ptr, vsf_ptr, row_ptr, rel_bias_ptr + b * stride_rb_row, sinks_ptr, part_lse_ptr,
            b, h, split, kvh, tok_begin, tok_end, first, n_tiles, has_work, q_pos, qk_scale,
            stride_rb_head, rel_extent, logit_cap, max_splits,
            G, G_PAD, D, HKV, HAS_REL_BIAS, HAS_WINDOW, HAS_CAP, HAS_SINKS, DIRECT, NUM_STAGES, BLOCK_N, PAGE_TABLE,
            HEAD_SPLIT, P_SETS)),
        (ws_value_partition, (
            k_desc, v_desc, k_smem, v_smem, p_smem, r_smem, f_smem, kv_ready, p_ready, p_empty, o_ready,
            row_ptr, out_ptr, part_o_ptr,
            b, h, split, kvh, tok_begin, tok_end, first, n_tiles, has_work, stride_ob, stride_oh, max_splits,
            G, G_PAD, D, HKV, DIRECT, NUM_STAGES, BLOCK_N, PAGE_TABLE, HEAD_SPLIT, P_SETS)),
    ], [HOPPER_WS_VALUE_WARPS], [VALUE_REGS])


def launch_decode_hopper_ws(plan, q, kv, params, out, lens, index, stride_index_row, table, sf, dummy):
    """``decode_hopper.launch_decode_hopper`` with this kernel: the same grid, arguments and head split."""
    launch_decode_hopper(plan, q, kv, params, out, lens, index, stride_index_row, table, sf, dummy,
                         kernel=decode_hopper_ws_kernel,
                         options=dict(num_warps=HOPPER_WS_NUM_WARPS, maxnreg=HOPPER_WS_MAXNREG))
