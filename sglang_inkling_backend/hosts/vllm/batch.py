"""One vLLM step's batch as the core's keys (``layer_step.StepKeys``): page tables for decode, per-token rails where
a route or a prefill needs them. Host-free (only torch): built from the tensors of vLLM's
``CommonAttentionMetadata``, so GPU tests run it without vLLM.

vLLM orders a batch decodes first (the builder's ``reorder_batch_threshold = 1``): requests ``[0, num_decodes)``
have one query token each; the rest are prefills or chunked-prefill extends. Sequence lengths count every key,
the new tokens included; a windowed layer reads only ``[seq_len - query_len - (W - 1), seq_len)``, so the null
blocks vLLM puts where a window has moved on are never read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from sglang_inkling_backend import checks, rails as rails_mod
from sglang_inkling_backend.rails import KVPages, KVRails
from sglang_inkling_backend.step_plans import DecodePlanCache


@dataclass
class VllmBatch:
    num_reqs: int
    num_actual_tokens: int
    num_decodes: int
    num_decode_tokens: int
    query_start_loc: torch.Tensor  # int32 [num_reqs + 1]
    seq_lens: torch.Tensor  # int32 [num_reqs]
    block_table: torch.Tensor  # int32 [num_reqs, max_blocks]
    slot_mapping: torch.Tensor  # int64 [>= num_actual_tokens], -1 for padding
    block_size: int
    max_seq_len: int  # host int: the decode plans' bound (the model's max length under CUDA-graph capture)
    workspace: object = None  # the route's decode workspace (the builder's, allocated once)
    route: object = None  # a route_protocol.Route (routes.TorchRoute, gpu.route.GpuRoute), chosen by the builder
    plans: DecodePlanCache = field(default_factory=DecodePlanCache)
    _rails: dict = field(default_factory=dict)

    def __post_init__(self):
        # Structure only (no device read: vLLM builds a batch every step, CUDA-graph replays included); the values
        # the kernels read are checked by the route once per step outside capture.
        for name in ("num_reqs", "num_actual_tokens", "num_decodes", "num_decode_tokens", "block_size", "max_seq_len"):
            value = getattr(self, name)
            if checks.is_integral(value):
                setattr(self, name, int(value))  # a numpy count from vLLM's host arrays is a count
        self.check_structure()

    def check_structure(self) -> None:
        """The counts (ints in range) and the per-request and per-token arrays (int tensors holding data, with an
        entry for every request or token the counts name: vLLM's buffers may hold more), no device read. Run at
        construction and again by ``check_values``: a field set after construction (a dataclass's fields can be)
        is checked before the kernels read it."""
        for name in ("num_reqs", "num_actual_tokens", "num_decodes", "num_decode_tokens"):
            setattr(self, name, checks.require_int(getattr(self, name), name, 0))
        self.block_size = checks.require_positive_int(self.block_size, "block_size")
        self.max_seq_len = checks.require_positive_int(self.max_seq_len, "max_seq_len")
        for name, t, rows, counted, dims in (
                ("query_start_loc", self.query_start_loc, self.num_reqs + 1, "request and one more (num_reqs + 1)", 1),
                ("seq_lens", self.seq_lens, self.num_reqs, "request (num_reqs)", 1),
                ("block_table", self.block_table, self.num_reqs, "request (num_reqs)", 2),
                ("slot_mapping", self.slot_mapping, self.num_actual_tokens, "token (num_actual_tokens)", 1)):
            checks.require_tensor(t, name, f"a {dims}-D int32/int64 tensor")
            if t.dtype not in (torch.int32, torch.int64) or t.dim() != dims:
                raise TypeError(f"{name} must be a {dims}-D int32/int64 tensor, got {t.dtype} {tuple(t.shape)}")
            checks.require_entries(t, name, rows, counted, at_least=True)
        # (CUDA-graph padding requests are decodes of no token: only prefills must have one.)
        if self.num_actual_tokens < self.num_reqs - self.num_decodes:
            raise ValueError(f"num_actual_tokens {self.num_actual_tokens} cannot hold "
                             f"{self.num_reqs - self.num_decodes} prefills of at least one token each")
        if not 0 <= self.num_decodes <= self.num_reqs:
            raise ValueError(f"num_decodes must lie in [0, {self.num_reqs}], got {self.num_decodes}")
        if self.num_decode_tokens != self.num_decodes:
            raise ValueError(f"decodes have one query token each: num_decode_tokens {self.num_decode_tokens} != "
                             f"num_decodes {self.num_decodes}")

    def check_values(self, num_blocks: int, window: Optional[int] = None) -> None:
        """The values the kernels read, in vLLM's words, before anything is written or read (one sync; the adapter
        calls it once per step and window outside CUDA-graph capture): ``query_start_loc`` from 0, non-decreasing,
        one token per decode, ending at ``num_actual_tokens``; ``seq_lens`` >= 0 for decodes (0: vLLM's CUDA-graph
        padding row) and at least each prefill's query tokens; the ``block_table`` entries a layer with ``window``
        visible keys reads (blocks before its window are not read: vLLM may have freed them) inside the cache's
        ``num_blocks`` blocks."""
        self.check_structure()  # host metadata only; a field may have been set since construction
        nr, nd = self.num_reqs, self.num_decodes
        if nr == 0:
            return
        qsl = self.query_start_loc[:nr + 1].tolist()
        lens = self.seq_lens[:nr].tolist()
        shown = qsl if len(qsl) <= 8 else qsl[:4] + ["..."] + qsl[-2:]
        if qsl[0] != 0 or any(b < a for a, b in zip(qsl, qsl[1:])) or qsl[-1] != self.num_actual_tokens:
            raise ValueError(f"query_start_loc must start at 0, be non-decreasing and end at num_actual_tokens "
                             f"({self.num_actual_tokens}), got {shown}")
        if qsl[:nd + 1] != list(range(nd + 1)):
            raise ValueError(f"the first num_decodes ({nd}) requests are decodes of one query token each: "
                             f"query_start_loc must begin 0, 1, ..., {nd}, got {shown}")
        if min(lens) < 0:
            i = lens.index(min(lens))
            raise ValueError(f"seq_lens must be >= 0, got seq_lens[{i}]={lens[i]}")
        short = [i for i in range(nd, nr) if lens[i] < qsl[i + 1] - qsl[i]]
        if short:
            i = short[0]
            raise ValueError(f"seq_lens[{i}]={lens[i]} is shorter than request {i}'s {qsl[i + 1] - qsl[i]} query "
                             "tokens (seq_lens count the cached tokens and the new ones)")
        # A decode padding row (0 keys) is read as one key, in its table's first block: check that block too.
        blocks = [-(-max(n, 1 if i < nd else 0) // self.block_size) for i, n in enumerate(lens)]
        first = [0] * nr if window is None else \
            [max(0, lens[i] - (qsl[i + 1] - qsl[i]) - (window - 1)) // self.block_size for i in range(nr)]
        if max(blocks) > self.block_table.shape[1]:
            i = blocks.index(max(blocks))
            raise ValueError(f"seq_lens[{i}]={lens[i]} needs {blocks[i]} blocks of {self.block_size}; block_table has "
                             f"{self.block_table.shape[1]} columns")
        column = torch.arange(self.block_table.shape[1], device=self.block_table.device)[None, :]
        used = (column < torch.tensor(blocks, device=column.device)[:, None]) & \
            (column >= torch.tensor(first, device=column.device)[:, None])
        ids = self.block_table[:nr][used]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
            bad = ((ids < 0) | (ids >= num_blocks)).nonzero()[0].item()
            raise ValueError(f"block_table entries that seq_lens reach{'' if window is None else ' in the window'} "
                             f"must be blocks of the cache in [0, {num_blocks}), got {int(ids[bad])}")

    @property
    def num_prefills(self) -> int:
        return self.num_reqs - self.num_decodes

    # layer_step.StepKeys
    @property
    def num_decode_rows(self) -> int:
        return self.num_decodes

    def decode_keys(self, window: Optional[int], reads_page_tables: bool):
        return self.decode_pages() if reads_page_tables else self.decode_rails(window)

    def extend_keys(self, window: Optional[int]) -> tuple[KVRails, torch.Tensor]:
        return self.prefill_rails(window)

    def decode_pages(self) -> KVPages:
        """The decode requests' page table: vLLM's block table as it is, and its sequence lengths with vLLM's
        CUDA-graph padding rows (length 0) read as one key: a padded row reads its table's first entry, an in-bounds
        block, and its output is discarded. No host sync. Made on every call, not cached: a CUDA graph must capture
        the clamp, or a replay would read the lengths of the step that was warmed up before capture."""
        nd = self.num_decodes
        return KVPages(self.block_table[:nd], torch.clamp(self.seq_lens[:nd], min=1), self.block_size)

    def decode_rails(self, window: Optional[int]) -> KVRails:
        """The decode requests' rails, vLLM's CUDA-graph padding rows (length 0) read as one key, as
        ``decode_pages`` reads them: every decode request then has a key, which the kernels require."""
        return self._rails_of(window, 0, self.num_decodes)

    def prefill_rails(self, window: Optional[int]) -> tuple[KVRails, torch.Tensor]:
        """The prefill requests' rails and their query offsets (``qo_indptr`` from 0)."""
        nd = self.num_decodes
        qsl = self.query_start_loc[nd: self.num_reqs + 1].to(torch.int64)
        return self._rails_of(window, nd, self.num_reqs), qsl - qsl[0]

    def _rails_of(self, window: Optional[int], first: int, last: int) -> KVRails:
        key = (window, first, last)
        found = self._rails.get(key)
        if found is None:
            seq_lens = self.seq_lens[first:last].to(torch.int64)
            if first < self.num_decodes:
                seq_lens = torch.clamp(seq_lens, min=1)
            table = rails_mod.block_table_token_table(self.block_table[first:last], self.block_size)
            start = None
            if window is not None:
                qsl = self.query_start_loc[first: last + 1].to(torch.int64)
                start = rails_mod.window_start(seq_lens, qsl[1:] - qsl[:-1], window)
            rows = torch.arange(last - first, device=table.device)
            found = self._rails[key] = rails_mod.gather_rails(table, rows, seq_lens, start)
        return found


def padded_slots(slot_mapping: torch.Tensor) -> torch.Tensor:
    """vLLM's slot mapping with padding (-1) sent to slot 0: block 0 is vLLM's null block, never given to a request,
    so writes there are never read (no host sync, so CUDA graphs can capture it)."""
    return torch.clamp(slot_mapping.to(torch.int64), min=0)
