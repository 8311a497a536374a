"""The KV formats the backend stores, as one type: ``KVFormat``, with each format's storage dtype, whether it is
quantized, how it is scaled (none, one scale per tensor, one UE8M0 scale per block of channels), its block size and
the bytes one token costs.

``KVFormat`` is a ``str`` enum: a member equals its name (``KVFormat.MXFP8 == "mxfp8"``), so a host flag, a test or
a log line may name a format, while the code asks a member what it is (``fmt.block_scaled``, ``fmt.quantized``)
instead of comparing names. ``as_kv_format(value)`` turns a name or a member into a member, refusing anything else.

The MXFP8 encoding itself (blocks, scales, quantize and dequantize) is ``mxfp8.py``. Each host maps its own
``--kv-cache-dtype`` values onto these formats in one module: ``hosts/sglang/cache_dtypes.py`` and
``hosts/vllm/cache_dtypes.py``.
"""
from __future__ import annotations

import enum
from typing import Optional, Union

import torch

from . import mxfp8
from .checks import require_positive_int

SCALE_NONE, SCALE_PER_TENSOR, SCALE_PER_BLOCK = "none", "per-tensor", "per-block"


class KVFormat(str, enum.Enum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP8_E4M3 = "fp8_e4m3"  # e4m3 values with one float scale per K and per V tensor (the layer's k_scale/v_scale)
    MXFP8 = "mxfp8"  # e4m3 values with one UE8M0 scale per mxfp8.BLOCK channels (scale_layout.py)

    def __str__(self) -> str:
        return self.value

    def __hash__(self) -> int:  # as its name's: a member finds a dict entry keyed by the name, and the reverse
        return hash(self.value)

    @property
    def storage_dtype(self) -> torch.dtype:
        """The torch dtype of the pool's K/V buffers (the quantized formats store e4m3 bytes)."""
        return STORAGE_DTYPE[self]

    @property
    def quantized(self) -> bool:
        return self.scale != SCALE_NONE

    @property
    def scale(self) -> str:
        """How values are scaled: ``SCALE_NONE``, ``SCALE_PER_TENSOR`` or ``SCALE_PER_BLOCK``."""
        return SCALE_PER_BLOCK if self is KVFormat.MXFP8 else SCALE_PER_TENSOR if self is KVFormat.FP8_E4M3 \
            else SCALE_NONE

    @property
    def block_scaled(self) -> bool:
        """One scale per block of channels, stored beside the values (MXFP8)."""
        return self.scale == SCALE_PER_BLOCK

    @property
    def tensor_scaled(self) -> bool:
        """One float scale per K and per V tensor, the layer's (per-tensor fp8)."""
        return self.scale == SCALE_PER_TENSOR

    @property
    def block_size(self) -> Optional[int]:
        """Channels per scale (MXFP8: ``mxfp8.BLOCK``); None for the formats without block scales."""
        return mxfp8.BLOCK if self.block_scaled else None

    def bytes_per_token(self, num_kv_heads: int, head_dim: int) -> int:
        """KV bytes one token costs in one attention layer: K and V, data plus (MXFP8) one scale byte per block."""
        require_positive_int(num_kv_heads, "num_kv_heads")
        require_positive_int(head_dim, "head_dim")
        if self.block_scaled:
            mxfp8.require_head_dim(head_dim)
        scale_bytes = head_dim // self.block_size if self.block_scaled else 0
        return 2 * num_kv_heads * (head_dim * self.storage_dtype.itemsize + scale_bytes)


# The one map between a KV format and the torch dtype of its pool buffers, and its inverse for the unquantized
# formats (a model's dtype names its unquantized KV format).
STORAGE_DTYPE = {KVFormat.BF16: torch.bfloat16, KVFormat.FP16: torch.float16, KVFormat.FP32: torch.float32,
                 KVFormat.FP8_E4M3: mxfp8.DATA_DTYPE, KVFormat.MXFP8: mxfp8.DATA_DTYPE}

KV_FORMATS = tuple(KVFormat)  # every KV format the backend stores
FORMAT_NAMES = tuple(f.value for f in KVFormat)  # their names, as messages and flags spell them
QUANTIZED_KV_FORMATS = tuple(f for f in KVFormat if f.quantized)
UNQUANTIZED_KV_FORMATS = tuple(f for f in KVFormat if not f.quantized)
UNQUANTIZED_FORMAT_OF_DTYPE = {f.storage_dtype: f for f in UNQUANTIZED_KV_FORMATS}


def as_kv_format(value: Union[KVFormat, str], name: str = "kv_format") -> KVFormat:
    """``value`` (a ``KVFormat`` or its name) as a ``KVFormat``; a ValueError naming ``name`` and the formats for
    anything else."""
    if isinstance(value, KVFormat):
        return value
    if isinstance(value, str):
        try:
            return KVFormat(value)
        except ValueError:
            pass
    raise ValueError(f"{name} must be one of {FORMAT_NAMES}, got {value!r}")


def require_kv_format(kv_format: Union[KVFormat, str], name: str = "kv_format") -> KVFormat:
    return as_kv_format(kv_format, name)


def bytes_per_token_per_layer(num_kv_heads: int, head_dim: int, kv_format: Union[KVFormat, str]) -> int:
    """KV bytes one token costs in one attention layer (``KVFormat.bytes_per_token``)."""
    return as_kv_format(kv_format).bytes_per_token(num_kv_heads, head_dim)
