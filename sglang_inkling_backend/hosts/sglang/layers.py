"""The per-layer record of an SGLang model: one core ``LayerSpec`` per ``RadixAttention``, built once when the
backend is constructed (after SGLang loaded the weights, so checkpoint KV scales are known).

SGLang's ``sliding_window_size`` counts the keys *before* the query (-1: full attention); the record's ``window``
counts visible keys including the query's own, so ``window = sliding_window_size + 1``. This module is the only
place that converts it.
"""
from __future__ import annotations

from typing import Iterable, Optional

from sglang_inkling_backend.checks import (UnsupportedFeature, require_int_value, require_non_negative_real,
                                           require_positive_real, require_softmax_scale)
from sglang_inkling_backend.layer_plan import LayerPlan, LayerSpec


def record_window(sliding_window_size) -> Optional[int]:
    """SGLang's ``sliding_window_size`` (keys before the query; None or -1: full) as visible keys (None: full).
    Anything else that is not an int >= 0 (a float, a bool, -5) is a ValueError naming it."""
    if sliding_window_size is None or sliding_window_size == -1:
        return None
    require_int_value(sliding_window_size, "sliding_window_size", "None, -1 (full attention) or an int >= 0",
                      minimum=0)
    return sliding_window_size + 1


def layer_spec(layer) -> LayerSpec:
    """The record of one ``RadixAttention`` (per-rank head counts). Raises UnsupportedFeature naming what this
    backend does not serve."""
    from sglang.srt.layers.radix_attention import AttentionType

    if layer.is_cross_attention or layer.attn_type != AttentionType.DECODER:
        raise UnsupportedFeature(f"--attention-backend inkling serves causal decoder self-attention; layer "
                                 f"{layer.layer_id} is {layer.attn_type.name}"
                                 f"{' cross-attention' if layer.is_cross_attention else ''}")
    if layer.qk_head_dim != layer.v_head_dim:
        raise UnsupportedFeature(f"--attention-backend inkling needs qk_head_dim == v_head_dim, layer "
                                 f"{layer.layer_id} has {layer.qk_head_dim} and {layer.v_head_dim}")
    if getattr(layer, "xai_temperature_len", -1) and layer.xai_temperature_len > 0:
        raise UnsupportedFeature("--attention-backend inkling does not implement xai_temperature_len")
    where = f"layer {layer.layer_id}'s"
    cap = require_non_negative_real(layer.logit_cap or 0.0, f"{where} logit_cap (RadixAttention.logit_cap)")
    scale = require_softmax_scale(layer.scaling, f"{where} scaling (RadixAttention.scaling, the softmax scale)")
    if cap > 0 and layer.logit_capping_method != "tanh":
        raise UnsupportedFeature(f"--attention-backend inkling implements the tanh logit cap only, layer "
                                 f"{layer.layer_id} asks for {layer.logit_capping_method!r}")
    return LayerSpec(window=record_window(layer.sliding_window_size), num_q_heads=layer.tp_q_head_num,
                     num_kv_heads=layer.tp_k_head_num, head_dim=layer.qk_head_dim,
                     softmax_scale=scale, logit_cap=cap,
                     k_scale=kv_scale_of(layer, "k_scale_float"), v_scale=kv_scale_of(layer, "v_scale_float"))


def kv_scale_of(layer, name: str) -> float:
    """The layer's per-tensor KV scale ``name`` (SGLang's ``k_scale_float`` / ``v_scale_float``): 1.0 where the
    checkpoint gives none (None), else a finite number > 0; a 0, a negative or a non-finite scale is refused, naming
    the layer and the attribute, not replaced."""
    value = getattr(layer, name, None)
    if value is None:
        return 1.0
    return require_positive_real(value, f"layer {layer.layer_id}'s {name} (its per-tensor KV scale)")


def radix_layers(model) -> list:
    from sglang.srt.layers.radix_attention import RadixAttention

    return [m for m in (model.modules() if model is not None else ()) if isinstance(m, RadixAttention)]


def layer_plan_of(layers: Iterable) -> LayerPlan:
    """The model's ``LayerPlan`` from its ``RadixAttention`` layers (ids SGLang gives them; ids without one, e.g.
    other pipeline stages or layers without attention, have no attention in the plan)."""
    by_id = {}
    for layer in layers:
        if layer.layer_id in by_id:
            raise ValueError(f"two RadixAttention modules share layer_id {layer.layer_id}")
        by_id[layer.layer_id] = layer_spec(layer)
    if not by_id:
        raise ValueError("the model has no RadixAttention layers for --attention-backend inkling to serve")
    return LayerPlan([by_id.get(i, LayerSpec(has_attention=False)) for i in range(max(by_id) + 1)])
