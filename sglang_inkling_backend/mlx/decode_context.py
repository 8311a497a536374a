"""The batched decode context for hybrid sliding-window models, with the semantics of SGLang's MLX
``BatchedDecodeContext`` (``hardware_backend/mlx/kv_cache/attention_wrapper.py``), framework-free.

One context is built per decode step. ``seq_lens`` are the tokens before the new one (the RoPE positions).
``decode_padding(window)`` gives the right-pad sizes and a keep-mask of shape ``(B, 1, 1, width)`` (None when no
request needs padding), memoised per window: with no window the width is ``max(seq_lens) + 1``; with window W each
request keeps ``min(n + 1, W)`` keys (the window counts the new token).

The mask's array type is the caller's: ``mask_factory(rows: list[list[bool]])`` builds it (torch by default; the
MLX path passes an ``mx.array`` factory), so this module imports torch and the core only, never MLX.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from sglang_inkling_backend.checks import is_int, is_integral, require_entries, require_int_value
from sglang_inkling_backend.layer_plan import LayerPlan

MISSING_FULL_MAP_ERROR = ("BatchedDecodeContext requires full_kv_pool_index_by_layer when the fused AOT RoPE + "
                          "pool-scatter kernel is active")


def torch_keep_mask(rows: list[list[bool]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)[:, None, None, :]


def _seq_len(n: Any, i: int) -> int:
    """An int (or an integer tensor element): a float is refused, never truncated."""
    if isinstance(n, torch.Tensor) and n.numel() == 1 and not n.is_floating_point() and n.dtype != torch.bool:
        n = int(n)
    if not is_integral(n):
        raise TypeError(f"seq_lens[{i}] must be an int, got {n!r} ({type(n).__name__})")
    return int(n)


def _check_index_map(mapping: Any, name: str, size: int) -> None:
    """A map layer id -> pool index: non-negative int keys, int values in ``[0, size)``, no index twice."""
    if not isinstance(mapping, dict):
        raise TypeError(f"{name} must be a dict of layer id -> pool index, got {type(mapping).__name__}")
    for layer, index in mapping.items():
        for what, value in (("layer id", layer), ("pool index", index)):
            if not is_int(value) or value < 0:
                raise ValueError(f"{name}: every {what} must be an int >= 0, got {value!r} (layer {layer!r})")
        if index >= size:
            raise ValueError(f"{name}: layer {layer}'s pool index {index} is out of range [0, {size})")
    if len(set(mapping.values())) != len(mapping):
        raise ValueError(f"{name} gives two layers the same pool index: {dict(sorted(mapping.items()))}")


@dataclass
class BatchedDecodeContext:
    seq_lens: list[int]
    attention_layer_caches: list[Any]  # [attention index][request]
    attention_pool_index_by_layer: dict[int, int] = field(default_factory=dict)
    full_kv_pool_index_by_layer: dict[int, int] = field(default_factory=dict)
    fused_rope_scatter: Optional[Any] = None  # the fused RoPE + pool-scatter state (MLX: aot.rope); None = off
    mask_factory: Callable[[list[list[bool]]], Any] = torch_keep_mask

    def __post_init__(self):
        self.seq_lens = [_seq_len(n, i) for i, n in enumerate(self.seq_lens)]
        if not self.seq_lens:
            raise ValueError("seq_lens must hold one entry per request, got an empty batch")
        if min(self.seq_lens) < 0:
            raise ValueError(f"seq_lens must be >= 0, got {self.seq_lens}")
        self.batch_size = len(self.seq_lens)
        self.max_len = max(self.seq_lens) + 1
        self.needs_padding = min(self.seq_lens) < max(self.seq_lens)
        self.pad_sizes = [max(self.seq_lens) - n for n in self.seq_lens]
        try:
            num_caches = len(self.attention_layer_caches)
        except TypeError:
            raise TypeError(f"attention_layer_caches must be a list (one entry per attention layer), got "
                            f"{type(self.attention_layer_caches).__name__}") from None
        for i, caches in enumerate(self.attention_layer_caches):  # [attention index][request]: cache_for indexes both
            if not hasattr(caches, "__len__") or not hasattr(caches, "__getitem__"):
                raise TypeError(f"attention_layer_caches[{i}] must be a list of the layer's caches, one per request, "
                                f"got {type(caches).__name__}")
            require_entries(caches, f"attention_layer_caches[{i}]", self.batch_size, "request (seq_lens)")
        if not callable(self.mask_factory):
            raise TypeError(f"mask_factory must be callable (rows -> keep-mask), got "
                            f"{type(self.mask_factory).__name__}")
        if not self.attention_pool_index_by_layer:
            self.attention_pool_index_by_layer = {i: i for i in range(num_caches)}
        _check_index_map(self.attention_pool_index_by_layer, "attention_pool_index_by_layer", num_caches)
        _check_index_map(self.full_kv_pool_index_by_layer, "full_kv_pool_index_by_layer",
                         len(self.full_kv_pool_index_by_layer))
        stray = sorted(set(self.full_kv_pool_index_by_layer) - set(self.attention_pool_index_by_layer))
        if stray:
            raise ValueError(f"full_kv_pool_index_by_layer names layers {stray} that have no attention cache")
        if self.fused_rope_scatter is not None and not self.full_kv_pool_index_by_layer:
            # No identity default on purpose: the fused scatter addresses pool buffers by full-attention index, and
            # the cache index would write the wrong buffer whenever windowed layers are interleaved.
            raise ValueError(MISSING_FULL_MAP_ERROR)
        self._padding_by_window: dict[Optional[int], tuple[list[int], Any]] = {}

    @property
    def offsets(self) -> list[int]:
        """RoPE positions of the new tokens."""
        return list(self.seq_lens)

    def decode_padding(self, window: Optional[int]) -> tuple[list[int], Any]:
        if window is not None:
            require_int_value(window, "window", "None or a positive int")
        if window not in self._padding_by_window:
            lens = [n + 1 if window is None else min(n + 1, window) for n in self.seq_lens]
            width = max(lens)
            pads = [width - n for n in lens]
            mask = None
            if min(lens) < width:
                mask = self.mask_factory([[j < n for j in range(width)] for n in lens])
            self._padding_by_window[window] = (pads, mask)
        return self._padding_by_window[window]

    def cache_for(self, layer_id: int, request: int) -> Any:
        if layer_id not in self.attention_pool_index_by_layer:
            raise ValueError(f"layer_id must be one of the model's attention layers "
                             f"{sorted(self.attention_pool_index_by_layer)}, got {layer_id!r}")
        caches = self.attention_layer_caches[self.attention_pool_index_by_layer[layer_id]]
        require_int_value(request, "request", f"an int in [0, {len(caches)}) (the batch's requests)", minimum=0,
                          maximum=len(caches) - 1)
        return caches[request]


def make_decode_context(plan: LayerPlan, seq_lens: Sequence[int], attention_layer_caches: list[Any],
                        fused_rope_scatter: Optional[Any] = None,
                        mask_factory: Callable[[list[list[bool]]], Any] = torch_keep_mask) -> BatchedDecodeContext:
    """The factory: both maps come from the layer plan, so callers never meet the missing-map error."""
    if not isinstance(plan, LayerPlan):
        raise TypeError(f"plan must be a LayerPlan, got {type(plan).__name__}")
    if len(attention_layer_caches) != len(plan.attention_layer_ids):
        raise ValueError(f"attention_layer_caches must hold one entry per attention layer "
                         f"({len(plan.attention_layer_ids)}), got {len(attention_layer_caches)}")
    return BatchedDecodeContext(list(seq_lens), attention_layer_caches,
                                attention_pool_index_by_layer=plan.attention_pool_index_by_layer,
                                full_kv_pool_index_by_layer=plan.full_kv_pool_index_by_layer,
                                fused_rope_scatter=fused_rope_scatter, mask_factory=mask_factory)
