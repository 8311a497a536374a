"""The inkling backend's attention implementation, host-free (torch and the core only; no sglang import).

Split like vLLM v1: ``backend.py`` adapts SGLang's objects (``RadixAttention``, ``ForwardBatch``, pools) to plain
values, ``metadata.py`` builds the rails, and this module does the work on them:

- ``attention_params``: the layer's softmax scale, window, logit cap, plus the per-call kwargs SGLang models send
  (``sinks``; the Inkling model's relative bias as ``rel_bias`` or as ``score_mod`` + ``aux_tensors``), with a
  clear error for what this backend does not implement;
- ``dequantize_query``: the Inkling model's MXFP8 q (``q_descale``) back to float32;
- ``paged_kv``: one layer's pool buffers as the reference's ``PagedKV`` (bf16, per-tensor fp8, MXFP8);
- ``store_kv_unchecked``: the write used inside CUDA graphs (no host sync, no validation; eager writes go through
  the pool's validating ``set_kv_buffer``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from sglang_inkling_backend import mxfp8
from sglang_inkling_backend.reference.attention import AttentionParams, PagedKV
from sglang_inkling_backend.scale_layout import ScaleLayout

# kwargs SGLang callers pass that this backend understands or that do not change the result.
HANDLED_KWARGS = frozenset({"sinks", "rel_bias", "rel_bias_event", "score_mod", "aux_tensors", "q_descale",
                            "k_descale", "v_descale"})
# kwargs that would change the result in ways this backend does not implement.
UNSUPPORTED_KWARGS = {
    "k_rope": "MLA (rotary key part)", "q_rope": "MLA (rotary query part)", "cos_sin_cache": "MLA fused rope",
    "idx_q": "sparse (indexer) attention", "return_lse": "returning the log-sum-exp",
}
RELATIVE_BIAS_SCORE_MODS = ("relative_bias_score_mod", "score_mod_rel_bias")  # SGLang's Triton / FA4 versions


@dataclass(frozen=True)
class LayerGeometry:
    """What the implementation needs from one attention layer."""

    layer_id: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    softmax_scale: float
    window: Optional[int] = None  # visible keys including the query's own; None: full attention
    logit_cap: float = 0.0
    k_scale: float = 1.0  # per-tensor fp8 scales (the checkpoint's, else 1.0)
    v_scale: float = 1.0


def score_mod_name(score_mod: Any) -> str:
    fn = getattr(score_mod, "fn", score_mod)  # a triton JITFunction keeps the Python function in .fn
    return getattr(fn, "__name__", type(score_mod).__name__)


def attention_params(geometry: LayerGeometry, kwargs: Mapping[str, Any], rows: int) -> AttentionParams:
    """AttentionParams for one call. Raises NotImplementedError naming what is unsupported."""
    for name, what in UNSUPPORTED_KWARGS.items():
        value = kwargs.get(name)
        if value is not None and value is not False:
            raise NotImplementedError(f"--attention-backend inkling does not implement {what} (got {name}=...)")
    rel_bias = kwargs.get("rel_bias")
    score_mod = kwargs.get("score_mod")
    if score_mod is not None:
        name = score_mod_name(score_mod)
        if name not in RELATIVE_BIAS_SCORE_MODS:
            raise NotImplementedError(f"--attention-backend inkling supports only the relative-bias score_mod "
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
    if rel_bias is not None:
        expected = (rows, geometry.num_q_heads)
        if rel_bias.dim() != 3 or tuple(rel_bias.shape[:2]) != expected:
            raise ValueError(f"relative bias must have shape [{rows}, {geometry.num_q_heads}, rel_extent] (one row "
                             f"per query token), got {tuple(rel_bias.shape)}")
        if rel_bias.stride(-1) != 1:
            rel_bias = rel_bias.contiguous()
    sinks = kwargs.get("sinks")
    if sinks is not None and tuple(sinks.shape) != (geometry.num_q_heads,):
        raise ValueError(f"sinks must have shape [{geometry.num_q_heads}] (one per query head of this rank), got "
                         f"{tuple(sinks.shape)}")
    return AttentionParams(softmax_scale=float(geometry.softmax_scale), window=geometry.window, rel_bias=rel_bias,
                           logit_cap=float(geometry.logit_cap), sinks=sinks)


def dequantize_query(q: torch.Tensor, num_heads: int, head_dim: int,
                     q_descale: Optional[torch.Tensor]) -> torch.Tensor:
    """``q [T, Hq * D]`` (or ``[T, Hq, D]``) as ``[T, Hq, D]``; an e4m3 q (the Inkling model's MXFP8 q) is
    dequantized with its UE8M0 block scales ``q_descale [T, Hq, D // 32]`` (any shape of that many bytes)."""
    rows = q.shape[0]
    q3 = q.reshape(rows, num_heads, head_dim)
    if q.dtype != mxfp8.DATA_DTYPE:
        return q3
    if q_descale is None:
        raise ValueError("q arrived as float8_e4m3fn without q_descale (its MXFP8 block scales)")
    scales = q_descale.view(torch.uint8).reshape(rows, num_heads, head_dim // mxfp8.BLOCK)
    return mxfp8.dequantize(q3, scales, torch.float32)


def paged_kv(kv_format: str, k_buffer: torch.Tensor, v_buffer: torch.Tensor, *, page_size: int,
             k_scales: Optional[torch.Tensor] = None, v_scales: Optional[torch.Tensor] = None,
             k_scale: float = 1.0, v_scale: float = 1.0) -> PagedKV:
    """One layer's pool buffers as a ``PagedKV`` for the routes."""
    if kv_format == "mxfp8":
        if k_scales is None or v_scales is None:
            raise ValueError("an mxfp8 pool layer needs its scale buffers (get_kv_scale_buffer)")
        slots, hkv, d = k_buffer.shape
        layout = ScaleLayout.for_pool(slots, hkv, d, page_size)
        return PagedKV(k_buffer, v_buffer, k_scales.view(torch.uint8), v_scales.view(torch.uint8), layout)
    if kv_format == "fp8_e4m3":
        return PagedKV(k_buffer, v_buffer, k_scale=k_scale, v_scale=v_scale)
    return PagedKV(k_buffer, v_buffer)


def store_kv_unchecked(kv: PagedKV, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                       k_block_scales: Optional[torch.Tensor] = None,
                       v_block_scales: Optional[torch.Tensor] = None) -> None:
    """Write K/V at ``loc`` with no host sync (CUDA-graph capture). The caller guarantees valid slots; shapes are
    still checked (host metadata, no sync)."""
    n, hkv, d = loc.numel(), kv.num_kv_heads, kv.head_dim
    k, v = k.reshape(n, hkv, d), v.reshape(n, hkv, d)
    loc = loc.long()
    if k_block_scales is not None:  # pre-quantized MXFP8
        if not kv.is_mxfp8:
            raise ValueError("block scales need an MXFP8 pool")
        kv.k_buffer[loc] = k.view(mxfp8.DATA_DTYPE)
        kv.v_buffer[loc] = v.view(mxfp8.DATA_DTYPE)
        nb = d // mxfp8.BLOCK
        kv.layout.scatter(kv.k_scales, loc, k_block_scales.view(torch.uint8).reshape(n, hkv, nb), check=False)
        kv.layout.scatter(kv.v_scales, loc, v_block_scales.view(torch.uint8).reshape(n, hkv, nb), check=False)
    elif kv.is_mxfp8:
        if k.is_cuda:
            from sglang_inkling_backend.triton.kv_store import store_kv_mxfp8

            store_kv_mxfp8(kv, loc, k, v, validate=False)
        else:
            for buf, sf, x in ((kv.k_buffer, kv.k_scales, k), (kv.v_buffer, kv.v_scales, v)):
                data, scales = mxfp8.quantize(x)
                buf[loc] = data
                kv.layout.scatter(sf, loc, scales, check=False)
    elif kv.k_buffer.dtype == mxfp8.DATA_DTYPE:  # per-tensor fp8: divide by the scale, saturate
        kv.k_buffer[loc] = mxfp8.quantize_per_tensor(k, kv.k_scale)
        kv.v_buffer[loc] = mxfp8.quantize_per_tensor(v, kv.v_scale)
    else:
        kv.k_buffer[loc] = k.to(kv.k_buffer.dtype)
        kv.v_buffer[loc] = v.to(kv.v_buffer.dtype)
