"""Where each K/V scale byte lives in the pool: the one place for the index math.

Page size 128 uses SGLang's interleaved layout (``MHATokenToKVPoolMXFP8``), the one Blackwell's block-scaled MMA
reads: ``sf[page, h, po % 32, po // 32, b]`` in a buffer of shape ``[pages, Hkv, 32, page // 32, D // 32]``, with
``page = slot // page_size``, ``po = slot % page_size``, ``b`` the 32-channel block. With D = 128 that is one
512-byte atom per (page, head). Any other page size uses a flat ``[slots, Hkv, D // 32]`` layout.
Keeping this byte-compatible with SGLang lets its own MXFP8 consumers read a cache this backend wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .checks import require_device, require_positive_int, require_slots, require_tensor
from .mxfp8 import BLOCK, SCALE_DTYPE, SCALE_DTYPES, require_head_dim

INTERLEAVED_PAGE_SIZE = 128
ROWS_PER_ATOM = 32  # the interleaved atom stores 32 tokens x (page // 32) columns


@dataclass(frozen=True)
class ScaleLayout:
    """Checked however it is built (``ScaleLayout(...)`` or ``for_pool``): every index below assumes these."""
    num_slots: int  # data rows, slot 0 included (SGLang: size + page_size)
    num_kv_heads: int
    head_dim: int
    page_size: int

    def __post_init__(self):
        for name in ("num_slots", "num_kv_heads", "head_dim", "page_size"):
            require_positive_int(getattr(self, name), name)
        require_head_dim(self.head_dim)
        if self.page_size == INTERLEAVED_PAGE_SIZE and self.num_slots % self.page_size:
            raise ValueError(f"num_slots must be a multiple of page_size={self.page_size} for the interleaved "
                             f"layout, got {self.num_slots}")

    @classmethod
    def for_pool(cls, num_slots: int, num_kv_heads: int, head_dim: int, page_size: int) -> "ScaleLayout":
        """The layout of a pool of ``num_slots`` slots (the constructor, named for its callers)."""
        return cls(num_slots, num_kv_heads, head_dim, page_size)

    @property
    def interleaved(self) -> bool:
        return self.page_size == INTERLEAVED_PAGE_SIZE

    @property
    def blocks_per_head(self) -> int:
        return self.head_dim // BLOCK

    @property
    def num_pages(self) -> int:
        return self.num_slots // self.page_size

    @property
    def shape(self) -> tuple[int, ...]:
        if self.interleaved:
            return (self.num_pages, self.num_kv_heads, ROWS_PER_ATOM, self.page_size // ROWS_PER_ATOM,
                    self.blocks_per_head)
        return (self.num_slots, self.num_kv_heads, self.blocks_per_head)

    @property
    def num_bytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def empty(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """A zeroed scale buffer (0xFF would be UE8M0 NaN, so never uninitialised memory)."""
        return torch.zeros(self.shape, dtype=SCALE_DTYPE, device=require_device(device))

    def check_slots(self, slots: torch.Tensor, name: str = "slots", distinct: bool = False) -> torch.Tensor:
        return require_slots(slots, name, self.num_slots, distinct)

    def flat_index(self, slots: torch.Tensor, check: bool = True) -> torch.Tensor:
        """Offsets into ``sf.view(-1)`` of every scale byte of ``slots``: ``LongTensor [N, Hkv, D // 32]``.
        ``check=False`` skips the range check, which reads the slots on the host (no sync inside a CUDA graph);
        the caller then guarantees the range."""
        slots = self.check_slots(slots) if check else slots.long()
        hkv, nb = self.num_kv_heads, self.blocks_per_head
        head = torch.arange(hkv, device=slots.device).view(1, hkv, 1)
        block = torch.arange(nb, device=slots.device).view(1, 1, nb)
        s = slots.view(-1, 1, 1)
        if not self.interleaved:
            return (s * hkv + head) * nb + block
        page, po = s // self.page_size, s % self.page_size
        cols = self.page_size // ROWS_PER_ATOM
        return (((page * hkv + head) * ROWS_PER_ATOM + po % ROWS_PER_ATOM) * cols + po // ROWS_PER_ATOM) * nb + block

    def check_buffer(self, sf: torch.Tensor, name: str = "sf") -> None:
        require_tensor(sf, name, "a torch.Tensor scale buffer")
        if sf.dtype not in SCALE_DTYPES:
            raise TypeError(f"{name} must be uint8 or float8_e8m0fnu, got {sf.dtype}")
        if tuple(sf.shape) != self.shape:
            raise ValueError(f"{name} must have shape {self.shape} "
                             f"({'interleaved' if self.interleaved else 'flat'} layout), got {tuple(sf.shape)}")
        if not sf.is_contiguous():
            raise ValueError(f"{name} must be contiguous")

    def gather(self, sf: torch.Tensor, slots: torch.Tensor, check: bool = True) -> torch.Tensor:
        """The scale bytes of ``slots``: uint8 ``[N, Hkv, D // 32]``."""
        self.check_buffer(sf)
        return sf.view(torch.uint8).reshape(-1)[self.flat_index(slots, check)]

    def scatter(self, sf: torch.Tensor, slots: torch.Tensor, scales: torch.Tensor, check: bool = True) -> None:
        """Write ``scales [N, Hkv, D // 32]`` (uint8 or float8_e8m0fnu) at distinct ``slots`` (slot 0, the padding
        sink, may repeat), in place. ``check=False`` skips the slot checks (range, distinct), as in ``flat_index``."""
        self.check_buffer(sf)
        if require_tensor(scales, "scales", "a uint8 / float8_e8m0fnu tensor of UE8M0 bytes").dtype not in SCALE_DTYPES:
            raise TypeError(f"scales must be a uint8 / float8_e8m0fnu tensor of UE8M0 bytes, got {scales.dtype}")
        if check:
            slots = self.check_slots(slots, distinct=True)
        index = self.flat_index(slots, check=False)
        if tuple(scales.shape) != tuple(index.shape):
            raise ValueError(f"scales must have shape {tuple(index.shape)}, got {tuple(scales.shape)}")
        sf.view(torch.uint8).view(-1)[index.reshape(-1)] = scales.view(torch.uint8).reshape(-1).to(sf.device)
