"""Paged decode attention in Triton over bf16/fp16/fp32, per-tensor fp8 and MXFP8 KV pools: the launcher.

One query token per request. Split-KV (flash-decoding): stage 1 runs one program per (request, KV head, split of
the request's keys) and processes all ``G = Hq / Hkv`` query heads of that KV head together with ``tl.dot``, so
every KV byte is read once; stage 2 merges the splits' partial results (skipped when a batch needs one split).

- stage 1: ``decode_tiles.decode_tiles_kernel`` ("tiles": per-token slots, or page-aligned tiles),
  ``decode_blocks.decode_blocks_kernel`` ("blocks": page-aligned tiles, one dot per 32-channel block) or, on sm_90a
  over MXFP8 pages, ``decode_hopper.decode_hopper_kernel`` ("hopper", Gluon: TMA and warpgroup MMAs) or its
  warp-specialized form ``decode_hopper_ws.decode_hopper_ws_kernel`` ("hopper_ws"; both imported only when a plan
  names them);
- stage 2: ``decode_merge.decode_merge_kernel``;
- planning (configuration, split count, workspace): ``plan``; input checks: ``inputs``; device helpers: ``device``.

The requests' keys come either as a per-token CSR (``kv_indptr [B + 1]``, ``kv_indices``: any slot per token;
whole pages when the plan has ``page_size``) or as a page table (``page_table [B, max_pages]`` int32 page ids,
``seq_lens [B]``; always page-aligned). With a page table, key ``t`` of request ``b`` is position ``t`` (absolute)
in slot ``page_table[b, t // P] * P + t % P``; a windowed layer starts at the tile holding ``max(0, seq_len - W)``
and never reads a page entirely before it.

Semantics are ``sglang_inkling_backend.reference.attention.paged_decode_attention``: logit = q.k * scale
(+ rel_bias[b, h, d] for distance d < rel_extent), then the logit cap, keys within the window, optional sinks.
The output is within bf16 rounding of float64 attention on the same quantized K/V (gpu_tests/check_triton_gpu.py).

Use ``plan_decode`` once per batch and ``run_decode`` per layer, or ``paged_decode_attention`` for both at once.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
import triton
import triton.language as tl

from ..attention_inputs import AttentionParams, PagedKV
from .decode_blocks import decode_blocks_kernel
from .decode_merge import decode_merge_kernel
from .decode_tiles import decode_tiles_kernel
from .device import KV_FLOAT, KV_MXFP8
from .inputs import (check_decode_inputs, check_kv_map, check_query_and_pool, dot_dtype, interpreting, kv_format_code,
                     kv_data, scale_args, validate_page_table, validate_slots)
from .plan import HOPPER_KERNELS, DecodeConfig, DecodePlan, DecodeWorkspace, plan_decode

logger = logging.getLogger(__name__)


def check_tiles_fit_scale_pages(plan: DecodePlan, kv: PagedKV) -> None:
    """A page-aligned tile must not cross a page of an interleaved MXFP8 scale layout."""
    if plan.paged and kv.is_mxfp8 and kv.layout.interleaved and kv.layout.page_size % plan.block_n:
        raise ValueError(f"block_n={plan.block_n} must divide the MXFP8 pool's scale page {kv.layout.page_size}")


def run_decode(plan: DecodePlan, q: torch.Tensor, kv: PagedKV, kv_indptr: Optional[torch.Tensor] = None,
               kv_indices: Optional[torch.Tensor] = None, params: Optional[AttentionParams] = None,
               out: Optional[torch.Tensor] = None, check: bool = True, *,
               page_table: Optional[torch.Tensor] = None, seq_lens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One layer's decode attention with a batch's plan. Returns ``out`` ([B, Hq, D], q's dtype by default).

    The keys: ``kv_indptr`` / ``kv_indices`` (CSR), or ``page_table`` / ``seq_lens`` (pages of ``plan.page_size``
    slots: the plan must be made with ``page_size``). ``check``: the no-sync shape, dtype and device checks (slot
    and page ranges are the caller's, or ``validate_slots`` / ``validate_page_table``'s); ``check=False`` is the
    path for CUDA graphs, where nothing reads the device."""
    if params is None:
        raise TypeError("run_decode needs params (an AttentionParams)")
    if check:
        check_query_and_pool(q, kv, params, out)
        if (q.shape[0], q.shape[1], kv.num_kv_heads, q.shape[2]) != (plan.batch, plan.num_q_heads,
                                                                    plan.num_kv_heads, plan.head_dim):
            raise ValueError(f"plan was made for B={plan.batch}, Hq={plan.num_q_heads}, Hkv={plan.num_kv_heads}, "
                             f"D={plan.head_dim}; got q {tuple(q.shape)} with Hkv={kv.num_kv_heads}")
        if params.window != plan.window:
            raise ValueError(f"plan was made for window={plan.window}, params.window={params.window}")
        if page_table is not None and not plan.paged:
            raise ValueError("page_table needs a plan made with page_size (the table's page size)")
        check_kv_map(q.shape[0], kv, q.device, kv_indptr, kv_indices, page_table, seq_lens, plan.page_size)
        check_tiles_fit_scale_pages(plan, kv)
    table = page_table is not None
    batch, hq, d = q.shape
    hkv = kv.num_kv_heads
    group = hq // hkv
    if out is None:
        out = torch.empty_like(q)
    fmt = kv_format_code(kv)
    ksf, vsf, page, interleaved = scale_args(kv)
    rb = params.rel_bias
    direct = plan.num_splits == 1
    dummy = out
    if table:
        lens, index, stride_index_row, kv_page = seq_lens, page_table, page_table.stride(0), plan.page_size
    else:
        lens, index, stride_index_row, kv_page = kv_indptr, kv_indices, 0, 0
    grid = (batch, hkv, plan.num_splits)
    if plan.kernel in HOPPER_KERNELS:
        if fmt != KV_MXFP8 or not interleaved:
            raise ValueError(f"kernel={plan.kernel!r} reads MXFP8 pages (interleaved scales, page 128); got a "
                             f"{'page table' if table else 'CSR'} over a {str(kv.k_buffer.dtype)} pool")
        # Gluon: imported only where these kernels run
        if plan.kernel == "hopper_ws":
            from .decode_hopper_ws import launch_decode_hopper_ws as launch
        else:
            from .decode_hopper import launch_decode_hopper as launch
        launch(plan, q, kv, params, out, lens, index, stride_index_row, table, (ksf, vsf), dummy)
    elif plan.kernel == "blocks":
        pv_dtype = tl.float32 if interpreting() else (dot_dtype(kv) if fmt == KV_FLOAT else tl.float16)
        kernel, variant = decode_blocks_kernel, dict(PV_DTYPE=pv_dtype)
        g_pad = max(8, triton.next_power_of_2(group))  # the heads are its dots' N side: 8 wide at least
    else:
        fp16_tiles = fmt != KV_FLOAT  # 8-bit tiles go to fp16 (exact for e4m3)
        tiles_dtype = tl.float32 if interpreting() else (tl.float16 if fp16_tiles else dot_dtype(kv))
        g_pad = max(16, triton.next_power_of_2(group))  # the heads are the dots' M side: 16 rows at least
        kernel, variant = decode_tiles_kernel, dict(DOT_DTYPE=tiles_dtype, FP16_TILES=fp16_tiles, PAGED=plan.paged)
    if plan.kernel not in HOPPER_KERNELS:
        kernel[grid](
            q, *kv_data(kv), ksf, vsf,
            lens, index, stride_index_row,
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
            HAS_SINKS=params.sinks is not None, DIRECT=direct, PAGE_TABLE=table, KV_PAGE=kv_page, **variant,
            TRIGGER_MERGE=plan.pdl_merge, num_warps=plan.num_warps, num_stages=plan.num_stages,
        )
    if not direct:
        block_d = plan.merge_block_d or d
        decode_merge_kernel[(batch, hq, d // block_d)](
            plan.part_o, plan.part_lse, lens, params.sinks if params.sinks is not None else dummy, out,
            out.stride(0), out.stride(1), params.window if params.window is not None else 0,
            plan.split_len, plan.num_splits,
            HQ=hq, D=d, HAS_WINDOW=params.window is not None, HAS_SINKS=params.sinks is not None,
            # up to 4096 partial values per load round (32 per thread on 4 warps): all splits at once when the
            # merge is spread over channel blocks
            SPLIT_BLOCK=min(max(32, 4096 // block_d), triton.next_power_of_2(plan.num_splits)),
            ALIGN=plan.block_n if plan.paged else 1, BLOCK_D=block_d, PAGE_TABLE=table, BLOCK_N=plan.block_n,
            num_warps=4 if d >= 128 or block_d < d else 2,
            # plan.pdl_merge: launched while stage 1 runs, it waits for stage 1 in the kernel (griddepcontrol.wait).
            # launch_pdl only then: other backends' launch options (AMD's) have no such key and refuse it.
            WAIT_PRIMARY=plan.pdl_merge, **({"launch_pdl": True} if plan.pdl_merge else {}),
        )
    return out


def paged_decode_attention(q: torch.Tensor, kv: PagedKV, kv_indptr: Optional[torch.Tensor] = None,
                           kv_indices: Optional[torch.Tensor] = None, params: Optional[AttentionParams] = None, *,
                           page_table: Optional[torch.Tensor] = None, seq_lens: Optional[torch.Tensor] = None,
                           page_size: Optional[int] = None, num_splits: Optional[int] = None,
                           out: Optional[torch.Tensor] = None, max_seq_len: Optional[int] = None,
                           validate: bool = True, workspace: Optional[DecodeWorkspace] = None,
                           plan_options: Optional[dict] = None) -> torch.Tensor:
    """Plan and run in one call (the reference's signature, plus the page table). Without ``workspace`` it
    allocates its split buffers for this call.

    Keys: ``kv_indptr`` / ``kv_indices`` (CSR; with ``page_size`` the requests own whole pages, checked by
    ``validate``), or ``page_table`` / ``seq_lens`` / ``page_size``. ``validate`` range-checks the slots or page
    ids and checks that ``max_seq_len`` (when given) covers the longest request (one sync), before anything is
    launched; with ``validate=False`` the caller guarantees both (a ``max_seq_len`` below a request's length drops
    that request's last keys). ``num_splits``: the split count (None: planned). ``plan_options``: more keyword
    arguments of ``plan_decode`` (``config``, ``kv_dtype``, ``page_size``)."""
    if params is None:
        raise TypeError("paged_decode_attention needs params (an AttentionParams)")
    options = dict(plan_options or {})
    if page_size is not None:
        options["page_size"] = page_size
    page_size = options.get("page_size")
    check_decode_inputs(q, kv, kv_indptr, kv_indices, params, out, page_table=page_table, seq_lens=seq_lens,
                        page_size=page_size)
    table = page_table is not None
    if validate:
        if table:
            validate_page_table(kv, page_table, seq_lens, page_size, window=params.window, max_seq_len=max_seq_len)
        else:
            validate_slots(kv, kv_indptr, kv_indices, page_size=page_size, max_seq_len=max_seq_len)
    if num_splits is not None:
        options["config"] = DecodeConfig(**{**vars(options.get("config") or DecodeConfig()),
                                            "num_splits": num_splits})
    options.setdefault("kv_dtype", kv.k_buffer.dtype)
    options.setdefault("kv_format", kv.kv_format)
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max()) if table else int(kv_indptr.diff().max())  # one sync
    plan = plan_decode(q.shape[0], num_q_heads=q.shape[1], num_kv_heads=kv.num_kv_heads, head_dim=q.shape[2],
                       window=params.window, max_seq_len=max_seq_len, workspace=workspace, device=q.device,
                       **options)
    check_tiles_fit_scale_pages(plan, kv)
    return run_decode(plan, q, kv, kv_indptr, kv_indices, params, out=out, check=False, page_table=page_table,
                      seq_lens=seq_lens)
