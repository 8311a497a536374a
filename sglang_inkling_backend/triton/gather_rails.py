"""A step's per-token rails gathered from the request-to-token table in one kernel (``rails.gather_rails_host_lengths``
in torch is an arange, a searchsorted and several indexed reads of B x context elements, each its own launch). The
lengths come from the host, as there: nothing reads the device. A decode step under CUDA graphs rebuilds its rails so
before every replay, where every launch delays the graph."""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..rails import INDEX_DTYPE, KVRails

BLOCK = 1024  # slots per program


@triton.jit
def gather_rails_kernel(table_ptr, stride_table_row, rows_ptr, indptr_ptr, start_ptr, out_ptr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    chunk = tl.program_id(1)
    row = tl.load(rows_ptr + b).to(tl.int64)
    begin = tl.load(indptr_ptr + b)
    length = tl.load(indptr_ptr + b + 1) - begin
    start = tl.load(start_ptr + b)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < length
    slots = tl.load(table_ptr + row * stride_table_row + start + offs, mask=mask)
    tl.store(out_ptr + begin + offs, slots.to(out_ptr.dtype.element_ty), mask=mask)


def gather_rails_host_lengths(req_to_token: torch.Tensor, rows: torch.Tensor, seq_lens_host: torch.Tensor,
                              start_host: Optional[torch.Tensor] = None, *, out_indptr: Optional[torch.Tensor] = None,
                              out_indices: Optional[torch.Tensor] = None) -> KVRails:
    """``rails.gather_rails_host_lengths`` (the same arguments, checks and result) with the slots gathered by one
    kernel: request b's keys are ``req_to_token[rows[b], start_host[b]:seq_lens_host[b]]``. ``seq_lens_host`` and
    ``start_host`` are CPU tensors checked by the caller; ``rows`` (device) are not range-checked (the caller's)."""
    bs = seq_lens_host.numel()
    start = torch.zeros(bs, dtype=INDEX_DTYPE) if start_host is None else start_host.to(INDEX_DTYPE)
    lens = seq_lens_host.to(INDEX_DTYPE) - start
    indptr = torch.zeros(bs + 1, dtype=INDEX_DTYPE)
    torch.cumsum(lens, 0, out=indptr[1:])
    nnz = int(indptr[-1])
    device = req_to_token.device
    if out_indptr is None:
        out_indptr = torch.empty(bs + 1, dtype=INDEX_DTYPE, device=device)
        out_indices = torch.empty(nnz, dtype=INDEX_DTYPE, device=device)
    if out_indptr.numel() < bs + 1 or out_indices is None or out_indices.numel() < nnz:
        raise ValueError(f"graph buffers too small: need indptr >= {bs + 1} and indices >= {nnz} entries, have "
                         f"{out_indptr.numel()} and {None if out_indices is None else out_indices.numel()}")
    if req_to_token.stride(1) != 1:
        raise ValueError("req_to_token must be contiguous along the context (stride 1 in its second dimension)")
    rows = rows.to(device)
    dev = torch.cat([indptr, start]).to(device, non_blocking=True)  # one copy to the device
    out_indptr[: bs + 1].copy_(dev[: bs + 1])
    longest = int(lens.max()) if bs else 0
    if longest:
        gather_rails_kernel[(bs, triton.cdiv(longest, BLOCK))](
            req_to_token, req_to_token.stride(0), rows, dev[: bs + 1], dev[bs + 1:], out_indices, BLOCK=BLOCK,
            num_warps=4)
    return KVRails(out_indptr[: bs + 1], out_indices)
