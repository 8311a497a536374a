"""What every attention implementation reads, defined once: one layer's K/V pool buffers as kernel input
(``PagedKV``) and the layer's attention parameters (``AttentionParams``). The reference (``reference/``), the Triton
kernels, the MLX path and the hosts import them from here; the definitions of what the parameters mean are the
reference's docstring (``reference/attention.py``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import mxfp8
from .checks import (require_finite_once, require_non_negative_real, require_positive_int, require_positive_real,
                     require_slots)
from .scale_layout import ScaleLayout

FLOAT_KV_DTYPES = tuple(mxfp8.UNQUANTIZED_FORMAT_OF_DTYPE)  # bf16, fp16, fp32


@dataclass
class PagedKV:
    """One layer's K/V pool buffers ``[slots, Hkv, D]``: bf16/fp16/fp32; or float8_e4m3fn with a per-tensor
    ``k_scale``/``v_scale``; or MXFP8 (float8_e4m3fn plus ``k_scales``/``v_scales`` scale buffers in ``layout``)."""

    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    k_scales: Optional[torch.Tensor] = None
    v_scales: Optional[torch.Tensor] = None
    layout: Optional[ScaleLayout] = None
    k_scale: float = 1.0
    v_scale: float = 1.0

    def __post_init__(self):
        for name in ("k_buffer", "v_buffer"):
            buf = getattr(self, name)
            if not isinstance(buf, torch.Tensor) or buf.dim() != 3:
                raise ValueError(f"{name} must be a 3-D tensor [slots, Hkv, D], got "
                                 f"{tuple(buf.shape) if isinstance(buf, torch.Tensor) else type(buf).__name__}")
        if self.k_buffer.shape[:2] != self.v_buffer.shape[:2]:
            raise ValueError(f"k_buffer and v_buffer must agree on [slots, Hkv], got {tuple(self.k_buffer.shape)} "
                             f"and {tuple(self.v_buffer.shape)}")
        if self.k_buffer.dtype != self.v_buffer.dtype:
            raise TypeError(f"k_buffer and v_buffer must share a dtype, got {self.k_buffer.dtype} and "
                            f"{self.v_buffer.dtype}")
        if self.k_buffer.dtype not in FLOAT_KV_DTYPES + (mxfp8.DATA_DTYPE,):
            raise TypeError(f"k_buffer must be one of {FLOAT_KV_DTYPES + (mxfp8.DATA_DTYPE,)}, got {self.k_buffer.dtype}")
        for name in ("k_scale", "v_scale"):  # host numbers: checking them reads nothing from the device
            value = getattr(self, name)
            if not (isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point()):
                setattr(self, name, require_positive_real(value, name))
        has_scales = self.k_scales is not None or self.v_scales is not None
        if has_scales:
            if self.k_scales is None or self.v_scales is None or self.layout is None:
                raise ValueError("an MXFP8 PagedKV needs k_scales, v_scales and their layout")
            if self.k_buffer.dtype != mxfp8.DATA_DTYPE:
                raise TypeError(f"MXFP8 scale buffers need float8_e4m3fn data, got {self.k_buffer.dtype}")
            expected = (self.layout.num_slots, self.layout.num_kv_heads, self.layout.head_dim)
            if tuple(self.k_buffer.shape) != expected:
                raise ValueError(f"k_buffer must have shape {expected} to match its scale layout, "
                                 f"got {tuple(self.k_buffer.shape)}")
            self.layout.check_buffer(self.k_scales, "k_scales")
            self.layout.check_buffer(self.v_scales, "v_scales")

    @property
    def is_mxfp8(self) -> bool:
        return self.k_scales is not None

    @property
    def kv_format(self) -> str:
        """The pool's KV format (``mxfp8.KV_FORMATS``): "mxfp8", "fp8_e4m3" (per-tensor scale), "bf16", "fp16" or
        "fp32"."""
        if self.is_mxfp8:
            return "mxfp8"
        return mxfp8.UNQUANTIZED_FORMAT_OF_DTYPE.get(self.k_buffer.dtype, "fp8_e4m3")

    @property
    def num_slots(self) -> int:
        return self.k_buffer.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.k_buffer.shape[1]

    @property
    def head_dim(self) -> int:
        return self.k_buffer.shape[2]

    def read(self, slots: torch.Tensor, check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized float32 ``(k, v)`` of ``slots`` (1-D int32/int64 in ``[0, num_slots)``): ``[N, Hkv, D]``
        each. ``check=False`` skips the slot checks (the caller has made them)."""
        slots = require_slots(slots, "slots", self.num_slots) if check else slots.long()
        k, v = self.k_buffer[slots], self.v_buffer[slots]
        if self.is_mxfp8:
            return (mxfp8.dequantize(k, self.layout.gather(self.k_scales, slots), torch.float32),
                    mxfp8.dequantize(v, self.layout.gather(self.v_scales, slots), torch.float32))
        if k.dtype == mxfp8.DATA_DTYPE:
            return k.float() * self.k_scale, v.float() * self.v_scale
        return k.float(), v.float()


@dataclass
class AttentionParams:
    softmax_scale: float
    window: Optional[int] = None  # keys at distance 0 .. window-1; None: all earlier keys
    rel_bias: Optional[torch.Tensor] = None  # [query rows, Hq, rel_extent]
    logit_cap: float = 0.0
    sinks: Optional[torch.Tensor] = None  # [Hq], one extra logit per head in the softmax denominator

    def __post_init__(self):
        self.softmax_scale = require_positive_real(self.softmax_scale, "softmax_scale")
        if self.window is not None:
            require_positive_int(self.window, "window")
        self.logit_cap = require_non_negative_real(self.logit_cap, "logit_cap")  # 0 disables it
        for name in ("rel_bias", "sinks"):
            t = getattr(self, name)
            if t is not None and (not isinstance(t, torch.Tensor) or not t.is_floating_point()):
                raise TypeError(f"{name} must be None or a floating-point tensor, got "
                                f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
        if self.rel_bias is not None and self.rel_bias.dim() != 3:
            raise ValueError(f"rel_bias must be 3-D [query rows, Hq, rel_extent], got shape "
                             f"{tuple(self.rel_bias.shape)}")
        if self.sinks is not None and self.sinks.dim() != 1:
            raise ValueError(f"sinks must be 1-D [Hq] (one per query head), got shape {tuple(self.sinks.shape)}")
        # sinks are weights: read once per tensor and version. rel_bias is an activation, like q, k and v: never read
        # back (a NaN there propagates to its rows' outputs, as in every attention kernel)
        if self.sinks is not None:
            require_finite_once(self.sinks, "sinks")


def inkling_params(head_dim: int, rel_bias: Optional[torch.Tensor], window: Optional[int] = None) -> AttentionParams:
    """Inkling mode: softmax scale 1/D (not 1/sqrt(D)), relative bias, optional local window."""
    return AttentionParams(softmax_scale=1.0 / head_dim, window=window, rel_bias=rel_bias)
