"""Triton kernels (NVIDIA/AMD): paged decode attention, extend attention and the fused MXFP8 K/V store.

On a machine without a GPU they run under the Triton interpreter (``TRITON_INTERPRET=1``, set before the first
import of this package), which is how the CPU tests exercise them.

API (``q [B, Hq, D]``, ``kv`` an ``attention_inputs.PagedKV``, ``params`` an ``AttentionParams``). The keys
come as a per-token CSR (``kv_indptr [B + 1]``, ``kv_indices``) or as a page table (``page_table [B, max_pages]``
int32 page ids, ``seq_lens [B]``, ``page_size``; positions absolute, page-aligned kernels, windows included):

    ws = DecodeWorkspace.for_max_context(max_batch, Hq, Hkv, D, max_seq_len, device)   # once, caller-owned
    plan = plan_decode(B, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, max_seq_len=L, window=W,
                       page_size=P, kv_dtype=kv.k_buffer.dtype, workspace=ws)          # per step and window
    out = run_decode(plan, q, kv, params=params, page_table=pt, seq_lens=lens, check=False)   # per layer
    out = run_decode(plan, q, kv, kv_indptr, kv_indices, params)                       # CSR (page_size: whole pages)
    out = paged_decode_attention(q, kv, params=params, page_table=pt, seq_lens=lens, page_size=P)  # one shot
    out = paged_extend_attention(q, kv, qo_indptr=qo, params=params, page_table=pt, seq_lens=lens, page_size=P)
    store_kv(kv, loc, k, v)   # MXFP8: quantize and store; bf16/fp16/fp32: copy, one kernel for K and V

``plan_decode`` reads nothing from the device (host ints) and allocates nothing with a workspace, so a plan made
while capturing a CUDA graph is valid for every replay. ``check_decode_inputs`` (no sync) and
``validate_slots`` / ``validate_page_table`` (one sync) raise ValueError/TypeError naming the bad argument.
Modules: ``device`` (shared device helpers), ``encode`` (the MXFP8 encoder), ``plan``, ``decode_tiles`` /
``decode_blocks`` (the two Triton stage-1 kernels), ``decode_hopper`` (the Gluon stage-1 kernel for sm_90a, MXFP8
pages: ``plan_decode(kv_format="mxfp8")`` picks it where it is faster, ``hopper_decode_status`` says whether it can
run), ``decode_merge``, ``decode_attention`` (the launcher), ``inputs``, ``extend_attention``, ``gather_kv`` (the
rail's K/V gathered and dequantized: ``gpu.route`` hands it to FlashInfer's ragged prefill,
``sglang_inkling_backend.flashinfer``), ``gather_rails`` (a graph step's rail slots in one kernel), ``kv_store``,
``prologue``. This package imports no other kernel family.
"""

from .decode_attention import paged_decode_attention, run_decode
from .extend_attention import (ExtendBlocks, extend_blocks, paged_extend_attention, uniform_verify_attention,
                               verify_splits, verify_workspace_shape)
from .gather_rails import gather_rail_slots
from .inputs import check_decode_inputs, check_kv_map, validate_page_table, validate_slots
from .kv_store import (FUSED_STORE_FORMATS, store_kv, store_kv_mxfp8,
                       store_kv_unquantized)
from .plan import (DecodeConfig, DecodePlan, DecodeWorkspace, decode_workspace_shape, decode_workspace_splits,
                   hopper_decode_status, plan_decode, route_note)

__all__ = ["FUSED_STORE_FORMATS", "DecodeConfig", "DecodePlan", "DecodeWorkspace", "check_decode_inputs",
           "decode_workspace_shape",
           "decode_workspace_splits", "gather_rail_slots", "hopper_decode_status",
           "paged_decode_attention", "paged_extend_attention", "plan_decode", "route_note", "run_decode",
           "uniform_verify_attention", "verify_splits", "verify_workspace_shape", "ExtendBlocks", "extend_blocks", "check_kv_map",
           "store_kv", "store_kv_mxfp8", "store_kv_unquantized",
           "validate_page_table", "validate_slots"]
