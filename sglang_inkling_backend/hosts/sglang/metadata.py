"""Forward metadata for the inkling backend: which pool slots each request attends over.

Host-free (only torch): the backend hands in SGLang's tensors (``req_to_token``, ``req_pool_indices``, ``seq_lens``,
``extend_seq_lens``, ``out_cache_loc``, the full->SWA slot map) and gets the keys' maps back (the core's
``rails``: per-token CSR rails and page tables), so everything here is testable without a server.

- Decode on a paged pool read by a route that takes page tables (the Triton route on an MXFP8 pool, page 128):
  one page table ``pages`` serves every layer whose slots are positions of the full pool (full layers, and
  windowed layers unless a hybrid SWA pool keeps them apart); no per-token rails are built for them.
- Otherwise, and for extend: the *full* rail ``[0, seq_len)`` and one *window* rail per window, translated to the
  sliding-window sub-pool's slots on a hybrid SWA pool (``rails.translate_rails``).

Decode CUDA graphs: ``DecodeGraphBuffers`` preallocates every map at its largest size once, and ``refill`` writes a
new batch into the same storage (addresses never change), returning metadata whose tensors are views of it.

Decode plans: every metadata carries a ``DecodePlanCache``, so the Triton route plans a step's decode once per key
(window, layer shape) instead of once per layer; the plans are views of the backend's one workspace.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import torch

from sglang_inkling_backend.attention_inputs import SpecVerify
from sglang_inkling_backend.checks import (PADDING_SLOT, require_device, require_int_value, require_slots,
                                          require_tensor)
from sglang_inkling_backend.hosts.sglang.spec_verify import full_layout_tree_index
from sglang_inkling_backend.rails import (INDEX_DTYPE, KVPages, KVRails, check_host_lengths, check_token_table,
                                          gather_rails_host_lengths, page_table, translate_rails, window_start)
from sglang_inkling_backend.step_plans import DecodePlanCache

@dataclass
class InklingForwardMetadata:
    is_decode: bool
    batch_size: int
    qo_indptr: torch.Tensor  # int64 [B + 1]: request b's queries are rows qo_indptr[b]:qo_indptr[b+1]
    full: Optional[KVRails]  # None when ``pages`` serves the full pool's layers
    windows: dict[int, KVRails] = field(default_factory=dict)  # keyed by W = visible keys
    pages: Optional[KVPages] = None  # decode on a paged pool: the full pool's page table
    # Write slots in the SWA sub-pool for this batch's new tokens (hybrid SWA pools only). The in-tree Inkling model
    # reads it under this name from the backend's forward_metadata.
    swa_out_cache_loc: Optional[torch.Tensor] = None
    # CUDA-graph metadata: tensors are views of DecodeGraphBuffers and writes must not sync.
    graph: bool = False
    # The longest request's keys, a host int: sizes the decode plan without a device read (the batch's maximum
    # eagerly; under CUDA graphs the context limit, so capture and replay plan the same grid).
    max_seq_len: Optional[int] = None
    # This step's decode plans (the Triton route's), shared by its layers; a new metadata starts with an empty cache.
    decode_plans: DecodePlanCache = field(default_factory=DecodePlanCache, repr=False, compare=False)
    # A speculative target-verify step: the extend rows are draft tokens, one tree per request (SpecVerify)
    verify: Optional[SpecVerify] = None
    # An eager step's write slots (out_cache_loc), checked once in init_forward_metadata against the pool (range,
    # no slot twice): their count, or None where they were not (a hybrid pool's layers store through SGLang's pool)
    checked_write_slots: Optional[int] = None
    # An eager decode step's plans, one per group of layers that plan alike (the backend's decode_group_of_layer
    # indexes them; None for a group whose calls plan themselves), made in init_forward_metadata
    decode_groups: Optional[list] = None
    # An eager extend step's plans, the same per group of layers that plan alike (the backend's
    # extend_group_of_layer), made in init_forward_metadata; None for a verify step (its layers plan themselves)
    extend_groups: Optional[list] = None
    # The batch this metadata was built for, as host ints: an eager layer call checks its batch against them before
    # it stores (metadata of another batch would store at its slots, then be refused by the kernels' checks)
    built_for: Optional[tuple] = None  # (batch_size, new tokens: out_cache_loc's length)

    # layer_step.StepKeys: an SGLang batch is all decode (one query row per request) or all extend.
    @property
    def num_decode_rows(self) -> int:
        return self.batch_size if self.is_decode else 0

    @property
    def plans(self) -> DecodePlanCache:
        return self.decode_plans

    def decode_keys(self, window: Optional[int], reads_page_tables: bool):
        """The page table where this metadata built one (``page_size`` given: the route reads page tables and the
        pool holds whole pages) and it serves this window, else the window's rails (a hybrid SWA pool's windowed
        layers, no page table)."""
        if self.pages is not None and window not in self.windows:
            return self.pages
        return self.rails(window)

    def extend_keys(self, window: Optional[int]) -> tuple[KVRails, torch.Tensor]:
        return self.rails(window), self.qo_indptr

    def rails(self, window: Optional[int]) -> KVRails:
        """The rails a layer with ``window`` visible keys (None: full attention) reads."""
        if window is None:
            if self.full is None:
                raise ValueError("window None: this step's metadata has no full rails (its page table serves the "
                                 "full layers)")
            return self.full
        rails = self.windows.get(window)
        if rails is None:
            raise ValueError(f"window {window}: no window rails for window {window} in this step's metadata "
                             f"(init_forward_metadata built them for windows {sorted(self.windows)}, the layer "
                             f"record's)")
        return rails


def _check_host_batch(seq_host: torch.Tensor, query_host: torch.Tensor, rows_host: torch.Tensor,
                      table_shape: tuple, *, decode: bool) -> None:
    """``build_forward_metadata``'s range checks, on the host copies of its lengths and rows."""
    max_reqs, width = table_shape
    shortest, longest = int(seq_host.min()), int(seq_host.max())
    if shortest < 0 or longest > width:
        raise ValueError(f"seq_lens must lie in [0, {width}] (req_to_token's width), got [{shortest}, {longest}]")
    lo, hi = int(rows_host.min()), int(rows_host.max())
    if lo < 0 or hi >= max_reqs:
        raise ValueError(f"req_pool_indices must lie in [0, {max_reqs}), got [{lo}, {hi}]")
    if decode:
        if shortest < 1:
            raise ValueError("decode seq_lens must be >= 1 (they count the new token)")
    elif int(query_host.min()) < 0 or bool((query_host > seq_host).any()):
        raise ValueError("extend_seq_lens must lie in [0, seq_len] for every request")


def build_forward_metadata(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, *,
                           extend_seq_lens: Optional[torch.Tensor] = None, windows: Iterable[int] = (),
                           full_to_swa: Optional[torch.Tensor] = None,
                           out_cache_loc: Optional[torch.Tensor] = None, page_size: Optional[int] = None,
                           max_seq_len: Optional[int] = None,
                           num_slots: Optional[int] = None) -> InklingForwardMetadata:
    """Eager metadata. Decode when ``extend_seq_lens`` is None (one query per request, ``seq_lens`` counting it);
    extend otherwise (``seq_lens`` = cached prefix + new tokens; prefix-cache hits and chunked prefill are both just
    a prefix). ``page_size`` (decode only): build the page table instead of the full rail and of the window rails
    it serves (all windows unless ``full_to_swa`` keeps them in a sub-pool); ``max_seq_len`` (a host int, the
    batch's longest request) then sizes it. ``num_slots``: the pool's slots; the batch's ``req_to_token`` entries
    are checked to lie in it before any layer stores (one sync; eager steps only)."""
    check_token_table(req_to_token, req_pool_indices, seq_lens, ranges=False)  # types and shapes
    for name, t in (("extend_seq_lens", extend_seq_lens), ("full_to_swa", full_to_swa),
                    ("out_cache_loc", out_cache_loc)):
        if t is not None:
            require_tensor(t, name, "None or an integer tensor")
    device = req_to_token.device
    bs = seq_lens.numel()
    seq_lens = seq_lens.to(device=device, dtype=INDEX_DTYPE)
    if extend_seq_lens is None:
        query_lens = torch.ones(bs, dtype=INDEX_DTYPE, device=device)
    else:
        query_lens = extend_seq_lens.to(device=device, dtype=INDEX_DTYPE)
        if query_lens.shape != seq_lens.shape:
            raise ValueError(f"extend_seq_lens must have one entry per request ({bs}), got {tuple(query_lens.shape)}")
    # The batch's lengths and rows on the host in one device read; every check and rail length below uses them.
    seq_host, query_host, rows_host = torch.stack(
        [seq_lens, query_lens, req_pool_indices.to(device=device, dtype=INDEX_DTYPE)]).to("cpu")
    if bs:
        _check_host_batch(seq_host, query_host, rows_host, req_to_token.shape, decode=extend_seq_lens is None)
    qo_indptr = torch.zeros(bs + 1, dtype=INDEX_DTYPE, device=device)
    torch.cumsum(query_lens, dim=0, out=qo_indptr[1:])
    pages = None
    if page_size is not None and extend_seq_lens is None:
        require_int_value(max_seq_len, "max_seq_len", "a positive int (host) with page_size")
        pages = KVPages(page_table(req_to_token, req_pool_indices, page_size, -(-max_seq_len // page_size),
                                   check=False), seq_lens, page_size)  # the rows were checked above
    full = gather_rails_host_lengths(req_to_token, req_pool_indices, seq_host) if pages is None else None
    if num_slots is not None and bs and int(seq_host.max()):
        if full is not None:
            low, high = full.indices.min(), full.indices.max()
        else:  # the page table's step reads no rails: each request's first seq_lens entries, masked, not gathered
            longest = int(seq_host.max())
            block = req_to_token[req_pool_indices.to(device=device, dtype=INDEX_DTYPE), :longest]
            past = torch.arange(longest, device=device) >= seq_lens[:, None]
            low, high = block.masked_fill(past, num_slots).min(), block.masked_fill(past, 0).max()
        low, high = torch.stack([low, high]).tolist()
        if low < 0 or high >= num_slots:
            raise ValueError(f"req_to_token's entries for this batch (req_pool_indices' rows up to seq_lens) "
                             f"must be slots of the KV pool in [0, {num_slots}), got [{low}, {high}]")
    rail_windows = sorted(set(windows)) if pages is None or full_to_swa is not None else []
    # every slot the window rails read was checked against the full pool above: a map covering it needs no read
    check_map = full_to_swa is not None and (num_slots is None or full_to_swa.numel() < num_slots)
    window_rails = {
        w: translate_rails(gather_rails_host_lengths(req_to_token, req_pool_indices, seq_host,
                                                     window_start(seq_host, query_host, w)),
                           full_to_swa, check=check_map)
        for w in rail_windows
    }
    swa_loc = None
    if full_to_swa is not None and out_cache_loc is not None:
        # an index past the map would be an IndexError here on a CPU and a device assert on a GPU
        loc = require_slots(out_cache_loc, "out_cache_loc (the step's write slots)", full_to_swa.numel(),
                            where=" (the hybrid pool's full-to-SWA map)")
        swa_loc = full_to_swa[loc]
    return InklingForwardMetadata(is_decode=extend_seq_lens is None, batch_size=bs, qo_indptr=qo_indptr, full=full,
                                  windows=window_rails, pages=pages, swa_out_cache_loc=swa_loc,
                                  max_seq_len=max_seq_len)


def _checked_host_lengths(req_to_token, rows, seq_lens, seq_lens_host, max_len: int) -> torch.Tensor:
    """A graph refill's lengths on the host: ``seq_lens_host`` checked on the host (in ``[1, max_len]``), or, without
    it, the rows and lengths read back from the device and checked (several syncs)."""
    if seq_lens_host is None:
        check_token_table(req_to_token, rows, seq_lens)
        return seq_lens.to("cpu", INDEX_DTYPE)
    check_host_lengths(seq_lens_host, seq_lens.numel(), max_len)
    check_token_table(req_to_token, rows, seq_lens, ranges=False)
    return seq_lens_host


def _refill_window_rails(buffers, req_to_token, rows, keys_host, query_lens_host, full_to_swa,
                         gather_slots) -> dict:
    """Each of ``buffers.windows``' rails (into ``buffers.window_indptr`` / ``window_indices``): the keys of requests
    of ``keys_host`` keys whose last ``query_lens_host`` are queries that a window can see, translated to the SWA
    sub-pool's slots by ``full_to_swa`` (a hybrid pool), with no device read."""
    windows = {}
    for w in buffers.windows:
        start = window_start(keys_host, query_lens_host, w)
        rails = gather_rails_host_lengths(req_to_token, rows, keys_host, start, out_indptr=buffers.window_indptr[w],
                                          out_indices=buffers.window_indices[w], gather_slots=gather_slots)
        if full_to_swa is not None:
            nnz = int((keys_host - start).sum())
            rails.indices[:nnz].copy_(full_to_swa[rails.indices[:nnz]])
        windows[w] = rails
    return windows


def _refill_swa_loc(buffer: torch.Tensor, out_cache_loc: torch.Tensor, full_to_swa: torch.Tensor,
                    rows: int) -> torch.Tensor:
    """``buffer[:rows]``: the real rows' write slots (``out_cache_loc``, the first rows) in the SWA sub-pool, then the
    padding slot 0 for SGLang's padding rows, as their full-pool writes do."""
    real = out_cache_loc.numel()
    buffer[:real].copy_(full_to_swa[out_cache_loc.to(INDEX_DTYPE)])
    buffer[real:rows].fill_(PADDING_SLOT)
    return buffer[:rows]


class DecodeGraphBuffers:
    """Address-stable decode metadata for CUDA-graph capture and replay: allocated once at the largest batch and
    context, refilled in place for every batch. With ``page_size`` the full pool's layers read a page table
    (``[max_bs, cdiv(max_context_len, page_size)]`` int32) and no per-token full rail is allocated (it would be
    ``max_bs * max_context_len`` int64); window rails remain only for a hybrid SWA pool's windowed layers."""

    def __init__(self, max_bs: int, max_context_len: int, windows: Iterable[int], device, *, swa: bool,
                 page_size: Optional[int] = None):
        if max_bs < 1 or max_context_len < 1:
            raise ValueError(f"max_bs and max_context_len must be >= 1, got {max_bs} and {max_context_len}")
        if page_size is not None:
            require_int_value(page_size, "page_size", "None or a positive int")
        device = require_device(device)  # before the first allocation
        self.max_bs = max_bs
        self.max_context_len = max_context_len
        self.page_size = page_size
        self.windows = sorted(set(windows)) if page_size is None or swa else []
        self.swa = swa
        zeros = lambda n: torch.zeros(n, dtype=INDEX_DTYPE, device=device)  # noqa: E731
        self.qo_indptr = torch.arange(max_bs + 1, dtype=INDEX_DTYPE, device=device)
        if page_size is None:
            self.full_indptr = zeros(max_bs + 1)
            self.full_indices = zeros(max_bs * max_context_len)
            self.page_table = self.seq_lens = None
        else:
            self.full_indptr = self.full_indices = None
            max_pages = -(-max_context_len // page_size)
            self.page_table = torch.zeros(max_bs, max_pages, dtype=torch.int32, device=device)
            self.seq_lens = torch.ones(max_bs, dtype=INDEX_DTYPE, device=device)
        self.window_indptr = {w: zeros(max_bs + 1) for w in self.windows}
        self.window_indices = {w: zeros(max_bs * min(w, max_context_len)) for w in self.windows}
        self.swa_out_cache_loc = zeros(max_bs) if swa else None

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer (tests check their addresses never move)."""
        out = [t for t in (self.qo_indptr, self.full_indptr, self.full_indices, self.page_table, self.seq_lens)
               if t is not None]
        out += [self.window_indptr[w] for w in self.windows] + [self.window_indices[w] for w in self.windows]
        return out + ([self.swa_out_cache_loc] if self.swa_out_cache_loc is not None else [])

    def refill(self, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, *,
               full_to_swa: Optional[torch.Tensor] = None, out_cache_loc: Optional[torch.Tensor] = None,
               seq_lens_host: Optional[torch.Tensor] = None,
               gather_slots: Optional[Callable[..., None]] = None) -> InklingForwardMetadata:
        """The batch's maps, written into the buffers. With ``seq_lens_host`` (the same lengths on the host: SGLang's
        ``seq_lens_cpu``) nothing reads the device: the lengths are checked and the rails summed on the host, and the
        rows and table entries are SGLang's own (its eager steps check them); without it the lengths and rows are
        read back and checked (several syncs, each stalling the GPU until it drains). ``gather_slots`` (a route's
        ``gather_rail_slots``: one kernel; None: torch) gathers the rails' slots."""
        check_token_table(req_to_token, req_pool_indices, seq_lens, ranges=False)  # types and shapes, first
        for name, t in (("full_to_swa", full_to_swa), ("out_cache_loc", out_cache_loc)):
            if t is not None:
                require_tensor(t, name, "None or an integer tensor")
        bs = seq_lens.numel()
        if bs > self.max_bs:
            raise ValueError(f"batch of {bs} exceeds the graph buffers' max_bs {self.max_bs}")
        if self.swa != (full_to_swa is not None):
            raise ValueError("full_to_swa must be given exactly when the buffers were built for a hybrid SWA pool")
        if self.swa_out_cache_loc is not None and (out_cache_loc is None or out_cache_loc.dim() != 1
                                                   or out_cache_loc.numel() > bs):
            # checked before any buffer is refilled
            got = None if out_cache_loc is None else tuple(out_cache_loc.shape)
            raise ValueError(f"out_cache_loc must hold one slot per real request (at most {bs}, the padding "
                             f"rows last) with a hybrid SWA pool, got {got}")
        seq_lens_host = _checked_host_lengths(req_to_token, req_pool_indices, seq_lens, seq_lens_host,
                                              min(req_to_token.shape[1], self.max_context_len))
        seq_lens = seq_lens.to(device=req_to_token.device, dtype=INDEX_DTYPE)
        full = pages = None
        if self.page_size is None:
            full = gather_rails_host_lengths(req_to_token, req_pool_indices, seq_lens_host,
                                             out_indptr=self.full_indptr, out_indices=self.full_indices,
                                             gather_slots=gather_slots)
        else:  # the table has a fixed width: no batch size is read back
            self.page_table[:bs].copy_(page_table(req_to_token, req_pool_indices, self.page_size,
                                                  self.page_table.shape[1], check=False))
            self.seq_lens[:bs].copy_(seq_lens)
            pages = KVPages(self.page_table[:bs], self.seq_lens[:bs], self.page_size)
        windows = _refill_window_rails(self, req_to_token, req_pool_indices, seq_lens_host,
                                       torch.ones_like(seq_lens_host), full_to_swa, gather_slots)
        swa_loc = None
        if self.swa_out_cache_loc is not None:
            # SGLang's replay view carries the real rows' out_cache_loc (raw_bs of them) next to the padded batch's
            # bs rows (decode_cuda_graph_runner.build_replay_fb_view)
            swa_loc = _refill_swa_loc(self.swa_out_cache_loc, out_cache_loc, full_to_swa, bs)
        return InklingForwardMetadata(is_decode=True, batch_size=bs, qo_indptr=self.qo_indptr[: bs + 1], full=full,
                                      windows=windows, pages=pages, swa_out_cache_loc=swa_loc)


class VerifyGraphBuffers:
    """Address-stable metadata for a speculative target's CUDA graphs, whose every batch is a verify step of
    ``draft_len`` (D) draft tokens per request (SGLang captures TARGET_VERIFY graphs of ``max_bs * D`` rows when
    speculation is on). Allocated once, refilled in place (``refill``) before every capture and replay:

    - ``qo_indptr`` ``arange(max_bs + 1) * D``, ``mask_indptr`` ``arange(max_bs + 1) * D * D`` (constant);
    - ``tree_mask`` bool ``[max_bs * D * D]`` (each request's ``[D, D]`` tree; EAGLE's tree kernel writes it in place
      where the backend exposes it as SGLang's QLEN_ONLY ``VerifyMask``) and ``depths`` int64 ``[max_bs * D]``;
    - per-token CSR rails over each request's ``seq_len + D`` keys (the verify kernel reads CSR, also on a paged
      pool), ``max_bs * max_context_len`` int64 slots, and one rail per window over its last ``w + D - 1`` keys;
    - ``swa_out_cache_loc`` ``[max_bs * D]`` on a hybrid SWA pool.

    The drafts' keys are read from the pool, where each layer stores them before it attends."""

    def __init__(self, max_bs: int, draft_len: int, max_context_len: int, windows: Iterable[int], device, *,
                 swa: bool):
        for name, value in (("max_bs", max_bs), ("draft_len", draft_len), ("max_context_len", max_context_len)):
            require_int_value(value, name)
        if draft_len >= max_context_len:
            raise ValueError(f"draft_len ({draft_len}) must be below max_context_len ({max_context_len})")
        device = require_device(device)  # before the first allocation
        self.max_bs, self.draft_len, self.max_context_len = max_bs, draft_len, max_context_len
        self.windows = sorted(set(windows))
        self.swa = swa
        d = draft_len
        zeros = lambda n: torch.zeros(n, dtype=INDEX_DTYPE, device=device)  # noqa: E731
        steps = torch.arange(max_bs + 1, dtype=INDEX_DTYPE, device=device)
        self.qo_indptr = steps * d
        self.mask_indptr = steps * d * d
        # a chain per request until a batch's trees are written (the capture runs on it)
        self.tree_mask = torch.ones(d, d, dtype=torch.bool, device=device).tril().repeat(max_bs, 1, 1).reshape(-1)
        self.depths = torch.arange(d, dtype=INDEX_DTYPE, device=device).repeat(max_bs)
        self.full_indptr = zeros(max_bs + 1)
        self.full_indices = zeros(max_bs * max_context_len)
        self.window_indptr = {w: zeros(max_bs + 1) for w in self.windows}
        self.window_indices = {w: zeros(max_bs * min(w + d - 1, max_context_len)) for w in self.windows}
        self.swa_out_cache_loc = zeros(max_bs * d) if swa else None

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer (tests check their addresses never move)."""
        out = [self.qo_indptr, self.mask_indptr, self.tree_mask, self.depths, self.full_indptr, self.full_indices]
        out += [self.window_indptr[w] for w in self.windows] + [self.window_indices[w] for w in self.windows]
        return out + ([self.swa_out_cache_loc] if self.swa_out_cache_loc is not None else [])

    def owns_mask(self, mask) -> bool:
        """Whether ``mask`` is this buffer's tree mask (EAGLE wrote the trees into it in place)."""
        return isinstance(mask, torch.Tensor) and mask.data_ptr() == self.tree_mask.data_ptr()

    def refill(self, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
               positions: torch.Tensor, mask: Optional[torch.Tensor], *, num_real: int,
               seq_lens_host: Optional[torch.Tensor] = None, full_to_swa: Optional[torch.Tensor] = None,
               out_cache_loc: Optional[torch.Tensor] = None,
               gather_slots: Optional[Callable[..., None]] = None) -> InklingForwardMetadata:
        """A verify batch of ``bs = seq_lens.numel()`` rows (the first ``num_real`` real, the rest SGLang's padding:
        request row 0, ``seq_lens`` 1, positions 0), written into the buffers without reading the device when
        ``seq_lens_host`` is given. ``seq_lens`` count each request's cached keys (the drafts excluded, as SGLang's);
        ``positions`` ``[bs * D]`` are ``seq_len + depth`` (depths are taken from them on the device); ``mask`` is the
        real requests' trees: this buffer's own tree mask (nothing to copy), the trees alone ``[num_real * D * D]``,
        the FULL layout (``[D, seq_len + D]`` per real request: gathered on the device; its prefix columns are not
        read, SGLang sets them all True), or None (the capture: the trees stay as they are). ``out_cache_loc``
        (hybrid SWA pools): the real rows' ``num_real * D`` write slots; the padding rows' SWA slots are 0."""
        check_token_table(req_to_token, req_pool_indices, seq_lens, ranges=False)  # types and shapes, first
        for name, t in (("positions", positions), ("mask", mask), ("full_to_swa", full_to_swa),
                        ("out_cache_loc", out_cache_loc)):
            if isinstance(t, torch.Tensor):
                require_tensor(t, name)
        d, bs = self.draft_len, seq_lens.numel()
        if not 1 <= bs <= self.max_bs:
            raise ValueError(f"a verify batch of {bs} requests; the graph buffers hold 1 to {self.max_bs} (max_bs)")
        require_int_value(num_real, "num_real", f"an int in [0, {bs}] (the batch's real requests)", minimum=0,
                          maximum=bs)
        if self.swa != (full_to_swa is not None):
            raise ValueError("full_to_swa must be given exactly when the buffers were built for a hybrid SWA pool")
        if not isinstance(positions, torch.Tensor) or positions.dim() != 1 or positions.numel() < bs * d \
                or positions.is_floating_point():
            got = tuple(positions.shape) if isinstance(positions, torch.Tensor) else positions
            raise ValueError(f"positions must be a 1-D integer tensor of at least {bs} x {d} entries (one per draft "
                             f"token), got {got!r}")
        if self.swa_out_cache_loc is not None and (out_cache_loc is None or out_cache_loc.dim() != 1
                                                   or out_cache_loc.numel() != num_real * d):
            got = None if out_cache_loc is None else tuple(out_cache_loc.shape)
            raise ValueError(f"out_cache_loc must hold the real requests' {num_real} x {d} write slots with a hybrid "
                             f"SWA pool, got {got}")
        seq_lens_host = _checked_host_lengths(req_to_token, req_pool_indices, seq_lens, seq_lens_host,
                                              min(req_to_token.shape[1], self.max_context_len) - d)
        device = req_to_token.device
        seq_lens = seq_lens.to(device=device, dtype=INDEX_DTYPE)
        tree_copy = None  # the real requests' trees, gathered before any buffer is written
        if mask is not None and not self.owns_mask(mask):
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 1:
                raise TypeError(f"the verify mask must be a 1-D bool tensor, got "
                                f"{f'{mask.dtype} {tuple(mask.shape)}' if isinstance(mask, torch.Tensor) else mask!r}")
            full = int((seq_lens_host[:num_real] + d).sum()) * d
            if mask.numel() == num_real * d * d:
                tree_copy = mask
            elif mask.numel() == full:
                tree_copy = mask.index_select(0, full_layout_tree_index(seq_lens[:num_real], d))
            else:
                raise ValueError(f"the verify mask must hold {num_real * d * d} (the real requests' trees) or {full} "
                                 f"(FULL layout, [D, seq_len + D] per real request) entries, got {mask.numel()}")
        keys_host = seq_lens_host.to(INDEX_DTYPE) + d  # each request's keys: its prefix and its drafts
        full = gather_rails_host_lengths(req_to_token, req_pool_indices, keys_host, out_indptr=self.full_indptr,
                                         out_indices=self.full_indices, gather_slots=gather_slots)
        windows = _refill_window_rails(self, req_to_token, req_pool_indices, keys_host, torch.full_like(keys_host, d),
                                       full_to_swa, gather_slots)
        if tree_copy is not None:
            self.tree_mask[:tree_copy.numel()].copy_(tree_copy)
        # depth = position - seq_len; SGLang's padding rows (position 0, seq_len 1) get depth 0
        depths = self.depths[:bs * d].view(bs, d)
        torch.sub(positions[:bs * d].view(bs, d).to(INDEX_DTYPE), seq_lens.view(bs, 1), out=depths)
        depths.clamp_(min=0)
        swa_loc = None
        if self.swa_out_cache_loc is not None:
            swa_loc = _refill_swa_loc(self.swa_out_cache_loc, out_cache_loc, full_to_swa, bs * d)
        verify = SpecVerify.uniform(self.tree_mask[:bs * d * d], self.mask_indptr[:bs + 1], self.depths[:bs * d], d,
                                    bs)
        return InklingForwardMetadata(is_decode=False, batch_size=bs, qo_indptr=self.qo_indptr[:bs + 1], full=full,
                                      windows=windows, swa_out_cache_loc=swa_loc, graph=True,
                                      max_seq_len=self.max_context_len, verify=verify)
