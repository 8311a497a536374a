"""The keyword arguments SGLang's models pass to ``forward_decode`` / ``forward_extend`` (``sinks``; the Inkling
model's relative bias as ``rel_bias`` or as ``score_mod`` + ``aux_tensors``; MXFP8 ``q_descale`` / ``k_descale`` /
``v_descale``), turned into the core's ``AttentionParams`` for the layer's record, with a clear error for what this
backend does not implement.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from sglang_inkling_backend.checks import UnsupportedFeature
from sglang_inkling_backend.layer_plan import LayerSpec, attention_params as record_attention_params
from sglang_inkling_backend.attention_inputs import AttentionParams

# kwargs that would change the result in ways this backend does not implement.
UNSUPPORTED_KWARGS = {
    "k_rope": "MLA (rotary key part)", "q_rope": "MLA (rotary query part)", "cos_sin_cache": "MLA fused rope",
    "idx_q": "sparse (indexer) attention", "return_lse": "returning the log-sum-exp",
}
RELATIVE_BIAS_SCORE_MODS = ("relative_bias_score_mod", "score_mod_rel_bias")  # SGLang's Triton / FA4 versions


# kwargs that make a call's parameters its own (a bias, sinks, a score_mod); a call without them has its layer's
PER_CALL_KWARGS = ("rel_bias", "score_mod", "aux_tensors", "sinks", "rel_bias_event")


def layer_params_only(kwargs: Mapping[str, Any]) -> bool:
    """Whether a call's AttentionParams are its layer's alone (no per-call tensors, nothing unsupported asked)."""
    return not kwargs or all(kwargs.get(name) is None for name in PER_CALL_KWARGS) and all(
        kwargs.get(name) is None or kwargs.get(name) is False for name in UNSUPPORTED_KWARGS)


def score_mod_name(score_mod: Any) -> str:
    fn = getattr(score_mod, "fn", score_mod)  # a triton JITFunction keeps the Python function in .fn
    return getattr(fn, "__name__", type(score_mod).__name__)


def attention_params(spec: LayerSpec, kwargs: Mapping[str, Any], rows: int) -> AttentionParams:
    """AttentionParams for one call of the layer ``spec``. Raises UnsupportedFeature naming what is unsupported."""
    for name, what in UNSUPPORTED_KWARGS.items():
        value = kwargs.get(name)
        if value is not None and value is not False:
            raise UnsupportedFeature(f"--attention-backend inkling does not implement {what} (got {name}=...)")
    rel_bias = kwargs.get("rel_bias")
    score_mod = kwargs.get("score_mod")
    if score_mod is not None:
        name = score_mod_name(score_mod)
        if name not in RELATIVE_BIAS_SCORE_MODS:
            raise UnsupportedFeature(f"--attention-backend inkling supports only the relative-bias score_mod "
                                     f"({', '.join(RELATIVE_BIAS_SCORE_MODS)}), got score_mod {name!r}")
        aux = kwargs.get("aux_tensors")
        if aux is None or len(aux) != 1:
            raise ValueError("the relative-bias score_mod needs aux_tensors=[rel_logits [rows, Hq, rel_extent]]")
        if rel_bias is not None:
            raise ValueError("pass the relative bias once: rel_bias or score_mod + aux_tensors, not both")
        rel_bias = aux[0]
    event = kwargs.get("rel_bias_event")
    if event is not None:  # the bias was computed on a side stream
        torch.cuda.current_stream().wait_event(event)
    return record_attention_params(spec, rows=rows, rel_bias=rel_bias, sinks=kwargs.get("sinks"))
