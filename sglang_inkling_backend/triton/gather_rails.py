"""The slots of a step's per-token rails gathered from the request-to-token table in one kernel: the device half of
``rails.gather_rails_host_lengths`` (its ``gather_slots``), which in torch is an arange, a searchsorted and several
indexed reads of B x context elements, each its own launch. A decode step under CUDA graphs rebuilds its rails before
every replay, where every launch delays the graph."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # slots per program


@triton.jit
def gather_rails_kernel(table_ptr, stride_table_row, stride_table_col, rows_ptr, indptr_ptr, start_ptr, out_ptr,
                        BLOCK: tl.constexpr):
    b = tl.program_id(0)
    chunk = tl.program_id(1)
    row = tl.load(rows_ptr + b).to(tl.int64)
    begin = tl.load(indptr_ptr + b)
    length = tl.load(indptr_ptr + b + 1) - begin
    start = tl.load(start_ptr + b)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < length
    slots = tl.load(table_ptr + row * stride_table_row + (start + offs) * stride_table_col, mask=mask)
    tl.store(out_ptr + begin + offs, slots.to(out_ptr.dtype.element_ty), mask=mask)


def gather_rail_slots(req_to_token: torch.Tensor, rows: torch.Tensor, indptr: torch.Tensor, start: torch.Tensor,
                      out_indices: torch.Tensor, longest: int) -> None:
    """Request b's keys ``req_to_token[rows[b], start[b]:start[b] + indptr[b+1] - indptr[b]]`` into
    ``out_indices[indptr[b]:indptr[b+1]]`` (every tensor on the device; ``longest`` the most keys of one request, from
    the host). The caller (``rails.gather_rails_host_lengths``) has sized and checked everything."""
    bs = rows.numel()
    if bs and longest:
        gather_rails_kernel[(bs, triton.cdiv(longest, BLOCK))](
            req_to_token, req_to_token.stride(0), req_to_token.stride(1), rows, indptr, start, out_indices,
            BLOCK=BLOCK, num_warps=4)
