"""Torch reference for the Inkling decode prologue: readable, float32 inside, the oracle for every kernel.

Same arguments and argument checks as SGLang's ``inkling_attn_prologue_decode``
(``kernels/ops/attention/inkling_attn_prologue.py``; CUDA ``inkling_attn_prologue_fused.cuh``). For every token
``t`` (one per request) of ``qkvr``, whose row holds ``q = row[q_off : q_off + dq]``, ``k = row[k_off : k_off + dkv]``
and ``v = row[v_off : v_off + dkv]`` (bf16; ``qkvr`` may be a strided view of the packed projection, so the
offsets can reach past ``qkvr.shape[1]``):

1. Short conv of k and v (depthwise, width ``W = k_weight.shape[1]``), per channel ``c``, accumulated in float32
   in this order::

       acc = sum_{w < W-1} hist[w, c] * cm * weight[c, w]  +  x[c] * weight[c, W-1]
       acc = silu(acc) if activation;   acc += x[c] if use_residual

   ``hist = conv_cache[slot]`` (row 0 the oldest tap, row W-2 the previous token), ``slot = cache_indices[t]``,
   or slot 0 for a padding row (``cache_indices[t] == -1``); ``cm = cache_mask[t]`` (0/1; any shape of T
   elements, SGLang's decode passes ``[T, 1, 1]``).
2. Conv-cache shift update, in place, real rows only, every tap read before any write::

       new[w] = cm ? old[w + 1] : 0   for w < W-2;      new[W-2] = x   (the raw token)

   and, where ``track_mask[t]``, the same window also goes to slot ``track_indices[t]``.
3. Per-head (128 channels) RMSNorm of q and of the conv'd k, none on v, with the bf16 rounding points of SGLang::

       k_n = bf16(bf16(kconv) * inv * gamma_k);   q_n = bf16(q * inv * gamma_q);   v = bf16(vconv)
       inv = 1 / sqrt(sum(x^2) / 128 + eps)

   The sum of squares is accumulated in float64 and rounded once to float32: squares of bf16 values are exact,
   so the sum is exact (for any reduction order) whenever a head's values span less than ~2^30, and every kernel
   that does the same lands on the same float32 bits. ``1 / sqrt`` is IEEE float32, correctly rounded (SGLang's
   CUDA ``rsqrtf`` may differ by an ulp; its own tests allow 2e-2).
4. Log-scaling tau (``log_scaling_tau[t]``, float32): ``q_n = bf16(q_n * tau)``, a second rounding, before any
   quantization. k and v are not scaled.
5. MXFP8 mode: q is quantized (``mxfp8.quantize``: e4m3 data + one UE8M0 scale per (token, head, 32-block),
   returned as ``q_scale [T, dq // 128, 4]`` float8_e8m0fnu), and k_n / v are quantized and stored at ``loc`` into
   ``k_buf`` / ``v_buf`` with their scales in SGLang's interleaved layout (``ScaleLayout``, page size 128).
   bf16 mode: ``k_n`` / ``v`` are stored as bf16 when ``do_store``.
   No store for padding rows, nor where ``loc[t] < 0``.

Non-finite input: every NaN the prologue writes in bf16 (outputs, conv caches, the bf16 store) is the canonical
quiet NaN ``0x7FC0`` (``BF16_NAN``; a conversion's own NaN bits differ between torch code paths and devices), and an
MXFP8 block holding a NaN or an infinity is stored as ``mxfp8`` states (scale 0xFF, elements 0x7F). So the bytes,
NaNs included, are one function of the input.

Outputs ``(q_out, k_out, v_out, q_scale)``: ``q_out [T, dq]`` bf16 (e4m3 in MXFP8 mode), fresh contiguous
``k_out`` / ``v_out [T, dkv]`` bf16, ``q_scale`` or None.

Every check runs before any buffer is written (``validate_prologue_args``, shared with the Triton kernel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .. import mxfp8
from ..checks import PADDING_SLOT, is_number, require_bool, require_int, require_tensor
from ..scale_layout import INTERLEAVED_PAGE_SIZE, ScaleLayout

HEAD_DIM = 128  # the fused prologue's only head size (SGLang's kHeadDim)
PAD_SLOT = -1  # cache_indices value of a padding row
BF16_NAN = 0x7FC0  # the one bf16 NaN the prologue writes (sign clear, quiet): see canonical_bf16
_INDEX_DTYPES = (torch.int32, torch.int64)
_E8M0 = getattr(torch, "float8_e8m0fnu", None)
_SCALE_DTYPES = tuple(d for d in (torch.uint8, _E8M0) if d is not None)


@dataclass(frozen=True)
class PrologueGeometry:
    """What the checks derived from the arguments; the kernels launch from it."""

    num_tokens: int
    num_q_heads: int
    num_kv_heads: int
    conv_width: int
    row_extent: int  # elements of each qkvr row the prologue reads (from qkvr's first element)
    use_silu: bool
    do_track: bool
    layout: Optional[ScaleLayout]  # MXFP8 mode only


# --------------------------------------------------------------------------------------------------------------
# Argument checks (one place; the Triton kernel calls this too)
# --------------------------------------------------------------------------------------------------------------

def _require_tensor(value, name: str) -> torch.Tensor:
    return require_tensor(value, name)  # a tensor holding data (not on the meta device): checks.py's one rule


def _require_dtype(t: torch.Tensor, name: str, dtypes) -> None:
    if not isinstance(dtypes, tuple):
        dtypes = (dtypes,)
    if t.dtype not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must be {want}, got {t.dtype}")


def _require_shape(t: torch.Tensor, name: str, shape: tuple) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")


def _kind(value) -> str:
    return "None" if value is None else (f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor)
                                         else type(value).__name__)


def _storage_elements(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes() // t.element_size()


def _check_mxfp8_scale_buffers(k_buf, dq, dkv, sfk, sfv, page_size) -> ScaleLayout:
    """SGLang's MXFP8 guards, with SGLang's messages, then ours (dtype, page size)."""
    if dq % HEAD_DIM != 0 or dkv % HEAD_DIM != 0:
        raise ValueError(f"MXFP8 fused decode prologue requires head_dim-aligned Q/K/V. dq and dkv must be "
                         f"multiples of head_dim {HEAD_DIM}, got dq={dq}, dkv={dkv}")
    if sfk is None or sfv is None:
        raise ValueError(f"MXFP8 fused decode prologue requires K/V scale buffers. sfk and sfv must be uint8 / "
                         f"float8_e8m0fnu tensors, got sfk={_kind(sfk)}, sfv={_kind(sfv)}")
    _require_tensor(sfk, "sfk")
    _require_tensor(sfv, "sfv")
    _require_tensor(k_buf, "k_buf")
    if page_size != INTERLEAVED_PAGE_SIZE:
        raise ValueError(f"MXFP8 fused decode prologue writes the interleaved scale layout, which needs "
                         f"page_size {INTERLEAVED_PAGE_SIZE}, got page_size={page_size}")
    sf_shape = (k_buf.shape[0] // page_size, dkv // HEAD_DIM, 32, page_size // 32, 4)
    if tuple(sfk.shape) != sf_shape or tuple(sfv.shape) != sf_shape:
        raise ValueError(
            "MXFP8 fused decode prologue requires interleaved K/V scale buffers "
            f"with shape {sf_shape}, got {tuple(sfk.shape)} and {tuple(sfv.shape)}. (sfk and sfv)"
        )
    if not sfk.is_contiguous() or not sfv.is_contiguous():
        raise ValueError(f"MXFP8 fused decode prologue requires contiguous interleaved SFK/SFV. Got sfk strides "
                         f"{tuple(sfk.stride())}, sfv strides {tuple(sfv.stride())}")
    _require_dtype(sfk, "sfk", _SCALE_DTYPES)
    _require_dtype(sfv, "sfv", _SCALE_DTYPES)
    if sf_shape[0] == 0:
        raise ValueError(f"k_buf must hold at least one page of {page_size} slots, got {k_buf.shape[0]} slots")
    return ScaleLayout.for_pool(sf_shape[0] * page_size, dkv // HEAD_DIM, HEAD_DIM, page_size)


def _check_values(k_cache, cache_indices, loc, k_buf, track_mask, track_indices, do_store,
                  layout: Optional[ScaleLayout]) -> None:
    """Checks that read index values, on the host: the index tensors travel there in one copy (one round trip on
    a GPU)."""
    num_cache_slots = k_cache.shape[0]
    T = cache_indices.shape[0]
    parts = [cache_indices.long(), loc.long()]
    if track_mask is not None:
        parts += [track_mask.reshape(-1).long(), track_indices.long()]
    host = torch.cat(parts).cpu().split(T)
    ci, dst = host[0], host[1]
    real = ci != PAD_SLOT
    if bool(((ci < PAD_SLOT) | (ci >= num_cache_slots)).any()):
        raise ValueError(f"cache_indices must be -1 (padding) or a conv-cache slot in [0, {num_cache_slots}), "
                         f"got values in [{int(ci.min())}, {int(ci.max())}]")
    written = [ci[real]]
    if track_mask is not None:
        tracked = host[2].bool() & real
        ti = host[3][tracked]
        if bool(((ti < 0) | (ti >= num_cache_slots)).any()):
            raise ValueError(f"track_indices of tracked real rows must be conv-cache slots in "
                             f"[0, {num_cache_slots}), got values in [{int(ti.min())}, {int(ti.max())}]")
        written.append(ti)
    # Slot 0 of SGLang's conv-state pool and of its KV pool is a padding slot: CUDA-graph padding rows (zero-filled
    # request indices) read and write it, several per step. Every other slot is written at most once.
    written = torch.cat(written)
    written = written[written != PADDING_SLOT]
    if torch.unique(written).numel() != written.numel():
        raise ValueError("the conv-cache slots this call writes (cache_indices of real rows and their "
                         "track_indices) must be distinct, except the padding slot 0")
    if do_store:
        num_kv_slots = layout.num_slots if layout is not None else k_buf.shape[0]
        stored = dst[real & (dst >= 0)]
        if bool((stored >= num_kv_slots).any()):
            raise ValueError(f"loc must be < {num_kv_slots} (the KV pool's slots) on stored rows, "
                             f"got max {int(stored.max())}")
        stored = stored[stored != PADDING_SLOT]
        if torch.unique(stored).numel() != stored.numel():
            raise ValueError("loc must be distinct on stored rows (real rows with loc >= 0), except the padding "
                             "slot 0")


def check_quantize_q(quantize_q: Optional[bool], mxfp8_quant: bool) -> bool:
    """Whether the prologue rounds q to MXFP8: ``mxfp8_quant`` unless ``quantize_q`` says otherwise; q is rounded
    only in MXFP8 mode."""
    if quantize_q is None:
        return bool(mxfp8_quant)
    require_bool(quantize_q, "quantize_q", "None or a bool")
    if quantize_q and not mxfp8_quant:
        raise ValueError("quantize_q=True needs mxfp8_quant=True (q is rounded to MXFP8 only in MXFP8 mode)")
    return quantize_q


def validate_prologue_args(
    qkvr, k_cache, v_cache, cache_indices, cache_mask, k_weight, v_weight, q_gamma, k_gamma, eps, loc,
    k_buf, v_buf, q_off, k_off, v_off, dq, dkv, activation=None, use_residual=True, track_mask=None,
    track_indices=None, do_store=True, mxfp8_quant=False, sfk=None, sfv=None, page_size=INTERLEAVED_PAGE_SIZE,
    log_scaling_tau=None, check_values: bool = True,
) -> PrologueGeometry:
    """Every check of the decode prologue, before anything is written. ``check_values`` also checks the index
    values (slot ranges, distinct written slots), which costs a device-to-host copy on a GPU."""
    layout = _check_scalars(dq, dkv, page_size, activation, eps, q_off, k_off, v_off, mxfp8_quant, do_store, k_buf,
                            sfk, sfv)
    _check_qkvr(qkvr, dq, dkv, q_off, k_off, v_off)
    _check_conv(k_cache, v_cache, k_weight, v_weight, dkv)
    num_tokens = qkvr.shape[0]
    _check_token_metadata(num_tokens, cache_indices, cache_mask, loc, q_gamma, k_gamma, track_mask, track_indices,
                          log_scaling_tau)
    _check_kv_buffers(k_buf, v_buf, dkv, do_store, mxfp8_quant)
    tensors = {"k_cache": k_cache, "v_cache": v_cache, "cache_indices": cache_indices, "cache_mask": cache_mask,
               "k_weight": k_weight, "v_weight": v_weight, "q_gamma": q_gamma, "k_gamma": k_gamma, "loc": loc,
               "k_buf": k_buf, "v_buf": v_buf, "track_mask": track_mask, "track_indices": track_indices,
               "sfk": sfk if mxfp8_quant else None, "sfv": sfv if mxfp8_quant else None,
               "log_scaling_tau": log_scaling_tau}
    for name, t in tensors.items():  # one device for everything the kernel touches
        if t is not None and t.device != qkvr.device:
            raise ValueError(f"{name} is on {t.device}, qkvr on {qkvr.device}: all tensors must share a device")
    do_track = track_mask is not None
    if check_values and num_tokens > 0:
        _check_values(k_cache, cache_indices, loc, k_buf, track_mask if do_track else None, track_indices,
                      do_store, layout)
    return PrologueGeometry(num_tokens, dq // HEAD_DIM, dkv // HEAD_DIM, k_weight.shape[1],
                            max(q_off + dq, k_off + dkv, v_off + dkv), activation in ("silu", "swish"), do_track,
                            layout)


def _check_scalars(dq, dkv, page_size, activation, eps, q_off, k_off, v_off, mxfp8_quant, do_store, k_buf, sfk,
                   sfv) -> Optional[ScaleLayout]:
    """The sizes, offsets and modes, and in MXFP8 mode the scale buffers (their ``ScaleLayout``; None in bf16
    mode)."""
    require_int(dq, "dq", 1)
    require_int(dkv, "dkv", 1)
    require_int(page_size, "page_size", 1)
    layout = None
    if mxfp8_quant:
        layout = _check_mxfp8_scale_buffers(k_buf, dq, dkv, sfk, sfv, page_size)
        if not do_store:
            raise ValueError("MXFP8 fused decode prologue requires do_store=True (it owns the K/V store)")
    if dq % HEAD_DIM or dkv % HEAD_DIM:
        raise ValueError(f"dq and dkv must be multiples of head_dim {HEAD_DIM}, got dq={dq}, dkv={dkv}")
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"activation must be None, 'silu' or 'swish', got {activation!r}")
    if not is_number(eps) or not eps >= 0:
        raise ValueError(f"eps must be a non-negative float, got {eps!r}")
    for name, off in (("q_off", q_off), ("k_off", k_off), ("v_off", v_off)):
        require_int(off, name, 0)
    return layout


def _check_qkvr(qkvr, dq, dkv, q_off, k_off, v_off) -> None:
    """``qkvr``: [T, *] bf16 rows (possibly a strided view into the packed projection) whose storage holds every
    row up to the furthest offset."""
    _require_tensor(qkvr, "qkvr")
    _require_dtype(qkvr, "qkvr", torch.bfloat16)
    if qkvr.dim() != 2:
        raise ValueError(f"qkvr must be 2-D [T, row], got shape {tuple(qkvr.shape)}")
    if qkvr.shape[1] > 1 and qkvr.stride(1) != 1:
        raise ValueError(f"qkvr rows must be contiguous (stride(1) == 1), got strides {tuple(qkvr.stride())}")
    num_tokens = qkvr.shape[0]
    row_extent = max(q_off + dq, k_off + dkv, v_off + dkv)
    if num_tokens > 0:
        needed = qkvr.storage_offset() + (num_tokens - 1) * qkvr.stride(0) + row_extent
        if needed > _storage_elements(qkvr):
            raise ValueError(f"qkvr's storage is too small for the q/k/v offsets: rows of stride "
                             f"{qkvr.stride(0)} reading up to element {row_extent} need {needed} elements, "
                             f"the storage holds {_storage_elements(qkvr)}")


def _check_conv(k_cache, v_cache, k_weight, v_weight, dkv) -> None:
    """The conv weights ``[dkv, W]`` (W >= 2) and caches ``[slots, W-1, dkv]``, bf16, channel-contiguous."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("k_weight", k_weight), ("v_weight", v_weight)):
        _require_tensor(t, name)
        _require_dtype(t, name, torch.bfloat16)
    if k_weight.dim() != 2 or k_weight.shape[0] != dkv or k_weight.shape[1] < 2:
        raise ValueError(f"k_weight must be [dkv={dkv}, W] with W >= 2, got shape {tuple(k_weight.shape)}")
    conv_width = k_weight.shape[1]
    _require_shape(v_weight, "v_weight", (dkv, conv_width))
    if k_cache.dim() != 3 or k_cache.shape[1:] != (conv_width - 1, dkv):
        raise ValueError(f"k_cache must be [slots, W-1={conv_width - 1}, dkv={dkv}], got shape "
                         f"{tuple(k_cache.shape)}")
    _require_shape(v_cache, "v_cache", tuple(k_cache.shape))
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(2) != 1:
            raise ValueError(f"{name} must be channel-contiguous (stride(2) == 1), got strides {tuple(t.stride())}")
    if k_cache.stride() != v_cache.stride():
        raise ValueError(f"k_cache and v_cache must share strides, got {tuple(k_cache.stride())} and "
                         f"{tuple(v_cache.stride())}")


def _check_token_metadata(num_tokens, cache_indices, cache_mask, loc, q_gamma, k_gamma, track_mask, track_indices,
                          log_scaling_tau) -> None:
    """The per-token arrays (one entry per token, contiguous) and the norm weights."""
    _require_tensor(cache_indices, "cache_indices")
    _require_dtype(cache_indices, "cache_indices", _INDEX_DTYPES)
    _require_shape(cache_indices, "cache_indices", (num_tokens,))
    _require_tensor(cache_mask, "cache_mask")
    _require_dtype(cache_mask, "cache_mask", torch.bool)
    # SGLang's decode passes the conv metadata's [B, 1, 1] mask (shaped to broadcast in its Triton conv); the
    # kernels read it as a flat array of T flags.
    if cache_mask.numel() != num_tokens:
        raise ValueError(f"cache_mask must have T={num_tokens} elements (shape ({num_tokens},) or "
                         f"({num_tokens}, 1, 1)), got shape {tuple(cache_mask.shape)}")
    _require_tensor(loc, "loc")
    _require_dtype(loc, "loc", _INDEX_DTYPES)
    _require_shape(loc, "loc", (num_tokens,))
    for name, g in (("q_gamma", q_gamma), ("k_gamma", k_gamma)):
        _require_tensor(g, name)
        _require_dtype(g, name, torch.bfloat16)
        _require_shape(g, name, (HEAD_DIM,))
    for name, t in (("cache_indices", cache_indices), ("cache_mask", cache_mask), ("loc", loc),
                    ("q_gamma", q_gamma), ("k_gamma", k_gamma)):
        if not t.is_contiguous():  # kernels index these as flat arrays
            raise ValueError(f"{name} must be contiguous, got strides {tuple(t.stride())}")
    if track_mask is not None:
        _require_tensor(track_mask, "track_mask")
        _require_dtype(track_mask, "track_mask", torch.bool)
        if track_mask.numel() != num_tokens:
            raise ValueError(f"track_mask must have {num_tokens} elements, got shape {tuple(track_mask.shape)}")
        if track_indices is None:
            raise ValueError("track_indices is required when track_mask is given")
        _require_tensor(track_indices, "track_indices")
        _require_dtype(track_indices, "track_indices", _INDEX_DTYPES)
        _require_shape(track_indices, "track_indices", (num_tokens,))
    if log_scaling_tau is not None:
        _require_tensor(log_scaling_tau, "log_scaling_tau")
        if not log_scaling_tau.is_floating_point():
            raise TypeError(f"log_scaling_tau must be a float tensor, got {log_scaling_tau.dtype}")
        if log_scaling_tau.numel() < num_tokens:
            raise ValueError(f"log_scaling_tau must have at least T={num_tokens} elements, got "
                             f"{log_scaling_tau.numel()}")


def _check_kv_buffers(k_buf, v_buf, dkv, do_store, mxfp8_quant) -> None:
    """The KV pool buffers: [slots, Hkv, 128] (or [slots, dkv]), rows contiguous, one slot count and stride, e4m3
    (MXFP8 mode) or bf16 where the prologue stores."""
    hkv = dkv // HEAD_DIM
    _require_tensor(k_buf, "k_buf")
    _require_tensor(v_buf, "v_buf")
    for name, buf in (("k_buf", k_buf), ("v_buf", v_buf)):
        if tuple(buf.shape[1:]) not in ((hkv, HEAD_DIM), (dkv,)):
            raise ValueError(f"{name} must be [slots, {hkv}, {HEAD_DIM}] or [slots, {dkv}], got shape "
                             f"{tuple(buf.shape)}")
        inner = buf.stride()[1:]
        if inner not in ((HEAD_DIM, 1), (1,)):
            raise ValueError(f"{name} rows must be contiguous, got strides {tuple(buf.stride())}")
    if k_buf.shape[0] != v_buf.shape[0] or k_buf.stride(0) != v_buf.stride(0):
        raise ValueError(f"k_buf and v_buf must have the same slots and slot stride, got shapes "
                         f"{tuple(k_buf.shape)}/{tuple(v_buf.shape)}, strides {k_buf.stride(0)}/{v_buf.stride(0)}")
    if do_store:
        want = mxfp8.DATA_DTYPE if mxfp8_quant else torch.bfloat16
        _require_dtype(k_buf, "k_buf", want)
        _require_dtype(v_buf, "v_buf", want)


# --------------------------------------------------------------------------------------------------------------
# The computation
# --------------------------------------------------------------------------------------------------------------

def packed_rows(qkvr: torch.Tensor, row_extent: int) -> torch.Tensor:
    """``[T, row_extent]`` view of the packed rows behind ``qkvr`` (which may be a narrower strided view)."""
    return torch.as_strided(qkvr, (qkvr.shape[0], row_extent), (qkvr.stride(0), 1), qkvr.storage_offset())


def short_conv(x: torch.Tensor, hist: torch.Tensor, cm: torch.Tensor, weight: torch.Tensor,
               use_silu: bool, use_residual: bool) -> torch.Tensor:
    """Depthwise causal conv of one token: ``x [T, C]``, ``hist [T, W-1, C]``, ``cm [T, 1]`` (0/1),
    ``weight [C, W]``, all float32. Accumulates in SGLang's order: taps oldest first, then the current token."""
    acc = torch.zeros_like(x)
    for w in range(hist.shape[1]):
        acc = acc + hist[:, w] * cm * weight[:, w]
    acc = acc + x * weight[:, -1]
    if use_silu:
        acc = acc / (1.0 + torch.exp(-acc))
    if use_residual:
        acc = acc + x
    return acc


def shifted_window(x: torch.Tensor, hist: torch.Tensor, has_history: torch.Tensor) -> torch.Tensor:
    """The conv window after this token: ``new[w] = cm ? old[w+1] : 0`` (w < W-2), ``new[W-2] = x``."""
    older = torch.where(has_history.view(-1, 1, 1), hist[:, 1:], torch.zeros_like(hist[:, 1:]))
    return torch.cat([older, x.unsqueeze(1)], dim=1)


def ieee_sqrt_f32(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded float32 sqrt. torch's own float32 sqrt on the CPU is not (torch 2.13: about 15% of
    inputs 1 ulp off); sqrt in float64 rounded once to float32 is exact-rounded (the double rounding is innocuous)."""
    return torch.sqrt(x.double()).float()


def canonical_bf16(x: torch.Tensor) -> torch.Tensor:
    """``x`` as bf16 with every NaN the canonical quiet NaN ``BF16_NAN`` (0x7FC0): torch's own conversion gives
    0x7FC0 or 0xFFFF depending on the code path, so the prologue fixes the bits of every NaN it writes."""
    x = x.to(torch.bfloat16)
    return torch.where(torch.isnan(x), torch.tensor(BF16_NAN, dtype=torch.int16).view(torch.bfloat16), x)


def head_rmsnorm(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """``bf16((x * inv) * gamma)`` per 128-channel head, ``x [..., 128]`` float32 holding bf16 values, with
    ``inv = 1 / sqrt(sum_sq / 128 + eps)`` in IEEE float32 (sqrt and division correctly rounded, as CUDA's
    ``sqrt.rn`` / ``div.rn``)."""
    sum_sq = (x.double() * x.double()).sum(dim=-1, keepdim=True).float()
    mean_sq = sum_sq / HEAD_DIM + eps  # float32; / 128 is exact
    inv = (1.0 / ieee_sqrt_f32(mean_sq).double()).float()  # correctly rounded float32 division
    return canonical_bf16((x * inv) * gamma.float())


def inkling_attn_prologue_decode(
    qkvr: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_indices: torch.Tensor,
    cache_mask: torch.Tensor,
    k_weight: torch.Tensor,
    v_weight: torch.Tensor,
    q_gamma: torch.Tensor,
    k_gamma: torch.Tensor,
    eps: float,
    loc: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    q_off: int,
    k_off: int,
    v_off: int,
    dq: int,
    dkv: int,
    activation: Optional[str] = None,
    use_residual: bool = True,
    track_mask: Optional[torch.Tensor] = None,
    track_indices: Optional[torch.Tensor] = None,
    do_store: bool = True,
    mxfp8_quant: bool = False,
    sfk: Optional[torch.Tensor] = None,
    sfv: Optional[torch.Tensor] = None,
    page_size: int = INTERLEAVED_PAGE_SIZE,
    log_scaling_tau: Optional[torch.Tensor] = None,
    *,
    quantize_q: Optional[bool] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Decode prologue (see the module docstring): conv + conv-cache shift (+ track) + q/k RMSNorm + tau
    (+ MXFP8 q quantization and K/V quantize-and-store, or the bf16 store). Updates ``k_cache``, ``v_cache``,
    ``k_buf``, ``v_buf`` (and ``sfk``, ``sfv``) in place; returns ``(q_out, k_out, v_out, q_scale)``.
    ``quantize_q`` (ours, not SGLang's): with ``mxfp8_quant``, False keeps q in bf16 (``q_scale`` None) while K/V
    are stored as MXFP8; default: ``mxfp8_quant``."""
    q_mx = check_quantize_q(quantize_q, mxfp8_quant)
    geo = validate_prologue_args(
        qkvr, k_cache, v_cache, cache_indices, cache_mask, k_weight, v_weight, q_gamma, k_gamma, eps, loc,
        k_buf, v_buf, q_off, k_off, v_off, dq, dkv, activation, use_residual, track_mask, track_indices,
        do_store, mxfp8_quant, sfk, sfv, page_size, log_scaling_tau)
    T, hq, hkv = geo.num_tokens, geo.num_q_heads, geo.num_kv_heads

    rows = packed_rows(qkvr, geo.row_extent).float()
    q = rows[:, q_off:q_off + dq].reshape(T, hq, HEAD_DIM)
    k_x = rows[:, k_off:k_off + dkv]
    v_x = rows[:, v_off:v_off + dkv]

    ci = cache_indices.long()
    real = ci != PAD_SLOT
    read_slot = torch.where(real, ci, torch.zeros_like(ci))  # padding rows read slot 0 (times cm)
    has_history = cache_mask.reshape(T)
    cm = has_history.float().unsqueeze(1)
    # Gathering copies: every tap is read before anything below writes the caches.
    k_hist = k_cache[read_slot].float()
    v_hist = v_cache[read_slot].float()

    k_conv = short_conv(k_x, k_hist, cm, k_weight.float(), geo.use_silu, use_residual)
    v_conv = short_conv(v_x, v_hist, cm, v_weight.float(), geo.use_silu, use_residual)

    # Conv-cache shift update (+ track copy), real rows only.
    k_new = canonical_bf16(shifted_window(k_x, k_hist, has_history))
    v_new = canonical_bf16(shifted_window(v_x, v_hist, has_history))
    k_cache[ci[real]] = k_new[real]
    v_cache[ci[real]] = v_new[real]
    if geo.do_track:
        tracked = track_mask.reshape(-1) & real
        dst = track_indices.long()[tracked]
        k_cache[dst] = k_new[tracked]
        v_cache[dst] = v_new[tracked]

    # RMSNorm with SGLang's rounding points; v only rounds.
    k_rounded = k_conv.to(torch.bfloat16).float().reshape(T, hkv, HEAD_DIM)
    k_n = head_rmsnorm(k_rounded, k_gamma, eps)  # [T, Hkv, 128] bf16
    v_n = canonical_bf16(v_conv).reshape(T, hkv, HEAD_DIM)
    q_n = head_rmsnorm(q, q_gamma, eps)  # [T, Hq, 128] bf16
    if log_scaling_tau is not None:
        tau = log_scaling_tau.reshape(-1)[:T].float().view(T, 1, 1)
        q_n = canonical_bf16(q_n.float() * tau)

    stored = real & (loc.long() >= 0) if do_store else torch.zeros_like(real)
    dst_slots = loc.long()[stored]
    q_out, q_scale = q_n.reshape(T, dq), None
    if q_mx:
        q_data, q_scales = mxfp8.quantize(q_n)  # [T, Hq, 128] e4m3, [T, Hq, 4] uint8
        q_out = q_data.reshape(T, dq)
        q_scale = q_scales.view(_E8M0) if _E8M0 is not None else q_scales
    if mxfp8_quant:
        k_data, k_scales = mxfp8.quantize(k_n[stored])
        v_data, v_scales = mxfp8.quantize(v_n[stored])
        k_buf.view(k_buf.shape[0], hkv, HEAD_DIM)[dst_slots] = k_data
        v_buf.view(v_buf.shape[0], hkv, HEAD_DIM)[dst_slots] = v_data
        geo.layout.scatter(sfk, dst_slots, k_scales)
        geo.layout.scatter(sfv, dst_slots, v_scales)
    else:
        if do_store:
            k_buf.view(k_buf.shape[0], hkv, HEAD_DIM)[dst_slots] = k_n[stored]
            v_buf.view(v_buf.shape[0], hkv, HEAD_DIM)[dst_slots] = v_n[stored]
    return q_out.contiguous(), k_n.reshape(T, dkv).contiguous(), v_n.reshape(T, dkv).contiguous(), q_scale


# --------------------------------------------------------------------------------------------------------------
# Tau and the relative bias (SGLang: attn.py compute_log_scaling_tau, RelLogitsProj)
# --------------------------------------------------------------------------------------------------------------

def log_scaling_tau(positions: torch.Tensor, n_floor: int, alpha: float) -> torch.Tensor:
    """Per-token log-length temperature, float32: ``1 + alpha * ln(max((pos + 1) / n_floor, 1))``
    (SGLang's ``compute_log_scaling_tau``; full-attention layers only)."""
    effective_n = (positions + 1).to(torch.float32)
    return 1.0 + alpha * torch.log(torch.clamp(effective_n / float(n_floor), min=1.0))


compute_log_scaling_tau = log_scaling_tau  # SGLang's name


def inkling_rel_logits(r: torch.Tensor, rel_proj: torch.Tensor, tau: Optional[torch.Tensor] = None,
                       prescale_tau: bool = True) -> torch.Tensor:
    """Relative-position logits ``[T, Hq, rel_extent]`` from ``r [T, Hq, d_rel]`` and ``rel_proj
    [d_rel, rel_extent]``, in r's dtype. With ``tau [T]``: SGLang's default folds it into r first
    (``bf16(bf16(r * tau) @ proj)``, ``SGLANG_OPT_USE_INKLING_FUSED_LOG_TAU``); ``prescale_tau=False`` is the legacy
    post-scale ``bf16(bf16(r @ proj) * tau)``."""
    if r.dim() != 3 or rel_proj.dim() != 2 or r.shape[-1] != rel_proj.shape[0]:
        raise ValueError(f"r must be [T, Hq, d_rel] and rel_proj [d_rel, rel_extent], got shapes "
                         f"{tuple(r.shape)} and {tuple(rel_proj.shape)}")
    if tau is not None:
        tau = tau.reshape(-1).float()
        if tau.numel() != r.shape[0]:
            raise ValueError(f"tau must have T={r.shape[0]} elements, got {tau.numel()}")
        tau = tau.view(-1, 1, 1)
    if tau is not None and prescale_tau:
        r = (r.float() * tau).to(r.dtype)
    out = torch.einsum("thd,de->the", r.float(), rel_proj.float()).to(r.dtype)
    if tau is not None and not prescale_tau:
        out = (out.float() * tau).to(r.dtype)
    return out
