"""Rails: which KV-cache slots each request attends over, built from a host's token-to-slot table.

Host-free (only torch). A *rail* is CSR: request ``b`` attends over pool slots
``indices[indptr[b]:indptr[b+1]]``, in position order, ending with the newest token (the reference's convention:
decode's query is the last key; extend's queries are the last ``qlen`` keys). Positions inside a rail are relative,
so a rail may start late (a window rail) without changing any distance ``i - j``.

- The *full* rail covers positions ``[0, seq_len)``.
- A *window* rail for a window of ``W`` visible keys (keys with ``0 <= i - j <= W - 1``) covers
  ``[max(0, seq_len - qlen - (W - 1)), seq_len)``: every key any of the request's queries can see, nothing older.
  On a pool whose windowed layers live in their own sub-pool the window rail is translated to that sub-pool's
  slots (``translate_rails``); older tokens may already be gone from it, which is why windowed layers read window
  rails.

A *page table* (``page_table``) is the other form a kernel takes: ``[batch, max_pages]`` page ids, request ``b``'s
position ``p`` at slot ``page_table[b, p // page_size] * page_size + p % page_size``. A host whose allocator hands
out whole pages (SGLang's paged allocator, vLLM's block pool) has one already or derives it from its token table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from sglang_inkling_backend.checks import is_int, require_int_value, require_tensor

INDEX_DTYPE = torch.int64
PAGE_ID_DTYPE = torch.int32


@dataclass
class KVRails:
    """CSR rails: request b reads pool slots ``indices[indptr[b]:indptr[b + 1]]``. ``indices`` may be longer than
    ``indptr[-1]`` (a fixed CUDA-graph buffer); readers go through ``indptr``."""

    indptr: torch.Tensor  # int64 [B + 1]
    indices: torch.Tensor  # int64 [>= nnz]
    dense: bool = False  # indices are 0..nnz-1: a reader may take the buffers' first nnz rows as they are

    def __post_init__(self):  # tensors holding data (no device read); their dtypes and values are the readers'
        require_tensor(self.indptr, "indptr", "a 1-D integer tensor (the rails' offsets)")
        require_tensor(self.indices, "indices", "a 1-D integer tensor of pool slots")


@dataclass
class KVPages:
    """A page table: request b's position p is in slot ``page_table[b, p // page_size] * page_size + p % page_size``
    for ``p < seq_lens[b]``. Views of address-stable buffers under CUDA graphs."""

    page_table: torch.Tensor  # int32 [B, max_pages]
    seq_lens: torch.Tensor  # int64 [B]: keys per request, the query's own included
    page_size: int

    def __post_init__(self):  # tensors holding data (no device read); the rest is the readers' (check_page_table)
        require_tensor(self.page_table, "page_table", "a 2-D integer tensor of page ids")
        require_tensor(self.seq_lens, "seq_lens", "a 1-D integer tensor of key counts")


def _require_int_tensor(t, name: str) -> None:
    """An integer (not bool) tensor holding data: a dtype check, no host sync."""
    require_tensor(t, name, "an integer tensor")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")


def check_token_table(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, *,
                      ranges: bool = True) -> None:
    """Types and shapes (no device read), then, with ``ranges``, every length and row in range (device reads)."""
    for name, t in (("req_to_token", req_to_token), ("req_pool_indices", req_pool_indices), ("seq_lens", seq_lens)):
        _require_int_tensor(t, name)
    if req_to_token.dim() != 2:
        raise ValueError(f"req_to_token must be 2-D [max_reqs, max_context_len], got shape {tuple(req_to_token.shape)}")
    if req_pool_indices.dim() != 1 or seq_lens.dim() != 1 or req_pool_indices.shape != seq_lens.shape:
        raise ValueError(f"req_pool_indices and seq_lens must be 1-D of the same length, got "
                         f"{tuple(req_pool_indices.shape)} and {tuple(seq_lens.shape)}")
    if not ranges:
        return
    if seq_lens.numel() and (int(seq_lens.min()) < 0 or int(seq_lens.max()) > req_to_token.shape[1]):
        raise ValueError(f"seq_lens must lie in [0, {req_to_token.shape[1]}] (req_to_token's width), got "
                         f"[{int(seq_lens.min())}, {int(seq_lens.max())}]")
    if req_pool_indices.numel() and (int(req_pool_indices.min()) < 0
                                     or int(req_pool_indices.max()) >= req_to_token.shape[0]):
        raise ValueError(f"req_pool_indices must lie in [0, {req_to_token.shape[0]}), got "
                         f"[{int(req_pool_indices.min())}, {int(req_pool_indices.max())}]")


def window_start(seq_lens: torch.Tensor, query_lens: torch.Tensor, window: int) -> torch.Tensor:
    """First position any query of the request can see with ``window`` visible keys."""
    if not is_int(window):
        raise TypeError(f"window must be an int (visible keys), got {window!r} ({type(window).__name__})")
    if window < 1:
        raise ValueError(f"window must be >= 1 visible key, got {window}")
    _require_int_tensor(seq_lens, "seq_lens")
    _require_int_tensor(query_lens, "query_lens")
    return torch.clamp(seq_lens - query_lens - (window - 1), min=0)


def gather_rails(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                 start: Optional[torch.Tensor] = None, *, out_indptr: Optional[torch.Tensor] = None,
                 out_indices: Optional[torch.Tensor] = None) -> KVRails:
    """Rails over positions ``[start[b], seq_lens[b])`` of ``req_to_token[req_pool_indices[b]]``, every input
    checked (device reads), then gathered as ``gather_rails_host_lengths`` gathers them.

    With ``out_indptr`` / ``out_indices`` the result is written into them (CUDA-graph buffers) and views of them are
    returned; ``out_indices`` must hold every index.
    """
    check_token_table(req_to_token, req_pool_indices, seq_lens)
    if start is not None:
        _require_int_tensor(start, "start")
        if start.shape != seq_lens.shape:
            raise ValueError(f"start must have one entry per request, like seq_lens {tuple(seq_lens.shape)}, got "
                             f"{tuple(start.shape)}")
    seq_host = seq_lens.to("cpu", INDEX_DTYPE)
    start_host = torch.zeros_like(seq_host) if start is None else start.to("cpu", INDEX_DTYPE)
    if seq_host.numel():
        if int(start_host.min()) < 0:
            raise ValueError(f"start must be >= 0 (a rail's first position), got {int(start_host.min())}")
        if bool((start_host > seq_host).any()):
            raise ValueError("rail start must not exceed seq_len")
    return gather_rails_host_lengths(req_to_token, req_pool_indices, seq_host, start_host, out_indptr=out_indptr,
                                     out_indices=out_indices)

def check_host_lengths(seq_lens_host: torch.Tensor, batch: int, max_len: int) -> None:
    """A host's key counts for a decode batch: a 1-D int32/int64 CPU tensor of ``batch`` entries in
    ``[1, max_len]`` (checked on the host: no device read)."""
    require_tensor(seq_lens_host, "seq_lens_host", "a 1-D int32/int64 CPU tensor")
    if seq_lens_host.device.type != "cpu" or seq_lens_host.dim() != 1 \
            or seq_lens_host.dtype not in (torch.int32, torch.int64):
        desc = (f"{seq_lens_host.dtype} {tuple(seq_lens_host.shape)} on {seq_lens_host.device}"
                if isinstance(seq_lens_host, torch.Tensor) else type(seq_lens_host).__name__)
        raise TypeError(f"seq_lens_host must be a 1-D int32/int64 CPU tensor, got {desc}")
    if seq_lens_host.numel() != batch:
        raise ValueError(f"seq_lens_host must hold one entry per request ({batch}), got {seq_lens_host.numel()}")
    if batch and (int(seq_lens_host.min()) < 1 or int(seq_lens_host.max()) > max_len):
        raise ValueError(f"seq_lens_host must lie in [1, {max_len}] (a decode request's keys, the new one included), "
                         f"got [{int(seq_lens_host.min())}, {int(seq_lens_host.max())}]")


def gather_rails_host_lengths(req_to_token: torch.Tensor, rows: torch.Tensor, seq_lens_host: torch.Tensor,
                              start_host: Optional[torch.Tensor] = None, *, out_indptr: Optional[torch.Tensor] = None,
                              out_indices: Optional[torch.Tensor] = None,
                              gather_slots: Optional[Callable[..., None]] = None) -> KVRails:
    """``gather_rails`` without reading the device: the lengths come from the host (``seq_lens_host``,
    ``start_host``: CPU tensors, checked by the caller, e.g. with ``check_host_lengths``), so the indptr is summed on
    the host and copied once, and each of the ``nnz`` slots is gathered by its own index. ``rows`` (device) are not
    range-checked (that would be a device read): the caller's. A decode step's metadata under CUDA graphs is rebuilt
    so before every replay, where a device read would stall the GPU. Without ``out_indptr`` / ``out_indices`` the
    rails are new tensors. ``gather_slots(req_to_token, rows, indptr, start, out_indices, longest)`` (a route's
    ``gather_rail_slots``: one kernel; device ``indptr`` and ``start``, ``longest`` the most keys of one request)
    writes the slots in place of the torch ops here (an arange, a searchsorted and indexed reads, each a launch)."""
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
        raise ValueError(f"out_indptr / out_indices too small: need >= {bs + 1} and >= {nnz} entries, have "
                         f"{out_indptr.numel()} and {None if out_indices is None else out_indices.numel()}")
    host = torch.cat([indptr, start])  # one copy to the device
    dev = host.to(device, non_blocking=True)
    indptr_dev, start_dev = dev[: bs + 1], dev[bs + 1:]
    out_indptr[: bs + 1].copy_(indptr_dev)
    if gather_slots is not None:
        gather_slots(req_to_token, rows.to(device), indptr_dev, start_dev, out_indices, int(lens.max()) if bs else 0)
        return KVRails(out_indptr[: bs + 1], out_indices)
    i = torch.arange(nnz, dtype=INDEX_DTYPE, device=device)
    b = torch.searchsorted(indptr_dev[1:], i, right=True)
    positions = start_dev[b] + i - indptr_dev[b]
    out_indices[:nnz].copy_(req_to_token[rows.to(device=device, dtype=INDEX_DTYPE)[b], positions])
    return KVRails(out_indptr[: bs + 1], out_indices)


def translate_rails(rails: KVRails, full_to_swa: Optional[torch.Tensor], *, check: bool = True) -> KVRails:
    """Full-pool slots -> sliding-window sub-pool slots (SGLang's ``full_to_swa_index_mapping``). ``check`` reads
    the rails' largest slot back (one sync) to refuse a map that does not cover it; pass False only where the caller
    has checked the slots against a map it knows covers the pool."""
    if not isinstance(rails, KVRails):
        raise TypeError(f"rails must be KVRails, got {type(rails).__name__}")
    if full_to_swa is None:
        return rails
    require_tensor(full_to_swa, "full_to_swa", "a 1-D int32/int64 map from full-pool slots")
    if full_to_swa.dim() != 1 or full_to_swa.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"full_to_swa must be a 1-D int32/int64 map from full-pool slots, got {full_to_swa.dtype} "
                        f"{tuple(full_to_swa.shape)}")
    if check and rails.indices.numel():
        low, high = int(rails.indices.min()), int(rails.indices.max())
        if low < 0 or high >= full_to_swa.numel():
            raise ValueError(f"full_to_swa must map every full-pool slot the rails read: it has "
                             f"{full_to_swa.numel()} entries, the rails read slots [{low}, {high}]")
    return KVRails(rails.indptr, full_to_swa[rails.indices].to(INDEX_DTYPE))


def page_table(token_to_slot: torch.Tensor, rows: torch.Tensor, page_size: int,
               max_pages: Optional[int] = None, *, check: bool = True) -> torch.Tensor:
    """``[len(rows), max_pages]`` int32 page ids from a token-to-slot table ``token_to_slot [max_reqs, max_len]``
    (SGLang's ``req_to_token``) whose requests own whole pages: the slot of each page's first position, divided by
    ``page_size``. Entries past a request's length are whatever the table holds there; kernels read only
    ``cdiv(seq_len, page_size)`` pages of each row. ``check`` reads ``rows`` back (one sync) to refuse a row outside
    the table; with False (the caller ran ``check_token_table``) there is no host sync."""
    _require_int_tensor(token_to_slot, "token_to_slot")
    if token_to_slot.dim() != 2:
        raise ValueError(f"token_to_slot must be 2-D [max_reqs, max_len], got shape {tuple(token_to_slot.shape)}")
    require_tensor(rows, "rows", "a 1-D int32/int64 tensor of token_to_slot's rows")
    if rows.dim() != 1 or rows.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"rows must be a 1-D int32/int64 tensor of token_to_slot's rows, got {rows.dtype} "
                        f"{tuple(rows.shape)}")
    if check and rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= token_to_slot.shape[0]):
        raise ValueError(f"rows must be rows of token_to_slot in [0, {token_to_slot.shape[0]}), got "
                         f"[{int(rows.min())}, {int(rows.max())}]")
    require_int_value(page_size, "page_size")
    width = -(-token_to_slot.shape[1] // page_size)
    max_pages = width if max_pages is None else max_pages
    require_int_value(max_pages, "max_pages", f"an int in [1, {width}] (the table's width in pages)", maximum=width)
    first_slots = token_to_slot[rows.to(token_to_slot.device, INDEX_DTYPE)][:, : max_pages * page_size : page_size]
    return torch.div(first_slots, page_size, rounding_mode="floor").to(PAGE_ID_DTYPE)


def block_table_token_table(block_table: torch.Tensor, block_size: int) -> torch.Tensor:
    """A token-to-slot table ``[B, max_blocks * block_size]`` (int64) from a block table ``[B, max_blocks]`` (vLLM's
    ``block_table_tensor``): position ``p`` of request ``b`` is slot ``block_table[b, p // block_size] * block_size
    + p % block_size``. It feeds ``gather_rails`` with ``rows = arange(B)``. No host sync."""
    require_tensor(block_table, "block_table", "a 2-D int32/int64 tensor [batch, max_blocks]")
    if block_table.dim() != 2 or block_table.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"block_table must be a 2-D int32/int64 tensor [batch, max_blocks], got "
                        f"{tuple(block_table.shape)} {block_table.dtype}")
    require_int_value(block_size, "block_size")
    offsets = torch.arange(block_size, dtype=INDEX_DTYPE, device=block_table.device)
    slots = block_table.to(INDEX_DTYPE).unsqueeze(2) * block_size + offsets
    return slots.reshape(block_table.shape[0], -1)
