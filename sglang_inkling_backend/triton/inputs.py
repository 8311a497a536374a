"""Host-side input checks of the Triton attention entry points (decode and extend), and the small facts the
launchers share (KV format, dot dtype). Checks that need no device sync raise TypeError / ValueError naming the
argument; the ``validate_*`` functions read values back (one sync each) and run before anything is launched."""

from __future__ import annotations

from typing import Optional

import torch
import triton.language as tl

from .. import mxfp8, settings
from ..attention_inputs import AttentionParams, PagedKV, check_rel_bias
from ..checks import require_extents, require_int_value, require_tensor, triton_head_dim_ok
from .device import KV_FLOAT, KV_FP8, KV_MXFP8
from .plan import check_max_seq_len, e4m3_by_integers


def kv_format_code(kv: PagedKV) -> int:
    """The kernels' ``KV_FORMAT`` constexpr for the pool: ``device.KV_MXFP8``, ``KV_FP8`` (per-tensor) or
    ``KV_FLOAT`` (bf16/fp16/fp32)."""
    if kv.is_mxfp8:
        return KV_MXFP8
    if kv.k_buffer.dtype == mxfp8.DATA_DTYPE:
        return KV_FP8
    return KV_FLOAT


def kv_data(kv: PagedKV) -> tuple[torch.Tensor, torch.Tensor]:
    """The K and V buffers as the kernels take them: an 8-bit pool as bytes (uint8 views) where
    ``e4m3_by_integers``, else as they are."""
    if kv.k_buffer.dtype == mxfp8.DATA_DTYPE and e4m3_by_integers(kv.k_buffer.device):
        return kv.k_buffer.view(torch.uint8), kv.v_buffer.view(torch.uint8)
    return kv.k_buffer, kv.v_buffer


def interpreting() -> bool:
    return settings.triton_interpreter()


def dot_dtype(kv: PagedKV):
    # The Triton interpreter's tl.dot gives garbage for bf16 operands (seen with triton 3.9 on the CPU: errors of
    # 1e10 on a 16x16 product), so interpreted runs dot in float32; the GPU tests cover the bf16 path.
    if interpreting():
        return tl.float32
    if kv.k_buffer.dtype == torch.float16:
        return tl.float16
    if kv.k_buffer.dtype == torch.float32:
        return tl.float32
    return tl.bfloat16


def scale_args(kv: PagedKV):
    """(k scale bytes, v scale bytes, scale layout page, interleaved) as the kernels take them."""
    if kv.is_mxfp8:
        return kv.k_scales.view(torch.uint8), kv.v_scales.view(torch.uint8), kv.layout.page_size, \
            kv.layout.interleaved
    # Unused; still typed pointers: the K buffer as the kernels take it, so an 8-bit pool is bytes where the GPU has no
    # e4m3 (Triton refuses a float8e4nv pointer before sm_89 even when nothing reads it).
    k_data = kv_data(kv)[0]
    return k_data, k_data, 1, False


def check_query_and_pool(q: torch.Tensor, kv: PagedKV, params: AttentionParams,
                         out: Optional[torch.Tensor]) -> None:
    """Checks shared by decode and extend (``q [rows, Hq, D]``; ``rel_bias [rows, Hq, rel_extent]``)."""
    if not isinstance(kv, PagedKV):
        raise TypeError(f"kv must be a PagedKV, got {type(kv).__name__}")
    if not isinstance(params, AttentionParams):
        raise TypeError(f"params must be an AttentionParams, got {type(params).__name__}")
    if isinstance(q, torch.Tensor):
        require_tensor(q, "q", "a [rows, Hq, D] bf16/fp16/fp32 tensor")
    if not isinstance(q, torch.Tensor) or q.dim() != 3 or q.dtype not in (torch.bfloat16, torch.float16,
                                                                          torch.float32):
        desc = f"{tuple(q.shape)} {q.dtype}" if isinstance(q, torch.Tensor) else type(q).__name__
        raise TypeError(f"q must be a [rows, Hq, D] bf16/fp16/fp32 tensor, got {desc}")
    require_extents(q, "q", (None, "Hq (query heads)", None))
    rows, hq, d = q.shape
    if q.stride(-1) != 1:
        raise ValueError("q must be contiguous in its last (head_dim) dimension")
    if d != kv.head_dim:
        raise ValueError(f"q's head_dim {d} does not match the pool's {kv.head_dim}")
    if not triton_head_dim_ok(d):
        raise ValueError(f"head_dim must be a power of two >= 32 for the Triton kernels, got {d}")
    if hq % kv.num_kv_heads:
        raise ValueError(f"q's head count {hq} must be a multiple of the pool's KV heads {kv.num_kv_heads}")
    for name, t in (("k_buffer", kv.k_buffer), ("v_buffer", kv.v_buffer)):
        if t.device != q.device:
            raise ValueError(f"kv.{name} is on {t.device}, q on {q.device}")
        if t.stride(-1) != 1:
            raise ValueError(f"kv.{name} must be contiguous in head_dim")
    if kv.is_mxfp8:
        for name in ("k_scales", "v_scales"):
            t = getattr(kv, name)
            if t.device != q.device:
                raise ValueError(f"kv.{name} is on {t.device}, q on {q.device}")
            if not t.is_contiguous():
                raise ValueError(f"kv.{name} must be contiguous")
    if params.rel_bias is not None:
        rb = params.rel_bias
        check_rel_bias(require_tensor(rb, "params.rel_bias"), rows, hq, "params.rel_bias")
        if rb.stride(-1) != 1 or rb.device != q.device:
            raise ValueError("params.rel_bias must be contiguous in its last dim and on q's device")
    if params.sinks is not None:
        if tuple(require_tensor(params.sinks, "params.sinks").shape) != (hq,) or params.sinks.device != q.device:
            raise ValueError(f"params.sinks must have shape [{hq}] on q's device, got {tuple(params.sinks.shape)}")
    if out is not None:
        require_tensor(out, "out", f"a [{rows}, {hq}, {d}] tensor contiguous in its last dim")
        if tuple(out.shape) != (rows, hq, d) or out.stride(-1) != 1:
            raise ValueError(f"out must be a [{rows}, {hq}, {d}] tensor contiguous in its last dim")
        if out.device != q.device or out.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError("out must be bf16/fp16/fp32 on q's device")


def check_index_tensor(name: str, t: torch.Tensor, device: torch.device) -> None:
    require_tensor(t, name, "a 1-D int32/int64 tensor")
    if t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be a 1-D int32/int64 tensor")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, q on {device}")


def check_page_size(page_size, kv: PagedKV) -> None:
    """A page table's page size: a positive multiple of 16 (the smallest tile), and for an MXFP8 pool with the
    interleaved scale layout a divisor or multiple of its page (a tile never crosses a scale page)."""
    require_int_value(page_size, "page_size", "a positive multiple of 16 with a page_table",
                      valid=lambda p: p % 16 == 0)
    if kv.is_mxfp8 and kv.layout.interleaved and page_size % kv.layout.page_size \
            and kv.layout.page_size % page_size:
        raise ValueError(f"page_size={page_size} must divide or be a multiple of the MXFP8 pool's scale page "
                         f"{kv.layout.page_size}")


def check_page_table(page_table: torch.Tensor, seq_lens: torch.Tensor, batch: int, page_size,
                     kv: PagedKV, device: torch.device) -> None:
    """No-sync checks of a page table (``[batch, max_pages]`` int32 page ids, contiguous rows) and its
    ``seq_lens`` (``[batch]`` int32/int64)."""
    for name, t in (("page_table", page_table), ("seq_lens", seq_lens)):
        if isinstance(t, torch.Tensor):
            require_tensor(t, name)
    if not isinstance(page_table, torch.Tensor) or page_table.dim() != 2 or page_table.dtype != torch.int32:
        desc = (f"{tuple(page_table.shape)} {page_table.dtype}" if isinstance(page_table, torch.Tensor)
                else type(page_table).__name__)
        raise TypeError(f"page_table must be a 2-D int32 tensor [batch, max_pages] of page ids, got {desc}")
    if not isinstance(seq_lens, torch.Tensor) or seq_lens.dim() != 1 or seq_lens.dtype not in (torch.int32,
                                                                                            torch.int64):
        desc = (f"{tuple(seq_lens.shape)} {seq_lens.dtype}" if isinstance(seq_lens, torch.Tensor)
                else type(seq_lens).__name__)
        raise TypeError(f"seq_lens must be a 1-D int32/int64 tensor [batch], got {desc}")
    for name, t in (("page_table", page_table), ("seq_lens", seq_lens)):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, q on {device}")
    if page_table.shape[0] != batch or seq_lens.numel() != batch:
        raise ValueError(f"page_table and seq_lens must have batch = {batch} rows, got page_table "
                         f"{tuple(page_table.shape)} and seq_lens {tuple(seq_lens.shape)}")
    if page_table.shape[1] < 1 or page_table.stride(1) != 1:
        raise ValueError(f"page_table must have at least one column and contiguous rows, got shape "
                         f"{tuple(page_table.shape)}, strides {page_table.stride()}")
    check_page_size(page_size, kv)


def validate_page_table(kv: PagedKV, page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
                        window: Optional[int] = None, query_lens: Optional[torch.Tensor] = None,
                        max_seq_len: Optional[int] = None) -> None:
    """Value checks of a page table (one device sync): every request has at least one key (and at least its
    ``query_lens`` queries' worth: extend), at most ``max_pages * page_size`` (and ``max_seq_len`` when given), and
    every page the kernels read is a page of the pool, ``[0, num_slots // page_size)``. The pages read are those
    from the one holding position ``max(0, first query's position - window + 1)`` to the last key's: entries
    before the window (a host's null block, say) are never read and not checked; no page is read twice by one
    request."""
    lens = seq_lens.long()
    max_pages = page_table.shape[1]
    qlens = torch.ones_like(lens) if query_lens is None else query_lens.long()
    if bool((lens < qlens).any()) or bool((lens < 1).any()):
        b = int(((lens < qlens) | (lens < 1)).nonzero()[0])
        raise ValueError(f"seq_lens[{b}]={int(lens[b])}: every request needs at least one key and one per query "
                         f"(its own), got fewer")
    if bool((lens > max_pages * page_size).any()):
        b = int((lens > max_pages * page_size).nonzero()[0])
        raise ValueError(f"seq_lens[{b}]={int(lens[b])} exceeds page_table's max_pages={max_pages} x "
                         f"page_size={page_size} = {max_pages * page_size} slots")
    if max_seq_len is not None:
        check_max_seq_len(max_seq_len)
        longest = int(lens.max())
        if longest > max_seq_len:
            raise ValueError(f"max_seq_len={max_seq_len} is below the longest request's {longest} keys "
                             f"(seq_lens); pass the batch's maximum or None")
    first = torch.zeros_like(lens)
    if window is not None:
        first = (lens - qlens - window + 1).clamp(min=0)
    j = torch.arange(max_pages, device=lens.device)
    read = (j[None, :] >= (first // page_size)[:, None]) & (j[None, :] * page_size < lens[:, None])
    num_pages = kv.num_slots // page_size
    bad = read & ((page_table < 0) | (page_table >= num_pages))
    # A page read twice by one request: its keys counted twice and, where the request writes there, one position
    # overwriting another's. Sorted per request (the pages not read given distinct negative stand-ins)
    ids = torch.where(read, page_table.long(), -1 - j[None, :])
    ordered = ids.sort(dim=1).values
    twice = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
    if bool(bad.any() | twice.any()):  # one device read for both
        if bool(bad.any()):
            b, i = (int(x) for x in bad.nonzero()[0])
            raise ValueError(f"page_table[{b}, {i}]={int(page_table[b, i])} is not a page of the pool: page ids "
                             f"must be in [0, {num_pages}) (num_slots={kv.num_slots} // page_size={page_size})")
        b, i = (int(x) for x in twice.nonzero()[0])
        page = int(ordered[b, i + 1])
        cols = [int(c) for c in ((page_table[b].long() == page) & read[b]).nonzero().flatten()[:2]]
        raise ValueError(f"page_table[{b}] names page {page} twice (entries {cols[0]} and {cols[1]}): each page a "
                         "request reads must be its own")


def check_decode_inputs(q: torch.Tensor, kv: PagedKV, kv_indptr: Optional[torch.Tensor] = None,
                        kv_indices: Optional[torch.Tensor] = None, params: Optional[AttentionParams] = None,
                        out: Optional[torch.Tensor] = None, *, page_table: Optional[torch.Tensor] = None,
                        seq_lens: Optional[torch.Tensor] = None, page_size: Optional[int] = None) -> None:
    """Shape, dtype and device checks that need no device sync, for the CSR (``kv_indptr``, ``kv_indices``) or the
    page table (``page_table``, ``seq_lens``, ``page_size``): exactly one of the two. Slot and page ranges are
    checked by ``validate_slots`` / ``validate_page_table``."""
    check_query_and_pool(q, kv, params, out)
    check_kv_map(q.shape[0], kv, q.device, kv_indptr, kv_indices, page_table, seq_lens, page_size)


def check_kv_map(batch: int, kv: PagedKV, device: torch.device, kv_indptr, kv_indices, page_table, seq_lens,
                 page_size) -> bool:
    """Checks for either map of requests to slots; returns whether it is a page table."""
    csr = kv_indptr is not None or kv_indices is not None
    table = page_table is not None or seq_lens is not None
    if csr == table:
        raise ValueError("give either kv_indptr and kv_indices (per-token CSR) or page_table and seq_lens, "
                         f"not {'both' if csr else 'neither'}")
    if table:
        check_page_table(page_table, seq_lens, batch, page_size, kv, device)
        return True
    check_index_tensor("kv_indptr", kv_indptr, device)
    check_index_tensor("kv_indices", kv_indices, device)
    if kv_indptr.numel() != batch + 1:
        raise ValueError(f"kv_indptr must have batch + 1 = {batch + 1} entries, got {kv_indptr.numel()}")
    return False


def validate_slots(kv: PagedKV, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                   page_size: Optional[int] = None, max_seq_len: Optional[int] = None) -> None:
    """Range checks that read the indices back (one device sync): call once per batch, e.g. at plan time.
    With ``page_size``, also that every request owns whole pages (its token t in slot ``page * P + t % P``); with
    ``max_seq_len``, that no request is longer (the plan covers ``max_seq_len`` keys per request and a longer
    request would lose its last keys)."""
    if int(kv_indptr[0]) != 0 or bool((kv_indptr[1:] < kv_indptr[:-1]).any()):
        raise ValueError("kv_indptr must start at 0 and be non-decreasing")
    total = int(kv_indptr[-1])
    if total > kv_indices.numel():
        raise ValueError(f"kv_indptr[-1]={total} exceeds kv_indices' length {kv_indices.numel()} (the rails' indptr "
                         "ends past their indices)")
    if bool((kv_indptr[1:] == kv_indptr[:-1]).any()):
        b = int((kv_indptr[1:] == kv_indptr[:-1]).nonzero()[0])
        raise ValueError(f"every decode request needs at least one key (its own): kv_indptr gives request {b} none")
    if max_seq_len is not None:
        check_max_seq_len(max_seq_len)
        longest = int(kv_indptr.diff().max())
        if longest > max_seq_len:
            raise ValueError(f"max_seq_len={max_seq_len} is below the longest request's {longest} keys "
                             f"(kv_indptr); pass the batch's maximum or None")
    used = kv_indices[:total]
    if used.numel() and (int(used.min()) < 0 or int(used.max()) >= kv.num_slots):
        raise ValueError(f"kv_indices must be slots in [0, {kv.num_slots}), got "
                         f"[{int(used.min())}, {int(used.max())}]")
    if page_size is not None and used.numel():
        used = used.long()
        lengths = kv_indptr[1:] - kv_indptr[:-1]
        pos = torch.arange(total, device=used.device) - torch.repeat_interleave(kv_indptr[:-1].long(), lengths)
        in_page = pos % page_size
        page_first = torch.arange(total, device=used.device) - in_page  # index of the token opening its page
        bad = (used % page_size != in_page) | (used - in_page != used[page_first])
        if bool(bad.any()):
            t = int(bad.nonzero()[0])
            raise ValueError(f"kv_indices are not whole pages of page_size={page_size}: entry {t} (token "
                             f"{int(pos[t])} of its request) is slot {int(used[t])}; token t must be in slot "
                             f"page * {page_size} + t % {page_size} with one page per {page_size} tokens")


def launch_strides(q: torch.Tensor, kv: PagedKV, rel_bias: Optional[torch.Tensor], out: torch.Tensor) -> tuple:
    """The stride arguments the decode and extend kernels share, in their order: q's row and head strides, K's and
    V's slot and head strides, the relative bias's row and head strides and its extent (0 without one), out's row
    and head strides."""
    rb = rel_bias
    return (q.stride(0), q.stride(1),
            kv.k_buffer.stride(0), kv.k_buffer.stride(1), kv.v_buffer.stride(0), kv.v_buffer.stride(1),
            rb.stride(0) if rb is not None else 0, rb.stride(1) if rb is not None else 0,
            rb.shape[2] if rb is not None else 0,
            out.stride(0), out.stride(1))


def launch_scalars(params: AttentionParams, kv: PagedKV) -> tuple:
    """The scalar arguments the decode and extend kernels share, in their order: softmax scale, per-tensor K and V
    scales, logit cap, window (0: none)."""
    return (float(params.softmax_scale), float(kv.k_scale), float(kv.v_scale), float(params.logit_cap),
            params.window if params.window is not None else 0)

