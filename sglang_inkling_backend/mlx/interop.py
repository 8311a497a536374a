"""Byte-exact conversion between mx.array and torch.Tensor (CPU), bfloat16 included (numpy has no bf16)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import torch

_MX_TO_TORCH = {
    mx.float32: torch.float32, mx.float16: torch.float16, mx.bfloat16: torch.bfloat16,
    mx.int32: torch.int32, mx.int64: torch.int64, mx.uint8: torch.uint8, mx.bool_: torch.bool,
}
_TORCH_TO_MX = {v: k for k, v in _MX_TO_TORCH.items()}


def to_torch(array: mx.array) -> torch.Tensor:
    if array.dtype not in _MX_TO_TORCH:
        raise TypeError(f"no torch dtype for {array.dtype}")
    if array.dtype == mx.bfloat16:
        return torch.from_numpy(np.array(array.view(mx.uint16)).astype(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(array))


def from_torch(tensor: torch.Tensor) -> mx.array:
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.float8_e4m3fn:
        tensor = tensor.view(torch.uint8)
    if tensor.dtype not in _TORCH_TO_MX:
        raise TypeError(f"no MLX dtype for {tensor.dtype}")
    if tensor.dtype == torch.bfloat16:
        return mx.array(tensor.view(torch.int16).numpy().astype(np.uint16)).view(mx.bfloat16)
    return mx.array(tensor.numpy())
