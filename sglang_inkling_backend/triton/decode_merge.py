"""Decode stage 2: ``decode_merge_kernel`` merges the splits' partial results (output and base-2 log-sum-exp) of
one (request, query head, block of channels) and folds in the sinks. Skipped when a batch needs one split.
Small batches spread it over more programs (``plan.choose_merge_block_d``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .device import gdc_wait, log2e, request_split_len


@triton.jit
def decode_merge_kernel(
    part_o_ptr, part_lse_ptr, lens_ptr, sinks_ptr, out_ptr,
    stride_ob, stride_oh, window, split_len, max_splits,
    HQ: tl.constexpr, D: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr, ALIGN: tl.constexpr, BLOCK_D: tl.constexpr, PAGE_TABLE: tl.constexpr,
    BLOCK_N: tl.constexpr, WAIT_PRIMARY: tl.constexpr = False,
):
    # ALIGN: stage 1's splits start at a multiple of ALIGN keys before the window (block_n for page-aligned tiles).
    # One program per (request, query head, BLOCK_D channels): small batches spread the merge over more programs.
    # lens_ptr: kv_indptr (CSR), or seq_lens (PAGE_TABLE), as in stage 1.
    b = tl.program_id(0)
    hq = tl.program_id(1)
    if PAGE_TABLE:
        seq_len = tl.load(lens_ptr + b).to(tl.int32)
    else:
        seq_len = (tl.load(lens_ptr + b + 1) - tl.load(lens_ptr + b)).to(tl.int32)
    n_keys = seq_len
    if HAS_WINDOW:
        n_keys = seq_len - (tl.maximum(seq_len - window, 0) // ALIGN) * ALIGN
    length = request_split_len(n_keys, split_len, max_splits, BLOCK_N)  # stage 1's split length for this request
    n_splits = (n_keys + length - 1) // length
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_s = tl.arange(0, SPLIT_BLOCK)
    row0 = (b * HQ + hq).to(tl.int64) * max_splits
    if WAIT_PRIMARY:  # launched early (plan.pdl_merge): stage 1's partial rows are complete and visible after this
        gdc_wait()
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
        sink = tl.load(sinks_ptr + hq).to(tl.float32) * log2e()
        m_new = tl.maximum(m, sink)
        a = tl.exp2(m - m_new)
        acc = acc * a
        l = l * a + tl.exp2(sink - m_new)
    tl.store(out_ptr + b * stride_ob + hq * stride_oh + offs_d, (acc / l).to(out_ptr.dtype.element_ty))
