"""Decode planning: the kernel configuration and split count for a batch (``choose_config``, ``choose_num_splits``,
``choose_merge_block_d``, from H200 sweeps), the caller-owned split-KV workspace (``DecodeWorkspace``) and
``plan_decode``, which ties them into a ``DecodePlan`` that every layer of a decode step reuses.

Planning reads nothing from the device when the caller gives ``max_seq_len``, and allocates nothing when it gives a
workspace: the plan's split buffers are views of it. So a plan made during CUDA-graph capture points at memory the
caller keeps for the graph's life, and capture and replay need no cache reset. Sizing a workspace for every batch up
to a maximum: ``DecodeWorkspace.for_max_context`` (or ``decode_workspace_splits`` and ``DecodeWorkspace.nbytes_for``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional, Union

import torch
import triton

from .. import kv_formats, settings
from ..checks import is_power_of_two, require_device, require_int_value
from ..scale_layout import INTERLEAVED_PAGE_SIZE

MIN_SPLIT_TOKENS = 256  # fewer keys per split and the merge costs more than the parallelism gains
DEFAULT_BLOCK_N = 64
KERNELS = ("tiles", "blocks", "hopper", "hopper_ws")  # decode_tiles, decode_blocks, decode_hopper (Gluon, sm_90a,
# MXFP8 pages), decode_hopper_ws (the same, warp-specialized)
HOPPER_KERNELS = ("hopper", "hopper_ws")  # the Gluon kernels: MXFP8 pages of INTERLEAVED_PAGE_SIZE slots, sm_90a
WINDOW_SLACK = 63  # page-aligned tiles start up to block_n - 1 (<= 63 for planned tiles) keys before the window


def num_sms(device: Optional[torch.device]) -> int:
    if device is not None and require_device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # the interpreter: any number works, use an H200's


def check_max_seq_len(max_seq_len) -> None:
    require_int_value(max_seq_len, "max_seq_len", "None or a positive int (the longest request's keys)")


@dataclass(frozen=True)
class DecodeConfig:
    """Kernel configuration for ``plan_decode`` to use instead of its own choice (benchmarks, sweeps, checks); every
    field left at None comes from ``choose_config`` / ``choose_num_splits`` / ``choose_merge_block_d``.

    ``kernel``: "tiles", "blocks" (page-aligned tiles only), "hopper" or "hopper_ws" (MXFP8 pages on sm_90a:
    ``HOPPER_KERNELS``); ``block_n``: keys per tile (a power of two >= 16 dividing the page); ``waves`` /
    ``min_split``: the split policy (programs per SM over all (request, KV head) pairs, and the fewest keys per
    split); ``num_splits``: the split count itself; ``merge_block_d``: channels per merge program (a power of two
    from 32 to head_dim); ``pdl_merge``: launch the merge with programmatic dependent launch (sm_90+: it starts
    while stage 1 runs and waits for it in the kernel; ``pdl_status``): off unless True (opt-in until timed)."""

    kernel: Optional[str] = None
    block_n: Optional[int] = None
    num_warps: Optional[int] = None
    num_stages: Optional[int] = None
    waves: Optional[int] = None
    min_split: Optional[int] = None
    num_splits: Optional[int] = None
    merge_block_d: Optional[int] = None
    pdl_merge: Optional[bool] = None


class DecodeWorkspace:
    """The split-KV scratch of ``plan_decode``, owned by the caller and allocated once, FlashInfer-style: room for
    ``max_batch * num_q_heads * max_splits`` partial rows of ``head_dim`` float32 outputs (``part_o``) and their
    base-2 log-sum-exps (``part_lse``). A plan's buffers are views of the front of it, so every plan of a step (all
    windows, all layers) shares one workspace: layers run one after another on one stream, so one layer's merge
    has read the buffers before the next layer's split kernel writes them. Any batch fits whose
    ``batch * num_q_heads * num_splits * head_dim`` elements do (smaller batches may split more)."""

    def __init__(self, max_batch: int, num_q_heads: int, head_dim: int, max_splits: int,
                 device: Union[torch.device, str]):
        for name, value in (("max_batch", max_batch), ("num_q_heads", num_q_heads), ("head_dim", head_dim),
                            ("max_splits", max_splits)):
            require_int_value(value, name)
        device = require_device(device, "device (the DecodeWorkspace's)")  # before the allocation
        self.max_batch, self.num_q_heads, self.head_dim, self.max_splits = max_batch, num_q_heads, head_dim, max_splits
        rows = max_batch * num_q_heads * max_splits
        self.part_o = torch.empty(rows * head_dim, dtype=torch.float32, device=device)
        self.part_lse = torch.empty(rows, dtype=torch.float32, device=device)

    @staticmethod
    def nbytes_for(max_batch: int, num_q_heads: int, head_dim: int, max_splits: int) -> int:
        """Bytes a workspace of these sizes allocates: ``max_batch * num_q_heads * max_splits * (head_dim + 1) * 4``."""
        return max_batch * num_q_heads * max_splits * (head_dim + 1) * 4

    @classmethod
    def for_max_context(cls, max_batch: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                        max_seq_len: int, device: Union[torch.device, str]) -> "DecodeWorkspace":
        """A workspace that holds every plan ``plan_decode`` makes on its own (no ``DecodeConfig.num_splits``) for
        up to ``max_batch`` requests of up to ``max_seq_len`` keys, any window, page size and KV dtype."""
        batch, splits = decode_workspace_shape(max_batch, num_kv_heads, max_seq_len, device)
        return cls(batch, num_q_heads, head_dim, splits, device)

    @property
    def device(self) -> torch.device:
        return self.part_o.device

    @property
    def nbytes(self) -> int:
        return (self.part_o.numel() + self.part_lse.numel()) * 4

    def holds(self, batch: int, num_q_heads: int, num_splits: int, head_dim: int) -> bool:
        """Whether ``split_buffers`` of these sizes fits."""
        rows = batch * num_q_heads * num_splits
        return rows * head_dim <= self.part_o.numel() and rows <= self.part_lse.numel()

    def split_buffers(self, batch: int, num_q_heads: int, num_splits: int,
                      head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views ``part_o [batch, Hq, num_splits, head_dim]`` and ``part_lse [batch, Hq, num_splits]``."""
        rows = batch * num_q_heads * num_splits
        if not self.holds(batch, num_q_heads, num_splits, head_dim):
            raise ValueError(
                f"workspace too small: the plan needs batch={batch} x Hq={num_q_heads} x num_splits={num_splits} x "
                f"head_dim={head_dim} = {rows * head_dim} partial values, the workspace holds "
                f"{self.part_o.numel()} (max_batch={self.max_batch}, num_q_heads={self.num_q_heads}, "
                f"head_dim={self.head_dim}, max_splits={self.max_splits}); size it with "
                f"DecodeWorkspace.for_max_context")
        return (self.part_o[:rows * head_dim].view(batch, num_q_heads, num_splits, head_dim),
                self.part_lse[:rows].view(batch, num_q_heads, num_splits))


@dataclass
class DecodePlan:
    """Per-batch decisions and split buffers, reused by every layer of one decode step with the same key (window,
    head counts, head_dim, KV dtype, page size)."""

    batch: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    window: Optional[int]
    num_splits: int
    split_len: int
    block_n: int
    num_warps: int
    num_stages: int
    part_o: Optional[torch.Tensor]  # [B, Hq, num_splits, D] float32, None when one split suffices
    part_lse: Optional[torch.Tensor]  # [B, Hq, num_splits] float32 (base-2 log-sum-exp)
    # Tiles are page-aligned: a page table of pages of this many slots, or a CSR whose requests own whole pages
    # (token t in slot page_table[t // P] * P + t % P), so a tile's slots come from one index (None: any slot per
    # token, CSR only).
    page_size: Optional[int] = None
    kernel: str = "tiles"  # one of KERNELS: "tiles" (decode_tiles_kernel), "blocks" (decode_blocks_kernel,
    # page-aligned only), "hopper" / "hopper_ws" (decode_hopper_kernel / decode_hopper_ws_kernel)
    merge_block_d: Optional[int] = None  # stage 2: one program per (request, query head, merge_block_d channels)
    pdl_merge: bool = False  # stage 2 launched early (programmatic dependent launch); only with splits

    @property
    def paged(self) -> bool:
        return self.page_size is not None


def choose_num_splits(batch: int, num_kv_heads: int, max_keys: int, num_sms: int, block_n: int,
                      waves: int = 8, min_split: int = MIN_SPLIT_TOKENS, resident: Optional[int] = None) -> int:
    """Enough (request, head, split) programs to fill the GPU about ``waves`` times over (chosen from H200
    sweeps), never a split shorter than ``min_split`` keys.

    ``resident`` (programs of this kernel that fit on one SM at once): instead, at most one round of resident
    programs, ``resident * num_sms``, so that every program starts at once and none waits for a second, mostly
    empty round (on the H200 one round beat several for the transposed-V block kernel)."""
    programs = batch * num_kv_heads
    if resident is not None:
        want = max(1, resident * num_sms // programs)
    else:
        want = max(1, math.ceil(waves * num_sms / programs))
    cap = max(1, math.ceil(max_keys / max(min_split, block_n)))
    return min(want, cap)


# A verify step (speculative decoding: D drafts per request) has B * cdiv(D, BLOCK_M) * Hkv programs along the rows,
# too few to fill a GPU at small batches (a single request of 12 drafts over 2 KV heads: 2 programs, each reading
# the whole prefix). Its keys are then split too: every split at least VERIFY_MIN_SPLIT_KEYS keys, at most
# MAX_VERIFY_SPLITS splits (a power of two: the merge reads them as one block), about two programs per SM.
VERIFY_MIN_SPLIT_KEYS = 256
MAX_VERIFY_SPLITS = 32


def choose_verify_splits(programs: int, num_sms: int) -> int:
    """The key splits of a verify launch of ``programs`` row programs: the largest power of two, at most
    ``MAX_VERIFY_SPLITS``, that keeps ``programs x splits`` within about two per SM; 1 (no split, no merge) once the
    rows alone fill the SMs. Each request then spreads its own keys over the splits (never fewer than
    ``VERIFY_MIN_SPLIT_KEYS`` per split), so the split count depends on the batch's shape, not its lengths: a
    captured launch serves every length."""
    require_int_value(programs, "programs")
    if programs >= num_sms:
        return 1
    want = min(-(-2 * num_sms // programs), MAX_VERIFY_SPLITS)
    splits = 1
    while splits * 2 <= want:
        splits *= 2
    return splits


def choose_merge_block_d(batch: int, num_q_heads: int, head_dim: int, num_sms: int) -> int:
    """Channels per merge program: the whole head while (request, query head) pairs give a program per SM, else
    halved (down to 32 channels) until they do, so a single request's merge (16 heads: 16 programs, each reading
    its splits 32 at a time) is spread over up to 4x as many programs, each reading its splits at once."""
    block_d = head_dim
    while block_d % 64 == 0 and batch * num_q_heads * (head_dim // block_d) < num_sms:
        block_d //= 2
    return block_d


def _tiles(wide: bool) -> dict:
    return dict(kernel="tiles", block_n=DEFAULT_BLOCK_N, num_warps=4 if wide else 2, num_stages=3 if wide else 2,
                waves=8, min_split=MIN_SPLIT_TOKENS)


_SMALL_TILES = dict(kernel="tiles", block_n=64, num_warps=4, num_stages=3, waves=2, min_split=64)
_BLOCKS = dict(kernel="blocks", block_n=32, num_warps=1, num_stages=3)  # V loaded transposed
# The Hopper kernel: one page per tile, one warpgroup, 3 TMA stages; 2 programs per SM (shared memory: 3 x 32 KiB
# of K/V stages at head_dim 128) split into one round of them
HOPPER = dict(kernel="hopper", block_n=128, num_warps=4, num_stages=3, resident=2, waves=1, min_split=512)
# head_dim 256 takes half-page tiles on 2 stages (on 128-key tiles it spills: HOPPER_BLOCK_NS): 199 registers and
# 83 KiB, 2 programs per SM; on an H100 at 16/8/256 it was faster than the Triton block kernel and 128-key tiles.
HOPPER_WIDE = dict(HOPPER, block_n=64, num_stages=2)
# Where plan_decode picks the Hopper kernel on its own, from the H200 decode grid (bench/hopper_route_table.py
# applies this rule to a grid): head_dim 128 or 256 with at most 8 query heads per KV head, at least 2**18 keys
# over all (request, KV head) pairs and at least 2048 keys per request. Below them (short or few requests) it
# was mostly the slower kernel (its per-page overhead, one warpgroup per program). head_dim 256 follows the same
# thresholds.
HOPPER_MIN_PAIR_KEYS = 1 << 18
HOPPER_MIN_KEYS = 2048
_hopper_status: dict = {}


E4M3_BY_INTEGERS_ENV = settings.E4M3_BY_INTEGERS.name  # 1: pass 8-bit pools as bytes on any device (tests, an H200)
NATIVE_E4M3_CAPABILITY = (8, 9)  # NVIDIA's e4m3 conversions (and Triton's fp8e4nv) start at sm_89


@functools.lru_cache(maxsize=None)
def _cuda_capability(index: int) -> tuple:
    return torch.cuda.get_device_capability(index)


def e4m3_by_integers(device: torch.device) -> bool:
    """Whether the kernels read an 8-bit pool as bytes and decode e4m3 with integer operations
    (``device.e4m3_bytes_to_float``): on NVIDIA GPUs before sm_89 (Ampere: Triton has no fp8e4nv there), or everywhere
    with ``INKLING_E4M3_BY_INTEGERS=1``."""
    if settings.e4m3_by_integers_forced():
        return True
    if device.type == "cuda" and torch.version.hip is None and torch.cuda.is_available():
        return _cuda_capability(device.index if device.index is not None else torch.cuda.current_device()) \
            < NATIVE_E4M3_CAPABILITY
    return False


def route_note(device) -> str:
    """The Triton route's start-up line about ``device``: whether MXFP8 decode also takes the Gluon Hopper kernel."""
    hopper, why = hopper_decode_status(device)
    note = "MXFP8 decode also through the Gluon Hopper kernel where it is faster (plan.hopper_decode_fits)" if hopper \
        else f"MXFP8 decode through the Triton kernels only (Hopper kernel off: {why})"
    if device is not None and e4m3_by_integers(torch.device(device)):
        note += "; 8-bit pools read as bytes, e4m3 decoded with integer operations (no e4m3 conversions before " \
                "sm_89, or INKLING_E4M3_BY_INTEGERS=1)"
    return note


def pdl_status(device) -> tuple[bool, str]:
    """Whether the merge can launch with programmatic dependent launch on ``device`` (an NVIDIA sm_90+ GPU, Triton
    with the Grid Dependency Control extras, not the interpreter), and a line saying why (not)."""
    from .device import gdc_wait

    if device is None or torch.device(device).type != "cuda":
        return False, "not a CUDA device"
    if torch.version.hip is not None:
        return False, "a ROCm device (programmatic dependent launch is NVIDIA's)"
    if settings.triton_interpreter():
        return False, "the Triton interpreter is on"
    if gdc_wait is None:
        return False, f"Triton {triton.__version__} has no triton.language.extra.cuda.gdc_wait"
    dev = torch.device(device)
    cap = _cuda_capability(dev.index if dev.index is not None else torch.cuda.current_device())
    if cap < (9, 0):
        return False, f"sm_{cap[0]}{cap[1]} is older than sm_90"
    return True, f"sm_{cap[0]}{cap[1]}"


def hopper_decode_status(device) -> tuple[bool, str]:
    """Whether the Gluon Hopper decode kernel can run on ``device`` (an sm_90 GPU, Triton with Gluon's Hopper
    module, not the interpreter, INKLING_DISABLE_HOPPER_DECODE unset), and a line saying why (not)."""
    import importlib

    if device is None or torch.device(device).type != "cuda":
        return False, "not a CUDA device"
    key = torch.device(device).index if torch.device(device).index is not None else torch.cuda.current_device()
    if key not in _hopper_status:
        cap = torch.cuda.get_device_capability(key)
        if settings.hopper_decode_disabled():
            _hopper_status[key] = (False, "INKLING_DISABLE_HOPPER_DECODE is set")
        elif settings.triton_interpreter():
            _hopper_status[key] = (False, "the Triton interpreter is on")
        elif cap != (9, 0):
            _hopper_status[key] = (False, f"sm_{cap[0]}{cap[1]} is not sm_90")
        else:
            try:
                importlib.import_module("triton.experimental.gluon.language.nvidia.hopper")
                _hopper_status[key] = (True, "sm_90 with Triton's Gluon")
            except Exception as err:  # noqa: BLE001 - an ImportError, or Gluon refusing this process's set-up
                _hopper_status[key] = (False, f"Triton {triton.__version__} has no usable Gluon Hopper module "
                                              f"({type(err).__name__}: {err})")
    return _hopper_status[key]


# Its tiles: a page, or half of one (the warpgroup MMA's M side is 64 rows; head_dim 256 on 128-key tiles spills,
# 255 registers and a 320-byte stack, on 64-key tiles 199 and none: tools/compile_hopper.py --D 256 --G 2 --stages 2)
HOPPER_BLOCK_NS = (64, 128)
HOPPER_MAX_GROUP = 8  # query heads per Hopper program: 16 on the MMA's N side spill (255 registers + 200 B of
# stack, tools/compile_hopper.py --G 16), 8 do not


def hopper_head_split(group: int) -> int:
    """The Hopper kernel's programs per KV head: the fewest that divide its ``group`` query heads into at most
    ``HOPPER_MAX_GROUP`` each (GQA 16: 2 programs of 8 heads, each reading the KV head's pages)."""
    return next(s for s in range(1, group + 1) if group % s == 0 and group // s <= HOPPER_MAX_GROUP)


def hopper_decode_fits(batch: int, num_q_heads: int, num_kv_heads: int, head_dim: int, max_keys: int) -> bool:
    """The shapes where the Hopper kernel beat the Triton block kernel on the H200 grid (``HOPPER_MIN_*``)."""
    return (head_dim in (128, 256) and num_q_heads // num_kv_heads <= 8 and max_keys >= HOPPER_MIN_KEYS
            and batch * num_kv_heads * max_keys >= HOPPER_MIN_PAIR_KEYS)


def hopper_config(head_dim: int) -> dict:
    """The Hopper kernel's configuration for ``head_dim``: whole-page tiles on 3 stages, half-page tiles on 2
    stages above head_dim 128 (``HOPPER_WIDE``)."""
    return dict(HOPPER_WIDE if head_dim > 128 else HOPPER)


# The warp-specialized Hopper kernel (decode_hopper_ws: a softmax warpgroup and a value warpgroup per program, 8
# warps at 128 registers, 2 programs per SM), taken only when a DecodeConfig names it: on an H100 it was no faster
# than the one-warpgroup kernel.
# Shared memory per program (tools/compile_hopper.py --ws, Triton 3.6 and 3.9, no stack): head_dim 128 on 3
# stages of whole pages 109 KiB; head_dim 256 on half pages 82 KiB with 2 stages (114 KiB with 3: one per SM).
def hopper_ws_config(head_dim: int) -> dict:
    """The warp-specialized kernel's configuration for ``head_dim`` (the tiles and stages of ``hopper_config``)."""
    return dict(hopper_config(head_dim), kernel="hopper_ws")


def _resident_blocks(wide: bool) -> int:
    # the block kernel's programs per SM at 155 (head_dim 128) / 238 (256) registers on one warp, 65536 per SM
    # (Triton 3.6; smaller heads fit more, so 12 errs toward less than a round)
    return 8 if wide else 12


def choose_config(batch: int, num_kv_heads: int, head_dim: int, max_keys: int, page_size: Optional[int],
                  kv_dtype: Optional[torch.dtype]) -> dict:
    """Kernel configuration for a batch, from the H200 runs (each choice below was the faster one there; the runs
    are indexed in bench/results/README.md).

    With page-aligned tiles and an 8-bit pool:
    - enough work for 512+ programs of 256-key splits: the block kernel (32-key tiles, one warp per program, no
      block-wide barrier, K and V streamed by cp.async), split into one round of resident programs (12 per SM at
      head_dim 128, 8 at 256). It beat the untransposed-V and heads-on-M block kernels at every large point of
      the H200 sweeps;
    - little work (under 32768 keys over all (request, KV head) pairs), or one or two pairs at head_dim 256: 64-key
      tiles on 4 warps, two waves of splits of >= 64 keys (a short batch's time is its serial tiles plus the
      merge; the block kernel tied or lost there);
    - one or two pairs over more keys (a single request at head_dim <= 128): the block kernel, one round of
      resident programs of >= 64 keys (faster than the tile kernel there);
    - in between: the same block kernel, splits of >= 64 keys for about 4 programs per SM (faster than the tile
      kernel there).
    Otherwise (per-token indices, or 16-bit pools) the tile kernel: 64-key tiles, 2 warps (4 at head_dim 256, where
    2 spill), 8 waves of splits of >= 256 keys."""
    eight_bit = kv_dtype is None or kv_dtype.itemsize == 1
    wide = head_dim > 128
    middle = _tiles(wide)
    if page_size is not None and page_size % 64:  # small pages: the largest tile inside one (pages < 16: error)
        return dict(middle, block_n=32 if page_size % 32 == 0 else 16)
    if page_size is None or not eight_bit:
        return middle
    programs_at_256 = batch * num_kv_heads * -(-max_keys // MIN_SPLIT_TOKENS)
    resident = _resident_blocks(wide)
    if programs_at_256 >= 512:
        return dict(_BLOCKS, resident=resident, waves=32, min_split=MIN_SPLIT_TOKENS)  # waves: a caller's kernel
    pairs = batch * num_kv_heads
    if pairs * max_keys < 32768 or (wide and pairs <= 2):
        return dict(_SMALL_TILES)
    if pairs <= 2:
        return dict(_BLOCKS, resident=resident, waves=4, min_split=64)
    return dict(_BLOCKS, waves=4, min_split=64)  # about 4 x SMs programs: 512-1024 beat 256 and 2048


def _most_splits(batch: int, num_kv_heads: int, keys: int, sms: int) -> int:
    """The most splits any configuration ``choose_config`` can return asks for at this batch (an upper bound: it
    does not ask which one applies)."""
    policies = []
    for wide in (False, True):
        policies += [(c["block_n"], c["waves"], c["min_split"], None) for c in (_tiles(wide), _SMALL_TILES)]
        r = _resident_blocks(wide)
        policies += [(32, 1, MIN_SPLIT_TOKENS, r), (32, 1, 64, r), (32, 4, 64, None)]
    policies.append((HOPPER["block_n"], HOPPER["waves"], HOPPER["min_split"], HOPPER["resident"]))
    policies.append((16, 8, MIN_SPLIT_TOKENS, None))  # small pages
    return max(choose_num_splits(batch, num_kv_heads, keys, sms, bn, waves=w, min_split=ms, resident=r)
               for bn, w, ms, r in policies)


def decode_workspace_splits(max_batch: int, num_kv_heads: int, max_seq_len: int,
                            device: Optional[Union[torch.device, str]] = None) -> int:
    """The ``max_splits`` of a ``DecodeWorkspace(max_batch, ...)`` that holds every plan ``plan_decode`` makes on
    its own for up to ``max_batch`` requests of up to ``max_seq_len`` keys: for each batch size, the most splits
    any configuration ``choose_config`` can return asks for, times the batch, over ``max_batch``. Host arithmetic
    only."""
    for name, value in (("max_batch", max_batch), ("num_kv_heads", num_kv_heads), ("max_seq_len", max_seq_len)):
        require_int_value(value, name)
    sms, keys = num_sms(device), max_seq_len + WINDOW_SLACK
    rows = max(b * _most_splits(b, num_kv_heads, keys, sms) for b in range(1, max_batch + 1))
    return -(-rows // max_batch)


def decode_workspace_shape(max_batch: int, num_kv_heads: int, max_seq_len: int,
                           device: Optional[Union[torch.device, str]] = None) -> tuple[int, int]:
    """``(batch, max_splits)`` of the smallest ``DecodeWorkspace`` that holds every plan ``plan_decode`` makes on
    its own for up to ``max_batch`` requests of up to ``max_seq_len`` keys. A plan of one split uses no buffers, so
    only the batches that split count: ``batch`` is the largest of them, ``max_splits`` their most split rows over
    it. Large batches split once, so this does not grow with ``max_batch`` beyond the last batch that splits
    (``(1, 1)`` when none does)."""
    for name, value in (("max_batch", max_batch), ("num_kv_heads", num_kv_heads), ("max_seq_len", max_seq_len)):
        require_int_value(value, name)
    sms, keys = num_sms(device), max_seq_len + WINDOW_SLACK
    splits = {b: _most_splits(b, num_kv_heads, keys, sms) for b in range(1, max_batch + 1)}
    splitting = [b for b, n in splits.items() if n > 1]
    if not splitting:
        return 1, 1
    batch = max(splitting)
    rows = max(b * splits[b] for b in splitting)
    return batch, -(-rows // batch)


def plan_decode(batch: Union[int, torch.Tensor], *, num_q_heads: int, num_kv_heads: int, head_dim: int,
                max_seq_len: Optional[int] = None, window: Optional[int] = None, page_size: Optional[int] = None,
                kv_dtype: Optional[torch.dtype] = None, workspace: Optional[DecodeWorkspace] = None,
                device: Optional[Union[torch.device, str]] = None,
                config: Optional[DecodeConfig] = None, kv_format: Optional[str] = None) -> DecodePlan:
    """Pick the kernel configuration and split count for a batch of ``batch`` requests of at most ``max_seq_len``
    keys (both host ints: no device read), and lay out the split buffers in ``workspace`` (views: nothing is
    allocated). Without a workspace the plan allocates its own buffers (not for CUDA-graph capture: they would
    come from whatever allocator is current and die with the plan).

    ``batch`` may also be a ``kv_indptr`` tensor (``[batch + 1]``); ``max_seq_len`` is then read from it when not
    given (one device sync). ``window``: the layer's window (visible keys including the query's own), the plan is
    only valid for it. ``page_size``: tiles are page-aligned: the requests come as a page table of pages of this
    many slots, or as a CSR whose requests own whole pages (``validate_slots(..., page_size=...)`` checks that);
    each tile's slots are found from one index. ``kv_dtype``: the pool's element dtype (8-bit and 16-bit pools are
    configured differently; None: 8-bit). ``device``: whose SM count the split policy uses and, without a
    workspace, where the plan's own buffers go (default: the workspace's, the kv_indptr's, else the current CUDA
    device, else the CPU). ``config``: kernel configuration overrides (``DecodeConfig``). ``kv_format``: the pool's
    format (``PagedKV.kv_format``); for "mxfp8" with a page table of 128-slot pages on an sm_90 GPU
    (``hopper_decode_status``) the plan then takes the Gluon Hopper kernel where it was measured faster
    (``hopper_decode_fits``, in ``hopper_config``'s tiles) unless ``config`` names a kernel.
    """
    check_decode_batch(batch)
    if isinstance(batch, torch.Tensor):  # a kv_indptr
        device = batch.device if device is None else device
        if max_seq_len is None:
            max_seq_len = int(batch.diff().max())
        batch = batch.numel() - 1
    check_decode_args(max_seq_len, num_q_heads, num_kv_heads, head_dim, window, workspace, config, kv_format)
    if workspace is not None:
        device = workspace.device
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else None
    config = DecodeConfig() if config is None else config
    max_keys = max(1, min(max_seq_len, window) if window is not None else max_seq_len)
    kernel, block_n, num_warps, num_stages, waves, min_split, resident = _kernel_config(
        config, batch, num_q_heads, num_kv_heads, head_dim, max_keys, page_size, kv_dtype, kv_format, device)
    check_decode_kernel(kernel, block_n, num_warps, num_stages, waves, min_split, page_size)
    check_decode_config(config, head_dim)
    if page_size is not None and window is not None and window < max_seq_len:
        max_keys += block_n - 1  # page-aligned tiles start up to block_n - 1 keys before the window
    num_splits = config.num_splits
    if num_splits is None:
        programs_per_request = num_kv_heads * (hopper_head_split(num_q_heads // num_kv_heads)
                                               if kernel in HOPPER_KERNELS else 1)
        num_splits = choose_num_splits(batch, programs_per_request, max_keys, num_sms(device), block_n,
                                       waves=waves, min_split=min_split, resident=resident)
    split_len = triton.cdiv(triton.cdiv(max_keys, num_splits), block_n) * block_n
    num_splits = triton.cdiv(max_keys, split_len)
    merge_block_d = config.merge_block_d
    if merge_block_d is None:
        merge_block_d = choose_merge_block_d(batch, num_q_heads, head_dim, num_sms(device))
    pdl_merge = bool(config.pdl_merge) and num_splits > 1
    if pdl_merge:
        ok, why = pdl_status(device)
        if not ok:
            raise ValueError(f"pdl_merge=True needs programmatic dependent launch (an NVIDIA sm_90+ GPU): {why}")
    part_o = part_lse = None
    if num_splits > 1:
        if workspace is None:
            workspace = DecodeWorkspace(batch, num_q_heads, head_dim, num_splits, device or "cpu")
        part_o, part_lse = workspace.split_buffers(batch, num_q_heads, num_splits, head_dim)
    return DecodePlan(batch, num_q_heads, num_kv_heads, head_dim, window, num_splits, split_len, block_n,
                      num_warps, num_stages, part_o, part_lse, page_size, kernel, merge_block_d, pdl_merge)


def _kernel_config(config: DecodeConfig, batch, num_q_heads, num_kv_heads, head_dim, max_keys, page_size, kv_dtype,
                   kv_format, device) -> tuple:
    """``plan_decode``'s kernel configuration, ``(kernel, block_n, num_warps, num_stages, waves, min_split,
    resident)``: ``choose_config``'s (or the Hopper kernel's) with ``config``'s fields over it; ``resident``:
    ``choose_num_splits``'s programs per SM, or None (split by ``waves``)."""
    chosen = choose_config(batch, num_kv_heads, head_dim, max_keys, page_size, kv_dtype)
    if config.kernel == "hopper" or (
            config.kernel is None and kv_format == kv_formats.KVFormat.MXFP8 and page_size == HOPPER["block_n"]
            and hopper_decode_fits(batch, num_q_heads, num_kv_heads, head_dim, max_keys)
            and hopper_decode_status(device)[0]):
        chosen = hopper_config(head_dim)
    elif config.kernel == "hopper_ws":
        chosen = hopper_ws_config(head_dim)
    kernel, block_n, num_warps, num_stages, waves, min_split = (
        chosen[name] if getattr(config, name) is None else getattr(config, name)
        for name in ("kernel", "block_n", "num_warps", "num_stages", "waves", "min_split"))
    # Splits by one round of resident programs only for the configuration whose residency choose_config knows;
    # a caller's waves, or another kernel, tile or warp count, goes by waves
    same = (kernel, block_n, num_warps) == (chosen["kernel"], chosen["block_n"], chosen["num_warps"])
    resident = chosen.get("resident") if config.waves is None and same else None
    return kernel, block_n, num_warps, num_stages, waves, min_split, resident


def check_decode_batch(batch) -> None:
    """``plan_decode``'s ``batch``: a positive int, or a ``kv_indptr`` (1-D int32/int64, batch + 1 >= 2 entries)."""
    if isinstance(batch, torch.Tensor):
        if batch.dim() != 1 or batch.dtype not in (torch.int32, torch.int64):
            raise TypeError("kv_indptr must be a 1-D int32/int64 tensor")
        if batch.numel() < 2:
            raise ValueError(f"kv_indptr must have batch + 1 >= 2 entries, got {batch.numel()}")
    else:
        require_int_value(batch, "batch", "a positive int (or a kv_indptr tensor)")


def check_decode_args(max_seq_len, num_q_heads, num_kv_heads, head_dim, window, workspace, config,
                      kv_format) -> None:
    """``plan_decode``'s other arguments, ``max_seq_len`` given or read from a ``kv_indptr``."""
    if max_seq_len is None:
        raise ValueError("max_seq_len is needed with an int batch (the longest request's keys, a host int)")
    check_max_seq_len(max_seq_len)
    if workspace is not None and not isinstance(workspace, DecodeWorkspace):
        raise TypeError(f"workspace must be a DecodeWorkspace, got {type(workspace).__name__}")
    for name, value in (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        require_int_value(value, name)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads ({num_q_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if window is not None:
        require_int_value(window, "window", "None or a positive int")
    if config is not None and not isinstance(config, DecodeConfig):
        raise TypeError(f"config must be a DecodeConfig, got {type(config).__name__}")
    if kv_format is not None and kv_format not in kv_formats.KV_FORMATS:
        raise ValueError(f"kv_format must be None or one of {kv_formats.FORMAT_NAMES}, got {kv_format!r}")


def check_decode_kernel(kernel, block_n, num_warps, num_stages, waves, min_split, page_size) -> None:
    """The kernel configuration ``plan_decode`` settled on (its choice, or a ``DecodeConfig``'s fields), against
    the page size."""
    for name, value in (("block_n", block_n), ("num_warps", num_warps), ("num_stages", num_stages),
                        ("waves", waves), ("min_split", min_split)):
        require_int_value(value, name)
    if not is_power_of_two(block_n) or block_n < 16:
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel in HOPPER_KERNELS and (block_n not in HOPPER_BLOCK_NS or page_size != INTERLEAVED_PAGE_SIZE):
        raise ValueError(f"kernel={kernel!r} reads {INTERLEAVED_PAGE_SIZE}-slot pages (an MXFP8 pool's) in tiles of "
                         f"one page or half of one: it needs page_size={INTERLEAVED_PAGE_SIZE} and block_n in "
                         f"{HOPPER_BLOCK_NS}, got page_size={page_size!r}, block_n={block_n}")
    if page_size is not None:
        require_int_value(page_size, "page_size", f"a positive multiple of block_n={block_n}",
                          valid=lambda p: p % block_n == 0)
    elif kernel != "tiles":
        raise ValueError(f"kernel={kernel!r} needs page_size (it reads page-aligned tiles)")


def check_decode_config(config: DecodeConfig, head_dim: int) -> None:
    """A ``DecodeConfig``'s split and merge fields (``check_decode_kernel`` checks its kernel fields)."""
    if config.num_splits is not None:
        require_int_value(config.num_splits, "num_splits")
    if config.merge_block_d is not None:
        require_int_value(config.merge_block_d, "merge_block_d",
                          f"a power of two in [32, head_dim={head_dim}] dividing head_dim", minimum=32,
                          maximum=head_dim, valid=lambda b: is_power_of_two(b) and head_dim % b == 0)
    if config.pdl_merge not in (None, True, False):
        raise ValueError(f"pdl_merge must be None, True or False, got {config.pdl_merge!r}")
