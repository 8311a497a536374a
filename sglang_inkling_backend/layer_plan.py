"""The layer plan: which layer is full, which is windowed, which pool index it uses, and its attention parameters.

The one per-layer record (``LayerSpec``) a host builds once, at start-up, from its layer objects or the model's
config; pools, decode contexts, hosts and the serving path read every per-layer fact from it (window, softmax scale,
logit cap, per-tensor fp8 scales, head counts per rank, pool indices). Two maps matter for hybrid
sliding-window models (SGLang's MLX runner names them the same way):

- ``attention_pool_index_by_layer``: model layer -> index over *all* attention layers (full and windowed); it picks
  the per-request cache.
- ``full_kv_pool_index_by_layer``: model layer -> index over *full* layers only; it picks the shared pool buffer.

Example: windows ``{0: 4, 1: 4, 3: None, 4: 4, 5: None}`` with layer 2 a non-attention layer give
``{0: 0, 1: 1, 3: 2, 4: 3, 5: 4}`` and ``{3: 0, 5: 1}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Sequence

import torch

from .checks import (_describe, is_int, require_bool, require_int, require_int_value, require_non_negative_real,
                     require_positive_int, require_positive_real, require_real, require_softmax_scale)
from .attention_inputs import AttentionParams


@dataclass(frozen=True)
class LogScaling:
    """Inkling's log-length temperature: ``tau = 1 + alpha * ln(max((pos + 1) / n_floor, 1))``."""

    n_floor: int
    alpha: float = 0.1

    def __post_init__(self):
        require_positive_int(self.n_floor, "LogScaling.n_floor")
        object.__setattr__(self, "alpha", require_real(self.alpha, "LogScaling.alpha"))


@dataclass(frozen=True)
class LayerSpec:
    """One model layer as attention sees it. ``window=None`` is full attention; ``window=W`` sees keys at
    distance 0..W-1 (the window counts the new token)."""

    window: Optional[int] = None
    num_q_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    has_attention: bool = True
    rel_extent: Optional[int] = None  # Inkling relative bias reach; None: no bias
    softmax_scale: Optional[float] = None  # None: 1/sqrt(head_dim)
    logit_cap: float = 0.0
    rope_theta: Optional[float] = None
    log_scaling: Optional[LogScaling] = None  # Inkling full layers only
    k_scale: float = 1.0  # per-tensor fp8 KV scales (the checkpoint's, else 1.0); MXFP8 and bf16 ignore them
    v_scale: float = 1.0

    def __post_init__(self):
        if not require_bool(self.has_attention, "LayerSpec.has_attention"):
            return
        for name in ("num_q_heads", "num_kv_heads", "head_dim"):
            require_int_value(getattr(self, name), f"LayerSpec.{name}", "a positive int for an attention layer")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"LayerSpec.num_q_heads ({self.num_q_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads}) for GQA")
        if self.window is not None:
            require_int_value(self.window, "LayerSpec.window", "None (full attention) or a positive int")
        if self.rel_extent is not None:
            require_positive_int(self.rel_extent, "LayerSpec.rel_extent")
        if self.softmax_scale is not None:
            object.__setattr__(self, "softmax_scale", require_softmax_scale(self.softmax_scale,
                                                                            "LayerSpec.softmax_scale"))
        for name in ("k_scale", "v_scale"):
            object.__setattr__(self, name, require_positive_real(getattr(self, name), f"LayerSpec.{name}"))
        object.__setattr__(self, "logit_cap", require_non_negative_real(self.logit_cap, "LayerSpec.logit_cap"))
        if self.rope_theta is not None:
            object.__setattr__(self, "rope_theta", require_positive_real(self.rope_theta, "LayerSpec.rope_theta"))
        if self.log_scaling is not None and not isinstance(self.log_scaling, LogScaling):
            raise TypeError(f"LayerSpec.log_scaling must be None or a LogScaling, got {_describe(self.log_scaling)}")

    @property
    def is_full(self) -> bool:
        return self.has_attention and self.window is None

    @property
    def scale(self) -> float:
        return self.softmax_scale if self.softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def group_size(self) -> int:
        return self.num_q_heads // self.num_kv_heads


@dataclass(frozen=True)
class LayerPlan:
    specs: tuple[LayerSpec, ...]
    attention_layer_ids: tuple[int, ...] = field(init=False)
    full_layer_ids: tuple[int, ...] = field(init=False)
    windowed_layer_ids: tuple[int, ...] = field(init=False)

    def __init__(self, specs: Sequence[LayerSpec]):
        try:
            specs = tuple(specs)
        except TypeError:
            raise TypeError(f"specs must be a sequence of LayerSpec, got {type(specs).__name__}") from None
        for i, s in enumerate(specs):
            if not isinstance(s, LayerSpec):
                raise TypeError(f"specs[{i}] must be a LayerSpec, got {type(s).__name__}")
        object.__setattr__(self, "specs", specs)
        object.__setattr__(self, "attention_layer_ids", tuple(i for i, s in enumerate(specs) if s.has_attention))
        object.__setattr__(self, "full_layer_ids", tuple(i for i, s in enumerate(specs) if s.is_full))
        object.__setattr__(self, "windowed_layer_ids",
                           tuple(i for i, s in enumerate(specs) if s.has_attention and s.window is not None))
        if not self.attention_layer_ids:
            raise ValueError("a LayerPlan needs at least one attention layer")

    # --- constructors -------------------------------------------------------------------------------------------
    @classmethod
    def from_windows(cls, windows: Mapping[int, Optional[int]], *, num_layers: Optional[int] = None,
                     num_q_heads: int = 1, num_kv_heads: int = 1, head_dim: int = 128, **common: Any) -> "LayerPlan":
        """Layers named in ``windows`` are attention layers (``None`` = full); the others up to ``num_layers`` have
        no attention."""
        if not windows:
            raise ValueError("windows must name at least one attention layer")
        keys = [i for i in windows if not is_int(i)]
        if keys:
            raise TypeError(f"windows must map int layer ids to windows, got keys {keys!r}")
        if num_layers is not None:
            require_positive_int(num_layers, "num_layers")
        n = num_layers if num_layers is not None else max(windows) + 1
        if any(not 0 <= i < n for i in windows):
            raise ValueError(f"windows names layers outside [0, {n}): {sorted(windows)}")
        specs = [LayerSpec(window=windows[i], num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                           head_dim=head_dim, **common) if i in windows else LayerSpec(has_attention=False)
                 for i in range(n)]
        return cls(specs)

    @classmethod
    def from_hf_config(cls, config: Any) -> "LayerPlan":
        """From a Hugging Face style config: Llama-like (all full), Gemma-2/3 (``layer_types`` or
        ``sliding_window_pattern``), Inkling (``local_layer_ids`` with optional ``swa_*`` geometry). A field that is
        None counts as absent; any other value must be valid (0 is never read as absent)."""
        fields = _ConfigFields(config)
        n, hq, hkv, d, full_theta, local_theta = check_hf_geometry(fields)
        if fields.get("model_type") == "inkling" or fields.get("local_layer_ids") is not None:
            local, local_spec, full_spec = check_inkling_config(fields, n, hq, hkv, d)
            return cls([LayerSpec(**(local_spec if i in local else full_spec)) for i in range(n)])
        is_local, window, common = check_sliding_config(fields, n, hq, hkv, d)
        return cls([LayerSpec(window=window if loc else None, rope_theta=local_theta if loc else full_theta, **common)
                    for loc in is_local])

    # --- queries ------------------------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.specs)

    def spec(self, layer_id: int) -> LayerSpec:
        require_int_value(layer_id, "layer_id", f"an int in [0, {len(self.specs)})", minimum=0,
                          maximum=len(self.specs) - 1)
        return self.specs[layer_id]

    def attention_spec(self, layer_id: int) -> LayerSpec:
        s = self.spec(layer_id)
        if not s.has_attention:
            raise ValueError(f"layer {layer_id} has no attention (attention layers: {list(self.attention_layer_ids)})")
        return s

    def is_full(self, layer_id: int) -> bool:
        return self.attention_spec(layer_id).is_full

    def window(self, layer_id: int) -> Optional[int]:
        return self.attention_spec(layer_id).window

    @property
    def attention_pool_index_by_layer(self) -> dict[int, int]:
        return {layer: i for i, layer in enumerate(self.attention_layer_ids)}

    @property
    def full_kv_pool_index_by_layer(self) -> dict[int, int]:
        return {layer: i for i, layer in enumerate(self.full_layer_ids)}

    @property
    def swa_kv_pool_index_by_layer(self) -> dict[int, int]:
        return {layer: i for i, layer in enumerate(self.windowed_layer_ids)}

    @property
    def is_hybrid(self) -> bool:
        return bool(self.full_layer_ids) and bool(self.windowed_layer_ids)

    def rope_layer(self) -> int:
        """The layer whose RoPE parameters a fused kernel should use: a full layer (in Gemma the first attention
        layer is a sliding one with a different base)."""
        return self.full_layer_ids[0] if self.full_layer_ids else self.attention_layer_ids[0]

    def with_tp(self, tp_size: int) -> "LayerPlan":
        """Per-rank geometry: query heads split, KV heads split or replicated when tp_size > num_kv_heads."""
        require_int_value(tp_size, "tp_size")
        specs = []
        for i, s in enumerate(self.specs):
            if not s.has_attention:
                specs.append(s)
                continue
            if s.num_q_heads % tp_size:
                raise ValueError(f"layer {i}: num_q_heads={s.num_q_heads} is not divisible by tp_size={tp_size}")
            if s.num_kv_heads % tp_size and tp_size % s.num_kv_heads:
                raise ValueError(f"layer {i}: num_kv_heads={s.num_kv_heads} and tp_size={tp_size} must divide "
                                 f"one another (KV heads are split or replicated)")
            hkv = max(1, s.num_kv_heads // tp_size)
            specs.append(replace(s, num_q_heads=s.num_q_heads // tp_size, num_kv_heads=hkv))
        return LayerPlan(specs)


class _ConfigFields:
    """The fields of a Hugging Face config (its ``text_config`` where it has one), each checked as it is read: a
    field that is None counts as absent."""

    def __init__(self, config: Any):
        self.text = getattr(config, "text_config", None) or config

    def get(self, name: str, default=None):
        return getattr(self.text, name, default)

    def positive_int(self, name: str, default=None):
        value = self.get(name)
        return default if value is None else require_positive_int(value, f"config.{name}")

    def positive_real(self, name: str, value):
        return None if value is None else require_positive_real(value, f"config.{name}")

    def window(self, reason: str) -> int:
        window = self.get("sliding_window")
        if window is None:
            raise ValueError(f"{reason} but config.sliding_window is None: a window needs its size")
        return require_positive_int(window, "config.sliding_window")


def _check_gqa(q_name: str, q: int, kv_name: str, kv: int) -> None:
    if q % kv:
        raise ValueError(f"config.{q_name} ({q}) must be a multiple of config.{kv_name} ({kv}) for GQA")


def check_hf_geometry(fields: _ConfigFields) -> tuple:
    """The fields every config gives: ``(num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
    rope_theta, rope_local_base_freq)``, the head counts and head_dim positive ints (head_dim from hidden_size where
    absent), the RoPE bases positive numbers or None."""
    n = fields.get("num_hidden_layers")
    hq = fields.get("num_attention_heads")
    if not is_int(n) or not is_int(hq) or n < 1 or hq < 1:
        raise ValueError(f"config must give num_hidden_layers and num_attention_heads as positive ints, got "
                         f"{n!r} and {hq!r}")
    hkv = fields.positive_int("num_key_value_heads", hq)
    d = fields.positive_int("head_dim")
    if d is None:
        hidden = fields.get("hidden_size")
        if hidden is None:
            raise ValueError("config must give head_dim or hidden_size (head_dim = hidden_size // "
                             "num_attention_heads), got neither")
        require_positive_int(hidden, "config.hidden_size")
        if hidden % hq:
            raise ValueError(f"config.hidden_size ({hidden}) must be a multiple of config.num_attention_heads "
                             f"({hq}) when config.head_dim is not given")
        d = hidden // hq
    full_theta = fields.positive_real("rope_theta", fields.get("rope_theta"))
    local_theta = fields.positive_real("rope_local_base_freq", fields.get("rope_local_base_freq", full_theta))
    return n, hq, hkv, d, full_theta, local_theta


def check_inkling_config(fields: _ConfigFields, n: int, hq: int, hkv: int, d: int) -> tuple:
    """Inkling's fields, as ``(local layer ids, a local layer's LayerSpec fields, a full layer's LayerSpec fields)``
    (a kind of layer the model lacks: None): ``local_layer_ids`` in ``[0, n)``; for local layers the window and the
    ``swa_*`` geometry; for full layers ``rel_extent`` and the log-length scaling."""
    local_ids = fields.get("local_layer_ids")
    try:
        ids = list(local_ids or [])
    except TypeError:
        raise TypeError(f"config.local_layer_ids must be a list of layer ids, got {_describe(local_ids)}") from None
    for i in ids:
        require_int(i, "config.local_layer_ids' entries")
    outside = [i for i in ids if not 0 <= i < n]
    if outside:
        raise ValueError(f"config.local_layer_ids must name layers in [0, {n}) (config.num_hidden_layers), "
                         f"got {outside}")
    local = set(ids)
    local_spec = full_spec = None
    if local:
        w = fields.window("config.local_layer_ids names local layers")
        hq_local = fields.positive_int("swa_num_attention_heads", hq)
        hkv_local = fields.positive_int("swa_num_key_value_heads", hkv)
        d_local = fields.positive_int("swa_head_dim", d)
        _check_gqa("swa_num_attention_heads", hq_local, "swa_num_key_value_heads", hkv_local)
        local_spec = dict(window=w, num_q_heads=hq_local, num_kv_heads=hkv_local, head_dim=d_local, rel_extent=w,
                          softmax_scale=1.0 / d_local)
    if len(local) < n:
        _check_gqa("num_attention_heads", hq, "num_key_value_heads", hkv)
        rel_extent = fields.get("rel_extent", 1024)
        if rel_extent is not None:
            require_positive_int(rel_extent, "config.rel_extent")
        n_floor = fields.positive_int("log_scaling_n_floor")
        alpha = fields.get("log_scaling_alpha")
        log_scaling = None if n_floor is None else LogScaling(
            n_floor, 0.1 if alpha is None else require_real(alpha, "config.log_scaling_alpha"))
        full_spec = dict(window=None, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, rel_extent=rel_extent,
                         softmax_scale=1.0 / d, log_scaling=log_scaling)
    return local, local_spec, full_spec


def check_sliding_config(fields: _ConfigFields, n: int, hq: int, hkv: int, d: int) -> tuple:
    """A Llama-like or Gemma-2/3 config's fields, as ``(is_local per layer, the window or None, the LayerSpec
    fields every layer shares)``: the softmax scale (``query_pre_attn_scalar``), the logit cap, and which layers
    are windowed (``layer_types``, else ``sliding_window_pattern``, else ``use_sliding_window``)."""
    _check_gqa("num_attention_heads", hq, "num_key_value_heads", hkv)
    query_pre_attn_scalar = fields.positive_real("query_pre_attn_scalar", fields.get("query_pre_attn_scalar"))
    scale = query_pre_attn_scalar ** -0.5 if query_pre_attn_scalar is not None else None
    cap = fields.get("attn_logit_softcapping")
    cap = 0.0 if cap is None else require_non_negative_real(cap, "config.attn_logit_softcapping")
    pattern = fields.get("sliding_window_pattern")
    use_sliding = fields.get("use_sliding_window")
    if use_sliding is not None:
        require_bool(use_sliding, "config.use_sliding_window")
    layer_types = fields.get("layer_types")
    window = fields.get("sliding_window")
    if layer_types is not None:
        known = ("sliding_attention", "full_attention")
        if len(layer_types) != n:
            raise ValueError(f"config.layer_types names {len(layer_types)} layers, the model has "
                             f"num_hidden_layers={n}")
        unknown = sorted({t for t in layer_types if t not in known})
        if unknown:
            raise ValueError(f"config.layer_types holds {unknown}; this backend serves {known}")
        is_local = [t == "sliding_attention" for t in layer_types]
        if any(is_local):
            fields.window("config.layer_types has sliding_attention layers")
    elif pattern is not None and window is not None:
        p = require_positive_int(pattern, "config.sliding_window_pattern")
        fields.window("config.sliding_window_pattern is given")
        is_local = [(i + 1) % p != 0 for i in range(n)]
    else:
        is_local = [bool(use_sliding)] * n
        if use_sliding:
            fields.window("config.use_sliding_window is True")
    common = dict(num_q_heads=hq, num_kv_heads=hkv, head_dim=d, softmax_scale=scale, logit_cap=cap)
    return is_local, window, common


def attention_params(spec: LayerSpec, *, rows: int, rel_bias: Optional[torch.Tensor] = None,
                     sinks: Optional[torch.Tensor] = None) -> AttentionParams:
    """The kernels' ``AttentionParams`` for one call of the layer ``spec`` over ``rows`` query rows: the record's
    softmax scale, window and logit cap, plus the call's relative bias ``[rows, Hq, rel_extent]`` and attention
    sinks ``[Hq]`` (checked against the record's per-rank head count)."""
    if not spec.has_attention:
        raise ValueError("spec has no attention (LayerSpec.has_attention is False)")
    hq = spec.num_q_heads
    if rel_bias is not None:
        if not isinstance(rel_bias, torch.Tensor) or rel_bias.dim() != 3 or tuple(rel_bias.shape[:2]) != (rows, hq):
            shape = tuple(rel_bias.shape) if isinstance(rel_bias, torch.Tensor) else type(rel_bias).__name__
            raise ValueError(f"relative bias must have shape [{rows}, {hq}, rel_extent] (one row per query token), "
                             f"got {shape}")
        if rel_bias.stride(-1) != 1:
            rel_bias = rel_bias.contiguous()
    if sinks is not None and (not isinstance(sinks, torch.Tensor) or tuple(sinks.shape) != (hq,)):
        shape = tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else type(sinks).__name__
        raise ValueError(f"sinks must have shape [{hq}] (one per query head of this rank), got {shape}")
    return AttentionParams(softmax_scale=float(spec.scale), window=spec.window, rel_bias=rel_bias,
                           logit_cap=float(spec.logit_cap), sinks=sinks)

