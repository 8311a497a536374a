"""The KV formats the backend stores: their names, which of them are quantized, the torch dtype of their pool
buffers, and the bytes one token costs in each.

The MXFP8 encoding itself (blocks, scales, quantize and dequantize) is ``mxfp8.py``. Each host maps its own
``--kv-cache-dtype`` values onto these names in one module: ``hosts/sglang/cache_dtypes.py`` and
``hosts/vllm/cache_dtypes.py``.
"""
from __future__ import annotations

import torch

from . import mxfp8
from .checks import require_positive_int

KV_FORMATS = ("bf16", "fp16", "fp32", "fp8_e4m3", "mxfp8")  # every KV format the backend stores
QUANTIZED_KV_FORMATS = ("fp8_e4m3", "mxfp8")
# The one map between a KV format and the torch dtype of its pool buffers (the quantized ones store e4m3 bytes), and
# its inverse for the unquantized formats (a model's dtype names its unquantized KV format).
STORAGE_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8_e4m3": mxfp8.DATA_DTYPE,
                 "mxfp8": mxfp8.DATA_DTYPE}
UNQUANTIZED_FORMAT_OF_DTYPE = {STORAGE_DTYPE[f]: f for f in KV_FORMATS if f not in QUANTIZED_KV_FORMATS}


def require_kv_format(kv_format: str, name: str = "kv_format") -> str:
    if kv_format not in KV_FORMATS:
        raise ValueError(f"{name} must be one of {KV_FORMATS}, got {kv_format!r}")
    return kv_format


def bytes_per_token_per_layer(num_kv_heads: int, head_dim: int, kv_format: str) -> int:
    """KV bytes one token costs in one attention layer: K and V, data plus (MXFP8) one scale byte per block."""
    require_kv_format(kv_format)
    require_positive_int(num_kv_heads, "num_kv_heads")
    require_positive_int(head_dim, "head_dim")
    if kv_format == "mxfp8":
        mxfp8.require_head_dim(head_dim)
    scale_bytes = head_dim // mxfp8.BLOCK if kv_format == "mxfp8" else 0
    return 2 * num_kv_heads * (head_dim * STORAGE_DTYPE[kv_format].itemsize + scale_bytes)
