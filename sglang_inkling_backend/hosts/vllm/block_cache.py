"""vLLM's per-layer block cache, seen as the core's ``PagedKV``: the one place for how this backend lays out the
bytes vLLM allocates for it. Host-free (only torch), so GPU tests run it without vLLM.

vLLM gives each attention layer a byte region of ``num_blocks`` pages (a per-layer view ``[B, H, N, C]``, block ``b``
at ``b * block_stride``), with block ids from one block pool shared by every KV-cache group; only this backend reads
or writes it. The region is laid out as the four buffers of SGLang's MXFP8 pool (``MHATokenToKVPoolMXFP8``), each
indexed by slot ``block_id * N + offset`` (vLLM's slot mapping):

    [K data: S x Hkv x D] [V data: S x Hkv x D] [K scales: B x Hkv x 32 x N/32 x D/32] [V scales: same]

with ``S = B * N`` slots, data e4m3 and scales UE8M0 in the interleaved page-128 layout (``scale_layout``). So the
kernels read a vLLM cache exactly as they read an SGLang pool, and a region's buffers are byte-identical to SGLang's
for the same tokens. bf16/fp16/fp32 and per-tensor fp8 regions hold the first two buffers only.

What this gives up: a vLLM block's bytes are not one contiguous run, so code that moves blocks as byte ranges
(KV connectors, offloading, block zeroing) would move the wrong bytes. The backend refuses those configurations
(``backend.py``), and ``tokens per byte`` equal what the same format costs in SGLang.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_inkling_backend import checks, kv_formats, mxfp8
from sglang_inkling_backend.kv_formats import KVFormat
from sglang_inkling_backend.attention_inputs import PagedKV
from sglang_inkling_backend.scale_layout import INTERLEAVED_PAGE_SIZE, ScaleLayout

MXFP8_BLOCK_SIZE = INTERLEAVED_PAGE_SIZE  # the interleaved scale atom covers one page of 128 tokens


def cell_bytes(kv_format: KVFormat | str, head_dim: int) -> int:
    """Bytes per (KV head, token) cell of a vLLM page: K and V data, and for MXFP8 their block scales."""
    return kv_formats.bytes_per_token_per_layer(1, head_dim, kv_format)


@dataclass(frozen=True)
class BlockCacheLayout:
    kv_format: KVFormat  # a KVFormat or its name (kept as the KVFormat)
    num_kv_heads: int
    head_dim: int
    block_size: int

    def __post_init__(self):
        object.__setattr__(self, "kv_format", kv_formats.as_kv_format(self.kv_format))
        for name in ("num_kv_heads", "head_dim", "block_size"):
            checks.require_int_value(getattr(self, name), name)
        if self.kv_format.block_scaled:
            mxfp8.require_head_dim(self.head_dim)
            if self.block_size != MXFP8_BLOCK_SIZE:
                raise ValueError(f"an MXFP8 block cache needs block_size {MXFP8_BLOCK_SIZE} (one interleaved scale "
                                 f"atom per block and head, SGLang's layout), got {self.block_size}")

    @property
    def page_bytes(self) -> int:
        return self.num_kv_heads * self.block_size * cell_bytes(self.kv_format, self.head_dim)

    def paged_kv(self, kv_cache: torch.Tensor, *, k_scale: float = 1.0, v_scale: float = 1.0) -> PagedKV:
        """The layer's ``PagedKV`` over vLLM's per-layer view ``kv_cache [num_blocks, H, N, C]`` (any dtype; C in
        that dtype's elements). Views, no copy."""
        region, num_blocks = self._region(kv_cache)
        slots, hkv, d = num_blocks * self.block_size, self.num_kv_heads, self.head_dim
        if not self.kv_format.quantized:
            dtype = self.kv_format.storage_dtype
            data = region[: 2 * slots * hkv * d * dtype.itemsize].view(dtype).view(2, slots, hkv, d)
            return PagedKV(data[0], data[1])
        data = region[: 2 * slots * hkv * d].view(mxfp8.DATA_DTYPE).view(2, slots, hkv, d)
        if self.kv_format.tensor_scaled:
            return PagedKV(data[0], data[1], k_scale=k_scale, v_scale=v_scale)
        layout = ScaleLayout.for_pool(slots, hkv, d, self.block_size)
        start = 2 * slots * hkv * d
        scales = region[start: start + 2 * layout.num_bytes].view(2, *layout.shape)
        return PagedKV(data[0], data[1], scales[0], scales[1], layout)

    def _region(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The layer's bytes as one flat uint8 tensor, and the number of blocks."""
        if isinstance(kv_cache, torch.Tensor):
            checks.require_tensor(kv_cache, "kv_cache", "vLLM's 4-D per-layer view [num_blocks, H, N, C]")
        if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() != 4:
            desc = tuple(kv_cache.shape) if isinstance(kv_cache, torch.Tensor) else type(kv_cache).__name__
            raise ValueError(f"kv_cache must be vLLM's 4-D per-layer view [num_blocks, H, N, C], got {desc}")
        cache = kv_cache if kv_cache.dtype == torch.uint8 else kv_cache.view(torch.uint8)
        num_blocks, heads, tokens, cell = cache.shape
        want = self.page_bytes
        if heads * tokens * cell != want:
            raise ValueError(f"kv_cache pages hold {heads * tokens * cell} bytes ([H, N, C] = {heads, tokens, cell} "
                             f"in bytes); {self.kv_format} with {self.num_kv_heads} KV heads, head_dim "
                             f"{self.head_dim}, block_size {self.block_size} needs {want}")
        s0, s1, s2, s3 = cache.stride()
        if s3 != 1 or s2 != cell or s1 != tokens * cell or s0 < want:
            raise ValueError(f"kv_cache must store each block as one dense page (a layer-compact layout such as "
                             f"LBHNC), got byte strides {cache.stride()} for shape {tuple(cache.shape)}")
        if s0 >= 2 * want:
            raise ValueError(f"kv_cache's block stride is {s0} bytes, two pages ({want} bytes each) or more: a view of "
                             "some blocks of a larger buffer, whose bytes between them this layout would write (it "
                             "lays the layer's K, V and scales out across its whole region); vLLM's padded pages "
                             "pad less than a page")
        span = (num_blocks - 1) * s0 + want  # >= num_blocks * want, since s0 >= want
        return torch.as_strided(cache, (span,), (1,)), num_blocks


def vllm_layer_view(layout: BlockCacheLayout, num_blocks: int, *, device="cpu", dtype: torch.dtype = torch.uint8,
                    pad: int = 0) -> torch.Tensor:
    """A zeroed stand-in for what vLLM hands one layer: the ``[num_blocks, H, N, C]`` LBHNC view of a flat byte
    buffer (C in ``dtype`` elements), ``pad`` bytes after each page (vLLM's padded pages). For tests and benchmarks
    that run without vLLM."""
    cell = cell_bytes(layout.kv_format, layout.head_dim)
    stride = layout.page_bytes + pad
    raw = torch.zeros(num_blocks * stride, dtype=torch.uint8, device=checks.require_device(device))
    view = torch.as_strided(raw, (num_blocks, layout.num_kv_heads, layout.block_size, cell),
                            (stride, layout.block_size * cell, cell, 1))
    return view if dtype == torch.uint8 else view.view(dtype)
