"""Paged extend (prefill with a cached prefix, chunked prefill) attention in Triton over bf16/fp16/fp32, per-tensor
fp8 and MXFP8 pools.

Semantics are ``sglang_inkling_backend.reference.attention.paged_extend_attention``: request b's query rows
``qo_indptr[b]:qo_indptr[b+1]`` are its last positions and see, causally, every key of the request that the window
allows. One program handles ``BLOCK_M`` query rows of one request for all ``G`` query heads of one KV head (rows
are (token, head) pairs), so a K/V tile is read and dequantized once for the whole group. K/V are dequantized tile
by tile exactly as in the decode kernel (``load_kv_tile``). This is the correct-first path: it shares the decode
kernel's tile loader and makes no attempt at Hopper-specific tuning.

The keys come as a per-token CSR (``kv_indptr``, ``kv_indices``) or as a page table (``page_table [B, max_pages]``
int32 page ids, ``seq_lens [B]``, ``page_size``). With a page table the kernel reads the page ids itself (slot of
key ``t``: ``page_table[b, t // P] * P + t % P``; no per-token list is built), positions are absolute, and a
windowed layer masks the loads before the block's first window position, so no page entirely before the window is
read.

A speculative verify step (``verify``: ``attention_inputs.SpecVerify``, per-token CSR keys) is the same extend with
each request's query rows its draft tokens: a draft's position, as a query and as a key, is the prefix length plus
its depth in the tree, and a draft sees another draft only where the request's tree mask says so (every prefix key
within the window).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from ..attention_inputs import AttentionParams, PagedKV, SpecVerify
from ..checks import is_power_of_two, require_device, require_int_value
from .device import add_logit_bias, cap_logits, load_kv_tile, log2e, scale_logits
from .inputs import (check_index_tensor, check_kv_map, check_query_and_pool, dot_dtype, kv_format_code, launch_scalars,
                     kv_data, launch_strides, scale_args, validate_page_table)
from .plan import MAX_VERIFY_SPLITS, VERIFY_MIN_SPLIT_KEYS, DecodeWorkspace, choose_verify_splits, num_sms


@triton.jit
def attend_key_tiles(
    q, tok, pos, heads, mask_r, mask_row, prefix, q_start, first_pos, first_key, lo, hi, h, idx_ptr,
    k_ptr, v_ptr, ksf_ptr, vsf_ptr, rel_bias_ptr, tree_mask_ptr, depth_ptr,
    stride_k_slot, stride_k_head, stride_v_slot, stride_v_head, stride_rb_row, stride_rb_head, rel_extent,
    qk_scale, logit_cap, window,
    BLOCK_R: tl.constexpr, D: tl.constexpr, HKV: tl.constexpr, BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr,
    PAGE: tl.constexpr, INTERLEAVED: tl.constexpr, DOT_DTYPE: tl.constexpr, HAS_REL_BIAS: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_CAP: tl.constexpr, PAGE_TABLE: tl.constexpr, KV_PAGE: tl.constexpr,
    HAS_TREE: tl.constexpr, GUARDED: tl.constexpr,
):
    # The online softmax over key tiles [lo, hi) of one block: (acc, l_i, m_i), unnormalized. GUARDED: each V tile
    # is checked for NaN/inf, and one that holds any takes the reference's per-channel semantics (below). The check
    # in every tile costs 2.0-3.5x the kernel's time on an H100 (bench/results/current/2026-12-07-extend-guard), so
    # extend_kernel runs the loop unguarded, and again guarded only for a block whose accumulator came out
    # non-finite, which any non-finite V it read makes it: in p @ v a NaN reaches every row and an inf every row
    # (0 x inf is NaN), and no later tile makes either finite again.
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        if PAGE_TABLE:
            if HAS_WINDOW:
                mask_n = mask_n & (offs_n >= first_key)  # no page entirely before the window is read
            pages = tl.load(idx_ptr + offs_n // KV_PAGE, mask=mask_n, other=0).to(tl.int64)
            slots = pages * KV_PAGE + offs_n % KV_PAGE
        else:
            slots = tl.load(idx_ptr + offs_n, mask=mask_n, other=0).to(tl.int64)
        k = load_kv_tile(k_ptr, ksf_ptr, slots, mask_n, h, stride_k_slot, stride_k_head,
                         HKV, D, BLOCK_N, KV_FORMAT, PAGE, INTERLEAVED, DOT_DTYPE)
        qk = tl.dot(q, tl.trans(k))
        key_pos = offs_n
        if HAS_TREE:
            draft = offs_n - prefix  # the key's draft index, for keys past the prefix
            is_draft = mask_n & (draft >= 0)
            key_pos = tl.where(is_draft, prefix + tl.load(depth_ptr + q_start + draft, mask=is_draft, other=0)
                               .to(tl.int32), offs_n)
        dist = pos[:, None] - key_pos[None, :]
        keep = mask_r[:, None] & mask_n[None, :] & (dist >= 0)
        if HAS_TREE:
            seen = tl.load(tree_mask_ptr + mask_row[:, None] + draft[None, :],
                           mask=mask_r[:, None] & is_draft[None, :], other=1)
            keep = keep & (seen != 0)
        if HAS_WINDOW:
            keep = keep & (dist <= window - 1)
        qk = scale_logits(qk, qk_scale, HAS_CAP)
        if HAS_REL_BIAS:
            if start + BLOCK_N - 1 > first_pos - rel_extent:
                in_reach = keep & (dist < rel_extent)
                bias = tl.load(rel_bias_ptr + tok.to(tl.int64)[:, None] * stride_rb_row
                               + heads[:, None] * stride_rb_head + dist, mask=in_reach, other=0.0).to(tl.float32)
                qk = add_logit_bias(qk, bias, HAS_CAP)
        qk = tl.where(keep, cap_logits(qk, logit_cap, HAS_CAP), float("-inf"))

        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: keep everything at 0
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_kv_tile(v_ptr, vsf_ptr, slots, mask_n, h, stride_v_slot, stride_v_head,
                         HKV, D, BLOCK_N, KV_FORMAT, PAGE, INTERLEAVED, DOT_DTYPE)
        pv = tl.dot(p.to(DOT_DTYPE), v)
        if GUARDED:
            vf = v.to(tl.float32)
            nonfinite = (vf != vf) | (tl.abs(vf) == float("inf"))
            if tl.max(tl.max(nonfinite.to(tl.int32), 1), 0) > 0:
                # A key's non-finite V reaches only the rows that keep it (a 0 weight times NaN would reach every
                # row of the tile): the finite values as they are, a kept non-finite one as a positive weight times
                # it (inf stays inf; inf + -inf and NaN give NaN), channel by channel, as the torch reference does.
                pv = tl.dot(p.to(DOT_DTYPE), tl.where(nonfinite, 0.0, vf).to(DOT_DTYPE))
                kept = keep.to(tl.float32)
                nan = tl.dot(kept, (vf != vf).to(tl.float32))
                pinf = tl.dot(kept, (vf == float("inf")).to(tl.float32))
                ninf = tl.dot(kept, (vf == -float("inf")).to(tl.float32))
                pv = tl.where(pinf > 0, float("inf"), pv)
                pv = tl.where(ninf > 0, -float("inf"), pv)
                pv = tl.where((nan > 0) | ((pinf > 0) & (ninf > 0)), float("nan"), pv)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def extend_kernel(
    q_ptr, k_ptr, v_ptr, ksf_ptr, vsf_ptr,
    lens_ptr, index_ptr, stride_index_row, qo_indptr_ptr, block_req_ptr, block_row_ptr,
    rel_bias_ptr, sinks_ptr, out_ptr, tree_mask_ptr, mask_indptr_ptr, depth_ptr,
    stride_qt, stride_qh,
    stride_k_slot, stride_k_head, stride_v_slot, stride_v_head,
    stride_rb_row, stride_rb_head, rel_extent,
    stride_ot, stride_oh,
    sm_scale, k_scale, v_scale, logit_cap, window,
    part_o_ptr, part_lse_ptr, split_min,
    G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, D: tl.constexpr, HKV: tl.constexpr,
    BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr, PAGE: tl.constexpr, INTERLEAVED: tl.constexpr,
    DOT_DTYPE: tl.constexpr, HAS_REL_BIAS: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_CAP: tl.constexpr,
    HAS_SINKS: tl.constexpr, PAGE_TABLE: tl.constexpr, KV_PAGE: tl.constexpr, HAS_TREE: tl.constexpr,
    UNIFORM_QLEN: tl.constexpr = 0, NUM_SPLITS: tl.constexpr = 1,
):
    # lens_ptr / index_ptr: kv_indptr / kv_indices (CSR), or seq_lens / page_table (PAGE_TABLE: page ids of
    # KV_PAGE slots, a row every stride_index_row entries)
    blk = tl.program_id(0)
    h = tl.program_id(1)
    if UNIFORM_QLEN > 0:  # every request has UNIFORM_QLEN rows: the block's request and rows follow from its index
        blocks_per_req = (UNIFORM_QLEN + BLOCK_M - 1) // BLOCK_M
        b = blk // blocks_per_req
        q_start = tl.load(qo_indptr_ptr + b)
        row_begin = q_start + (blk % blocks_per_req) * BLOCK_M
    else:
        b = tl.load(block_req_ptr + blk)
        row_begin = tl.load(block_row_ptr + blk)  # first query row (token index into q) of this block
        q_start = tl.load(qo_indptr_ptr + b)
    q_end = tl.load(qo_indptr_ptr + b + 1)
    if PAGE_TABLE:
        seq_len = tl.load(lens_ptr + b).to(tl.int32)
        idx_ptr = index_ptr + b.to(tl.int64) * stride_index_row
    else:
        seq_len = (tl.load(lens_ptr + b + 1) - tl.load(lens_ptr + b)).to(tl.int32)
        idx_ptr = index_ptr + tl.load(lens_ptr + b).to(tl.int64)
    prefix = seq_len - (q_end - q_start).to(tl.int32)

    r = tl.arange(0, BLOCK_R)
    m = r // G
    g = r % G
    tok = row_begin + m
    mask_r = (r < BLOCK_M * G) & (tok < q_end)
    pos = prefix + (tok - q_start).to(tl.int32)  # query positions
    mask_row = tok.to(tl.int64)  # read only with HAS_TREE (the tree mask's row of each query row)
    if HAS_TREE:  # a verify step: draft i sits at prefix + depth_i and sees the drafts its tree row marks
        pos = prefix + tl.load(depth_ptr + tok, mask=mask_r, other=0).to(tl.int32)
        n_drafts = (q_end - q_start).to(tl.int32)
        mask_row = tl.load(mask_indptr_ptr + b) + (tok - q_start).to(tl.int64) * n_drafts
    heads = h * G + g
    offs_d = tl.arange(0, D)
    q = tl.load(q_ptr + tok.to(tl.int64)[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=mask_r[:, None], other=0.0).to(DOT_DTYPE)
    qk_scale = sm_scale * log2e()
    if KV_FORMAT == 1:
        qk_scale = qk_scale * k_scale

    first_pos = prefix + (row_begin - q_start).to(tl.int32)
    last_pos = tl.minimum(first_pos + BLOCK_M, seq_len) - 1
    if HAS_TREE:  # depths >= 0: no draft sits before the prefix's end; any draft may be visible
        first_pos = prefix
        last_pos = seq_len - 1
    lo = 0
    first_key = 0  # the block's first query sees keys from here
    if HAS_WINDOW:
        first_key = tl.maximum(first_pos - window + 1, 0)
        lo = (first_key // BLOCK_N) * BLOCK_N
    hi = last_pos + 1
    if NUM_SPLITS > 1:  # split program_id(2) of the request's keys [lo, hi): whole tiles, >= split_min keys each
        split = tl.program_id(2)
        per = (hi - lo + NUM_SPLITS - 1) // NUM_SPLITS
        per = tl.maximum(((per + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, split_min)
        split_lo = lo + split * per
        hi = tl.minimum(split_lo + per, hi)
        lo = split_lo  # past hi for a split the request's keys do not reach: no tile, an empty partial

    acc, l_i, m_i = attend_key_tiles(
        q, tok, pos, heads, mask_r, mask_row, prefix, q_start, first_pos, first_key, lo, hi, h, idx_ptr,
        k_ptr, v_ptr, ksf_ptr, vsf_ptr, rel_bias_ptr, tree_mask_ptr, depth_ptr,
        stride_k_slot, stride_k_head, stride_v_slot, stride_v_head, stride_rb_row, stride_rb_head, rel_extent,
        qk_scale, logit_cap, window,
        BLOCK_R, D, HKV, BLOCK_N, KV_FORMAT, PAGE, INTERLEAVED, DOT_DTYPE, HAS_REL_BIAS, HAS_WINDOW, HAS_CAP,
        PAGE_TABLE, KV_PAGE, HAS_TREE, False)
    if tl.max(tl.max(((acc != acc) | (tl.abs(acc) == float("inf"))).to(tl.int32), 1), 0) > 0:
        acc, l_i, m_i = attend_key_tiles(
            q, tok, pos, heads, mask_r, mask_row, prefix, q_start, first_pos, first_key, lo, hi, h, idx_ptr,
            k_ptr, v_ptr, ksf_ptr, vsf_ptr, rel_bias_ptr, tree_mask_ptr, depth_ptr,
            stride_k_slot, stride_k_head, stride_v_slot, stride_v_head, stride_rb_row, stride_rb_head, rel_extent,
            qk_scale, logit_cap, window,
            BLOCK_R, D, HKV, BLOCK_N, KV_FORMAT, PAGE, INTERLEAVED, DOT_DTYPE, HAS_REL_BIAS, HAS_WINDOW, HAS_CAP,
            PAGE_TABLE, KV_PAGE, HAS_TREE, True)

    if KV_FORMAT == 1:
        acc = acc * v_scale
    if NUM_SPLITS > 1:  # the split's normalized partial and base-2 log-sum-exp (-inf: no key seen); the merge
        # (verify_merge_kernel) combines them and folds in the sinks
        seen = l_i > 0.0
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        part = (tok.to(tl.int64) * (HKV * G) + heads) * NUM_SPLITS + tl.program_id(2)
        tl.store(part_o_ptr + part[:, None] * D + offs_d[None, :], acc / tl.where(seen, l_i, 1.0)[:, None],
                 mask=mask_r[:, None])
        tl.store(part_lse_ptr + part, lse, mask=mask_r)
    else:
        if HAS_SINKS:
            sink = tl.load(sinks_ptr + heads, mask=mask_r, other=0.0).to(tl.float32) * log2e()
            m_fin = tl.maximum(m_i, sink)
            scale_old = tl.exp2(m_i - m_fin)
            acc = acc * scale_old[:, None]
            l_i = l_i * scale_old + tl.exp2(sink - m_fin)
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # l_i is 0 only on padding rows, never stored
        tl.store(out_ptr + tok.to(tl.int64)[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=mask_r[:, None])


@triton.jit
def verify_merge_kernel(part_o_ptr, part_lse_ptr, sinks_ptr, out_ptr, stride_ot, stride_oh,
                        HQ: tl.constexpr, D: tl.constexpr, NUM_SPLITS: tl.constexpr, HAS_SINKS: tl.constexpr):
    """One (query row, head) of a split verify launch: its splits' partials weighted by their log-sum-exp, and the
    sink's weight in the denominator."""
    tok = tl.program_id(0)
    head = tl.program_id(1)
    row0 = (tok.to(tl.int64) * HQ + head) * NUM_SPLITS
    offs_s = tl.arange(0, NUM_SPLITS)
    lse = tl.load(part_lse_ptr + row0 + offs_s)
    m = tl.max(lse, 0)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32) * log2e()
        m = tl.maximum(m, sink)
    m = tl.where(m == float("-inf"), 0.0, m)  # a row that saw no key (a padding row): weights 0, output 0
    w = tl.exp2(lse - m)
    offs_d = tl.arange(0, D)
    o = tl.load(part_o_ptr + (row0 + offs_s)[:, None] * D + offs_d[None, :])
    acc = tl.sum(o * w[:, None], 0)
    denom = tl.sum(w, 0)
    if HAS_SINKS:
        denom = denom + tl.exp2(sink - m)
    out = acc / tl.where(denom == 0.0, 1.0, denom)
    tl.store(out_ptr + tok.to(tl.int64) * stride_ot + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty))


def _check_block_sizes(block_rows: int, block_n: int) -> None:
    for name, value in (("block_rows", block_rows), ("block_n", block_n)):
        require_int_value(value, name, "a power of two >= 16", minimum=16, valid=is_power_of_two)


def _row_blocks(q: torch.Tensor, kv: PagedKV, block_rows: int) -> tuple[int, int, int]:
    """``(G, BLOCK_R, BLOCK_M)``: a program's rows are ``BLOCK_M`` tokens of all ``G`` heads of one KV head."""
    return _row_geometry(q.shape[1], kv.num_kv_heads, block_rows)


def _row_geometry(num_q_heads: int, num_kv_heads: int, block_rows: int) -> tuple[int, int, int]:
    group = num_q_heads // num_kv_heads
    block_r = max(block_rows, triton.next_power_of_2(group), 16)
    return group, block_r, max(1, block_r // group)


@dataclass(frozen=True)
class ExtendBlocks:
    """An extend's programs along the rows: program i serves query rows ``block_row[i]`` .. ``+ block_m`` (int32,
    device) of request ``block_req[i]``. It depends on the query offsets and the head grouping only, so one serves
    every layer of a step with that grouping (``extend_blocks``)."""

    block_req: torch.Tensor
    block_row: torch.Tensor
    block_m: int


def extend_blocks(qo_indptr: torch.Tensor, num_q_heads: int, num_kv_heads: int, *,
                  block_rows: int = 64) -> ExtendBlocks:
    """The programs of an extend with these query offsets (read back once: one device sync) for layers of
    ``num_q_heads`` over ``num_kv_heads``; ``paged_extend_attention(..., blocks=)`` then reads nothing back. The
    offsets are not checked here (``step_plans.check_extend_keys`` checks them)."""
    check_index_tensor("qo_indptr", qo_indptr, qo_indptr.device)
    _check_block_sizes(block_rows, 16)
    if num_kv_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    block_m = _row_geometry(num_q_heads, num_kv_heads, block_rows)[2]
    return _blocks_of(qo_indptr.tolist(), block_m, qo_indptr.device)


def _blocks_of(qo: list, block_m: int, device) -> ExtendBlocks:
    """The programs over host query offsets ``qo``: each request's rows in runs of ``block_m``."""
    reqs, rows = [], []
    for b_idx, (a, e) in enumerate(zip(qo, qo[1:])):
        for r0 in range(a, e, block_m):
            reqs.append(b_idx)
            rows.append(r0)
    both = torch.tensor([reqs, rows], dtype=torch.int32).to(device)  # one copy to the device
    return ExtendBlocks(both[0], both[1], block_m)


def _key_args(table: bool, kv_indptr, kv_indices, page_table, seq_lens, page_size) -> tuple[tuple, int]:
    """The kernel's key arguments ``(lens, index, stride_index_row)`` and ``KV_PAGE`` for a page table or a CSR."""
    if table:
        return (seq_lens, page_table, page_table.stride(0)), page_size
    return (kv_indptr, kv_indices, 0), 0


def _launch(grid, q, kv, keys, qo_indptr, blocks, params, out, tree, *, group, block_r, block_m, block_n,
            table, kv_page, uniform_qlen=0, splits=None):
    """``extend_kernel`` over ``grid``: ``keys`` = (lens, index, stride_index_row), ``blocks`` = (block_req,
    block_row) (unread with ``uniform_qlen``), ``tree`` = (tree_mask bytes, mask_indptr, depths) or None;
    ``splits`` = (num_splits, split_min, part_o, part_lse): the keys split over ``grid[2]`` programs writing partials
    (sinks left to the merge), or None."""
    rb = params.rel_bias
    ksf, vsf, page, interleaved = scale_args(kv)
    num_splits, split_min, part_o, part_lse = splits if splits is not None else (1, 0, out, out)
    extend_kernel[grid](
        q, *kv_data(kv), ksf, vsf, *keys, qo_indptr, *blocks,
        rb if rb is not None else out, params.sinks if params.sinks is not None else out, out,
        *(tree if tree is not None else (out, out, out)),
        *launch_strides(q, kv, rb, out), *launch_scalars(params, kv), part_o, part_lse, split_min,
        G=group, BLOCK_M=block_m, BLOCK_R=block_r, D=q.shape[2], HKV=kv.num_kv_heads, BLOCK_N=block_n,
        KV_FORMAT=kv_format_code(kv), PAGE=page, INTERLEAVED=interleaved, DOT_DTYPE=dot_dtype(kv),
        HAS_REL_BIAS=rb is not None, HAS_WINDOW=params.window is not None, HAS_CAP=params.logit_cap > 0,
        HAS_SINKS=params.sinks is not None and num_splits == 1, PAGE_TABLE=table, KV_PAGE=kv_page,
        HAS_TREE=tree is not None, UNIFORM_QLEN=uniform_qlen, NUM_SPLITS=num_splits, num_warps=4, num_stages=2,
    )


def verify_splits(batch: int, draft_len: int, num_q_heads: int, num_kv_heads: int, device, *,
                  block_rows: int = 64) -> int:
    """The key splits ``uniform_verify_attention`` plans for ``batch`` requests of ``draft_len`` drafts
    (``plan.choose_verify_splits`` over its row programs, on ``device``'s SM count)."""
    block_m = _row_geometry(num_q_heads, num_kv_heads, block_rows)[2]
    # The interpreter runs programs one after another: plan as for 16 SMs (at most 8 splits for the CPU tests'
    # batches, each split still >= VERIFY_MIN_SPLIT_KEYS), not an H200's 132 (32 splits, 4x the programs to run).
    sms = num_sms(device) if require_device(device).type == "cuda" else 16
    return choose_verify_splits(batch * triton.cdiv(draft_len, block_m) * num_kv_heads, sms)


def verify_workspace_shape(max_batch: int, draft_len: int, num_q_heads: int, num_kv_heads: int, device, *,
                           block_rows: int = 64) -> tuple[int, int]:
    """``(rows, splits)``: the most partial rows (``rows x splits``, per query head) a split verify launch of up to
    ``max_batch`` requests of ``draft_len`` drafts plans (``verify_splits``), so a ``DecodeWorkspace`` sized for it
    (``rows`` as its ``max_batch``) holds every such launch's partials; ``(1, 1)`` where none splits. Splits stop
    once the row programs fill the SMs, so only the first few batch sizes are looked at."""
    for name, value in (("max_batch", max_batch), ("draft_len", draft_len), ("num_q_heads", num_q_heads),
                        ("num_kv_heads", num_kv_heads)):
        require_int_value(value, name)
    best = (1, 1)
    for batch in range(1, max_batch + 1):
        splits = verify_splits(batch, draft_len, num_q_heads, num_kv_heads, device, block_rows=block_rows)
        if splits == 1:
            break  # more requests only add programs: none of them splits
        if batch * draft_len * splits > best[0] * best[1]:
            best = (batch * draft_len, splits)
    return best


def uniform_verify_attention(q: torch.Tensor, kv: PagedKV, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                             qo_indptr: torch.Tensor, params: AttentionParams, verify: SpecVerify, draft_len: int,
                             *, out: Optional[torch.Tensor] = None, block_rows: int = 64,
                             block_n: int = 64, num_splits: Optional[int] = None,
                             split_min_keys: int = VERIFY_MIN_SPLIT_KEYS,
                             workspace: Optional[DecodeWorkspace] = None) -> torch.Tensor:
    """``paged_extend_attention`` for a verify step whose every request has ``draft_len`` query rows (a CUDA-graph
    verify batch: ``qo_indptr = arange(B + 1) * draft_len``), laid out without reading the device: the grid is
    ``(B * cdiv(draft_len, BLOCK_M), Hkv, num_splits)`` from the shapes, each block's request and rows from its
    index, so the launch can be captured. Nothing is read back: the caller's metadata holds checked keys and trees (an
    eager step checks them in ``paged_extend_attention``). Types and shapes are checked (host metadata).

    ``num_splits`` (a power of two; default ``plan.choose_verify_splits`` for the device): each request's keys are
    spread over that many programs in whole tiles of at least ``split_min_keys`` keys, whose partials
    ``verify_merge_kernel`` combines: float32 partials of ``rows x Hq x num_splits x (D + 1)``, views of the
    caller's ``workspace`` (the decode workspace, sized with ``verify_workspace_shape``; too small: ValueError before
    any launch), or allocated here without one (in the graph's pool when captured). 1: one program reads all of a
    request's keys, no merge, no workspace."""
    if not isinstance(verify, SpecVerify):
        raise TypeError(f"verify must be a SpecVerify, got {type(verify).__name__}")
    require_int_value(draft_len, "draft_len", "an int >= 1")
    check_query_and_pool(q, kv, params, out)
    _check_block_sizes(block_rows, block_n)
    check_index_tensor("qo_indptr", qo_indptr, q.device)
    batch = qo_indptr.numel() - 1
    if batch < 1 or kv_indptr.numel() != batch + 1:
        raise ValueError(f"qo_indptr and kv_indptr must have batch + 1 >= 2 entries, got {qo_indptr.numel()} and "
                         f"{kv_indptr.numel()}")
    if q.shape[0] != batch * draft_len:
        raise ValueError(f"q must have batch * draft_len = {batch} * {draft_len} rows, got {q.shape[0]}")
    check_kv_map(batch, kv, q.device, kv_indptr, kv_indices, None, None, None)
    tree = (verify.tree_mask.view(torch.uint8), verify.mask_indptr, verify.depths)
    for name, t in zip(("tree_mask", "mask_indptr", "depths"), tree):
        if t.device != q.device:
            raise ValueError(f"verify.{name} must be on {q.device} (a captured launch copies nothing), got {t.device}")
    if tree[1].dtype != torch.int64 or tree[2].dtype != torch.int64:
        raise TypeError(f"verify.mask_indptr and verify.depths must be int64, got {tree[1].dtype} and {tree[2].dtype}")
    group, block_r, block_m = _row_blocks(q, kv, block_rows)
    if num_splits is None:
        num_splits = verify_splits(batch, draft_len, q.shape[1], kv.num_kv_heads, q.device, block_rows=block_rows)
    require_int_value(num_splits, "num_splits", f"a power of two in [1, {MAX_VERIFY_SPLITS}]",
                      maximum=MAX_VERIFY_SPLITS, valid=is_power_of_two)
    require_int_value(split_min_keys, "split_min_keys")
    rows, hq, d = q.shape
    splits = None
    if num_splits > 1:
        if workspace is None:
            part_o = torch.empty(rows * hq * num_splits * d, dtype=torch.float32, device=q.device)
            part_lse = torch.empty(rows * hq * num_splits, dtype=torch.float32, device=q.device)
        else:
            if not isinstance(workspace, DecodeWorkspace):
                raise TypeError(f"workspace must be a DecodeWorkspace or None, got {type(workspace).__name__}")
            if workspace.device != q.device:
                raise ValueError(f"workspace must be on {q.device} (the query's device), got {workspace.device}")
            if not workspace.holds(rows, hq, num_splits, d):
                raise ValueError(f"workspace too small for a verify launch's partials: {rows} rows x Hq={hq} x "
                                 f"{num_splits} splits x head_dim={d}; it holds {workspace.part_o.numel()} values "
                                 f"(size it with verify_workspace_shape)")
            part_o, part_lse = workspace.split_buffers(rows, hq, num_splits, d)
        splits = (num_splits, triton.cdiv(split_min_keys, block_n) * block_n, part_o, part_lse)
    if out is None:
        out = torch.empty_like(q)
    grid = (batch * triton.cdiv(draft_len, block_m), kv.num_kv_heads, num_splits)
    _launch(grid, q, kv, (kv_indptr, kv_indices, 0), qo_indptr, (out, out), params, out, tree, group=group,
            block_r=block_r, block_m=block_m, block_n=block_n, table=False, kv_page=0, uniform_qlen=draft_len,
            splits=splits)
    if splits is not None:
        sinks = params.sinks
        verify_merge_kernel[(rows, hq)](
            part_o, part_lse, sinks if sinks is not None else out, out, out.stride(0), out.stride(1),
            HQ=hq, D=d, NUM_SPLITS=num_splits, HAS_SINKS=sinks is not None, num_warps=4)
    return out


def paged_extend_attention(q: torch.Tensor, kv: PagedKV, kv_indptr: Optional[torch.Tensor] = None,
                           kv_indices: Optional[torch.Tensor] = None, qo_indptr: Optional[torch.Tensor] = None,
                           params: Optional[AttentionParams] = None, *, page_table: Optional[torch.Tensor] = None,
                           seq_lens: Optional[torch.Tensor] = None, page_size: Optional[int] = None,
                           out: Optional[torch.Tensor] = None, block_rows: int = 64, block_n: int = 64,
                           validate: bool = True, verify: Optional[SpecVerify] = None,
                           blocks: Optional[ExtendBlocks] = None) -> torch.Tensor:
    """``q [T, Hq, D]`` -> ``[T, Hq, D]`` (q's dtype unless ``out`` is given). Keys: ``kv_indptr`` / ``kv_indices``
    (CSR) or ``page_table`` / ``seq_lens`` / ``page_size`` (read by the kernel directly). Reads ``qo_indptr`` and
    the key counts on the host to lay out the grid (extend is not graph-captured); ``validate`` also range-checks
    the slots or the page ids the kernel reads, before anything is launched. ``verify``: a speculative verify step
    (its query rows the drafts of one tree per request; CSR keys only). ``blocks`` (``extend_blocks`` of the same
    ``qo_indptr``, e.g. made once per step): nothing is read back, the offsets and key counts having been checked by
    the caller (``step_plans.check_extend_keys``); not with ``validate`` or ``verify``."""
    if params is None or qo_indptr is None:
        raise TypeError("paged_extend_attention needs qo_indptr and params")
    if blocks is not None:
        return _extend_with_blocks(q, kv, kv_indptr, kv_indices, qo_indptr, params, page_table, seq_lens, page_size,
                                   out, block_rows, block_n, validate, verify, blocks)
    if verify is not None:
        if not isinstance(verify, SpecVerify):
            raise TypeError(f"verify must be None or a SpecVerify, got {type(verify).__name__}")
        if page_table is not None:
            raise ValueError("verify (a speculative verify step) reads per-token CSR keys (kv_indptr, kv_indices), "
                             "not a page table")
    check_query_and_pool(q, kv, params, out)
    _check_block_sizes(block_rows, block_n)
    check_index_tensor("qo_indptr", qo_indptr, q.device)
    batch = qo_indptr.numel() - 1
    if batch < 1 or (isinstance(kv_indptr, torch.Tensor) and kv_indptr.numel() != batch + 1):
        raise ValueError(f"qo_indptr (and kv_indptr) must have batch + 1 >= 2 entries, got "
                         f"{qo_indptr.numel()}" + (f" and {kv_indptr.numel()}" if kv_indptr is not None else ""))
    table = check_kv_map(batch, kv, q.device, kv_indptr, kv_indices, page_table, seq_lens, page_size)
    qo = qo_indptr.tolist()
    if qo[0] != 0 or qo[-1] != q.shape[0] or any(x > y for x, y in zip(qo, qo[1:])):
        raise ValueError(f"qo_indptr must start at 0, be non-decreasing and end at q's row count {q.shape[0]}")
    qlens = [y - x for x, y in zip(qo, qo[1:])]
    if table:
        kvlens = seq_lens.tolist()
    else:
        kvp = kv_indptr.tolist()
        if kvp[0] != 0 or any(x > y for x, y in zip(kvp, kvp[1:])):
            raise ValueError("kv_indptr must start at 0 and be non-decreasing")
        if kvp[-1] > kv_indices.numel():
            raise ValueError(f"kv_indptr[-1]={kvp[-1]} exceeds kv_indices' length {kv_indices.numel()}")
        kvlens = [y - x for x, y in zip(kvp, kvp[1:])]
    if any(ql > kl for ql, kl in zip(qlens, kvlens)):
        raise ValueError(f"each request needs at least as many keys as queries, got qlens {qlens} and kv lens "
                         f"{kvlens}")
    if verify is not None:
        verify.check_queries(qo_indptr)
    if validate:
        if table:
            validate_page_table(kv, page_table, seq_lens, page_size, window=params.window,
                                query_lens=qo_indptr.diff())
        else:
            used = kv_indices[: kvp[-1]]
            if used.numel() and (int(used.min()) < 0 or int(used.max()) >= kv.num_slots):
                raise ValueError(f"kv_indices must be slots in [0, {kv.num_slots}), got [{int(used.min())}, "
                                 f"{int(used.max())}]")
    group, block_r, block_m = _row_blocks(q, kv, block_rows)
    blocks = _blocks_of(qo, block_m, q.device)
    if out is None:
        out = torch.empty_like(q)
    if not blocks.block_req.numel():
        return out
    keys, kv_page = _key_args(table, kv_indptr, kv_indices, page_table, seq_lens, page_size)
    tree = (verify.tree_mask.to(q.device).view(torch.uint8), verify.mask_indptr.to(q.device, torch.int64),
            verify.depths.to(q.device, torch.int64)) if verify is not None else None
    _launch((blocks.block_req.numel(), kv.num_kv_heads), q, kv, keys, qo_indptr,
            (blocks.block_req, blocks.block_row), params, out, tree, group=group, block_r=block_r, block_m=block_m,
            block_n=block_n, table=table, kv_page=kv_page)
    return out


def _extend_with_blocks(q, kv, kv_indptr, kv_indices, qo_indptr, params, page_table, seq_lens, page_size, out,
                        block_rows, block_n, validate, verify, blocks: ExtendBlocks) -> torch.Tensor:
    """``paged_extend_attention`` over a precomputed grid: shapes, dtypes and devices checked, no value read."""
    if not isinstance(blocks, ExtendBlocks):
        raise TypeError(f"blocks must be None or an ExtendBlocks, got {type(blocks).__name__}")
    if validate or verify is not None:
        raise ValueError("blocks is for a step whose keys were checked (validate=False), without verify")
    check_query_and_pool(q, kv, params, out)
    _check_block_sizes(block_rows, block_n)
    check_index_tensor("qo_indptr", qo_indptr, q.device)
    batch = qo_indptr.numel() - 1
    if batch < 1:
        raise ValueError(f"qo_indptr must have batch + 1 >= 2 entries, got {qo_indptr.numel()}")
    table = check_kv_map(batch, kv, q.device, kv_indptr, kv_indices, page_table, seq_lens, page_size)
    group, block_r, block_m = _row_blocks(q, kv, block_rows)
    if blocks.block_m != block_m:
        raise ValueError(f"blocks were laid out {blocks.block_m} rows per program; this layer's heads "
                         f"({q.shape[1]} over {kv.num_kv_heads}) take {block_m}")
    for name, t in (("blocks.block_req", blocks.block_req), ("blocks.block_row", blocks.block_row)):
        if t.device != q.device or t.dtype != torch.int32 or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D int32 tensor on {q.device}, got {t.dtype} {tuple(t.shape)} on "
                             f"{t.device}")
    if out is None:
        out = torch.empty_like(q)
    n = blocks.block_req.numel()
    if not n:
        return out
    keys, kv_page = _key_args(table, kv_indptr, kv_indices, page_table, seq_lens, page_size)
    _launch((n, kv.num_kv_heads), q, kv, keys, qo_indptr, (blocks.block_req, blocks.block_row), params, out, None,
            group=group, block_r=block_r, block_m=block_m, block_n=block_n, table=table, kv_page=kv_page)
    return out
