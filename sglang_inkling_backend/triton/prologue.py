"""Fused Inkling decode prologue in Triton: one launch does the k/v short conv, the conv-cache shift update (+ track
slot), the q/k RMSNorm, tau, and either the bf16 K/V store or (MXFP8) the q quantization plus the K/V
quantize-and-store into the interleaved pool.

Same signature, semantics and argument checks as SGLang's ``inkling_attn_prologue_decode`` and as the torch
reference (``sglang_inkling_backend.reference.prologue``, whose ``validate_prologue_args`` runs first: one place
for the checks). The result is bit-identical to the reference, because every rounding is done the same way:

- bf16 rounding and the e4m3 encoding (``encode.py``) are integer bit operations (round-to-nearest-even), never
  a dtype cast: the Triton interpreter's casts truncate (bf16) or mis-round ties (e4m3), and this keeps CPU tests
  byte-exact;
- the MXFP8 exponent comes from the float's exponent and mantissa bits (exact ``ceil(log2(amax / 448))``) and the
  scaling multiplies by an exact power of two;
- the RMSNorm sum of squares is accumulated in float64 (exact for bf16 inputs, so the reduction order does not
  matter), ``1 / sqrt`` uses IEEE ``sqrt_rn`` / ``div_rn``, and the conv's products of bf16 values are exact
  in float32 and summed in the reference's order;
- every bf16 store goes through its bits (``_bf16_bits``), a NaN as the canonical ``0x7FC0`` like the reference.
The one exception is ``activation="silu"`` (``exp`` differs between libraries): within float32 rounding there.

Grid: ``(T, ceil(Hq / Q_HEADS) + Hkv)``: per token, some programs norm (and quantize) groups of q heads, and one
program per KV head does k and v (conv, cache shift, norm, store).

Value checks (slot ranges, distinct slots) need a device-to-host copy: they run by default and are skipped during
CUDA-graph capture, where they cannot run. The kernel also masks every slot against its buffer's size, so even
unchecked input never writes out of bounds (an out-of-range slot is skipped, not raised, in that case only).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..checks import stream_capturing
from ..reference.prologue import HEAD_DIM, check_quantize_q, validate_prologue_args
from ..scale_layout import INTERLEAVED_PAGE_SIZE
from .device import scale_offsets
from .encode import mxfp8_encode_blocks

_E8M0 = getattr(torch, "float8_e8m0fnu", None)


# --------------------------------------------------------------------------------------------------------------
# Exact rounding helpers (integer bit operations)
# --------------------------------------------------------------------------------------------------------------

# Reductions go through tl.reduce with this module's combine functions, and zeros through tl.full, not tl.sum /
# tl.max / tl.zeros: those are @jit functions of triton.language, which stay in compiled mode when triton was
# imported before TRITON_INTERPRET was set, while these follow this module (reloading it, after .device and
# .encode, interpreted is enough).
@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _lane_mask(cond, lanes):
    """A scalar condition as a mask shaped like ``lanes`` (int offsets). Written through int32 because the
    interpreter mistypes ``block_bool & scalar_bool``."""
    return (lanes * 0 + cond.to(tl.int32)) != 0


@triton.jit
def _round_to_bf16(x):
    """float32 -> float32 holding the round-to-nearest-even bf16 value (NaN kept)."""
    u = x.to(tl.uint32, bitcast=True)
    r = u + 0x7FFF + ((u >> 16) & 1)
    y = ((r >> 16) << 16).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, y)


@triton.jit
def _bf16_bits(x):
    """float32 holding a bf16 value -> that bf16, from its top 16 bits; any NaN becomes the canonical quiet NaN
    0x7FC0 (``reference.prologue.BF16_NAN``: a conversion's NaN bits differ between devices and libraries)."""
    u = x.to(tl.uint32, bitcast=True)
    u = tl.where(x != x, 0x7FC00000, u)
    return (u >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _mxfp8_quantize(x, ROWS: tl.constexpr):
    """``x [ROWS, 128]`` float32 -> (e4m3 bytes [ROWS, 128], UE8M0 bytes [ROWS * 4]) per 32-channel block, by the
    one Triton MXFP8 encoder (``encode.mxfp8_encode_blocks``: ``sglang_inkling_backend.mxfp8.quantize`` exactly)."""
    codes, scales = mxfp8_encode_blocks(tl.reshape(x, (ROWS * 4, 32)))
    return tl.reshape(codes, (ROWS, 128)), scales


@triton.jit
def _head_rmsnorm(x, gamma, eps):
    """``x [R, 128]`` float32 (bf16 values) -> float32 holding ``bf16((x * inv) * gamma)``."""
    x64 = x.to(tl.float64)
    sum_sq = tl.reduce(x64 * x64, 1, _add).to(tl.float32)
    one = tl.full(sum_sq.shape, 1.0, tl.float32)
    inv = tl.div_rn(one, tl.sqrt_rn(sum_sq * 0.0078125 + eps))  # / 128 is exact as * 2^-7
    return _round_to_bf16((x * inv[:, None]) * gamma[None, :])


@triton.jit
def _conv_and_shift(row_ptr, cache_ptr, weight_ptr, c, slot, cache_stride_slot, cache_stride_w,
                    weight_stride_c, weight_stride_w, has_history, is_real, do_track, track_slot,
                    W: tl.constexpr, USE_SILU: tl.constexpr, USE_RESIDUAL: tl.constexpr, DO_TRACK: tl.constexpr):
    """Conv of one KV head's 128 channels of one token, then the shift update of its conv-cache window.
    Every tensor here is 1-D [128] in one layout, so each thread rewrites only cache elements it read itself
    (the reads of a row precede its write in program order: the read-all-taps-before-writing rule)."""
    x = tl.load(row_ptr + c).to(tl.float32)
    cm = has_history.to(tl.float32)
    write = _lane_mask(is_real, c)
    write_track = _lane_mask(do_track, c)
    base = cache_ptr + slot * cache_stride_slot + c
    acc = tl.full([128], 0.0, tl.float32)
    for w in tl.static_range(W - 1):
        tap = tl.load(base + w * cache_stride_w).to(tl.float32)
        weight = tl.load(weight_ptr + c * weight_stride_c + w * weight_stride_w).to(tl.float32)
        acc += tap * cm * weight
    acc += x * tl.load(weight_ptr + c * weight_stride_c + (W - 1) * weight_stride_w).to(tl.float32)
    if USE_SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    if USE_RESIDUAL:
        acc += x
    # Shift update: new[w] = cm ? old[w + 1] : 0 (w < W - 2), new[W - 2] = x; real rows only (+ track slot).
    for w in tl.static_range(W - 1):
        if w < W - 2:
            newer = tl.load(base + (w + 1) * cache_stride_w).to(tl.float32)
            new = _bf16_bits(tl.where(has_history, newer, 0.0))
        else:
            new = _bf16_bits(x)  # exact: x came from bf16
        tl.store(base + w * cache_stride_w, new, mask=write)
        if DO_TRACK:
            tl.store(cache_ptr + track_slot * cache_stride_slot + c + w * cache_stride_w, new, mask=write_track)
    return acc


@triton.jit
def _inkling_prologue_decode_kernel(
    qkvr_ptr, row_stride, q_off, k_off, v_off,
    k_cache_ptr, v_cache_ptr, cache_stride_slot, cache_stride_w,
    cache_indices_ptr, cache_mask_ptr,
    k_weight_ptr, v_weight_ptr, weight_stride_c, weight_stride_w,
    q_gamma_ptr, k_gamma_ptr, tau_ptr, eps,
    q_out_ptr, k_out_ptr, v_out_ptr, sfq_ptr,
    loc_ptr, k_buf_ptr, v_buf_ptr, kv_slot_stride, sfk_ptr, sfv_ptr,
    track_mask_ptr, track_indices_ptr, track_stride, num_cache_slots, num_kv_slots,
    HQ: tl.constexpr, HKV: tl.constexpr, Q_HEADS: tl.constexpr, NUM_Q_PROGRAMS: tl.constexpr,
    W: tl.constexpr, PAGE: tl.constexpr,
    USE_SILU: tl.constexpr, USE_RESIDUAL: tl.constexpr, HAS_TAU: tl.constexpr, DO_TRACK: tl.constexpr,
    DO_STORE: tl.constexpr, MXFP8: tl.constexpr, Q_MXFP8: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    role = tl.program_id(1)
    d = tl.arange(0, 128)
    row_ptr = qkvr_ptr + t * row_stride

    if role < NUM_Q_PROGRAMS:
        # ---- q: per-head RMSNorm (+ tau) (+ MXFP8 quantization) ----
        heads = role * Q_HEADS + tl.arange(0, Q_HEADS)
        head_ok = heads < HQ
        offs = heads[:, None] * 128 + d[None, :]
        x = tl.load(row_ptr + q_off + offs, mask=head_ok[:, None], other=0.0).to(tl.float32)
        gamma = tl.load(q_gamma_ptr + d).to(tl.float32)
        q = _head_rmsnorm(x, gamma, eps)
        if HAS_TAU:
            q = _round_to_bf16(q * tl.load(tau_ptr + t))
        if Q_MXFP8:
            codes, scales = _mxfp8_quantize(q, Q_HEADS)
            tl.store(q_out_ptr + t * (HQ * 128) + offs, codes, mask=head_ok[:, None])
            blocks = role * Q_HEADS * 4 + tl.arange(0, Q_HEADS * 4)
            tl.store(sfq_ptr + t * (HQ * 4) + blocks, scales, mask=blocks < HQ * 4)
        else:
            tl.store(q_out_ptr + t * (HQ * 128) + offs, _bf16_bits(q), mask=head_ok[:, None])
    else:
        # ---- one KV head: k and v conv + cache shift (+ track), k RMSNorm, store ----
        kv_head = role - NUM_Q_PROGRAMS
        c = kv_head * 128 + d
        ci = tl.load(cache_indices_ptr + t).to(tl.int64)
        is_real = (ci >= 0) & (ci < num_cache_slots)  # -1 is padding; the bound only matters unchecked
        slot = tl.where(is_real, ci, 0)  # padding rows read slot 0 (times cm) and write nothing
        has_history = tl.load(cache_mask_ptr + t) != 0
        do_track = is_real
        track_slot = slot
        if DO_TRACK:
            track_slot = tl.load(track_indices_ptr + t * track_stride).to(tl.int64)
            tracked = tl.load(track_mask_ptr + t) != 0
            do_track = is_real & tracked & (track_slot >= 0) & (track_slot < num_cache_slots)
            track_slot = tl.where(do_track, track_slot, 0)
        k_acc = _conv_and_shift(row_ptr + k_off, k_cache_ptr, k_weight_ptr, c, slot, cache_stride_slot,
                                cache_stride_w, weight_stride_c, weight_stride_w, has_history, is_real,
                                do_track, track_slot, W, USE_SILU, USE_RESIDUAL, DO_TRACK)
        v_acc = _conv_and_shift(row_ptr + v_off, v_cache_ptr, v_weight_ptr, c, slot, cache_stride_slot,
                                cache_stride_w, weight_stride_c, weight_stride_w, has_history, is_real,
                                do_track, track_slot, W, USE_SILU, USE_RESIDUAL, DO_TRACK)
        k_gamma = tl.load(k_gamma_ptr + d).to(tl.float32)
        k = _head_rmsnorm(tl.reshape(_round_to_bf16(k_acc), (1, 128)), k_gamma, eps)  # [1, 128]
        v = tl.reshape(_round_to_bf16(v_acc), (1, 128))
        out_offs = t * (HKV * 128) + kv_head * 128 + d[None, :]
        tl.store(k_out_ptr + out_offs, _bf16_bits(k))
        tl.store(v_out_ptr + out_offs, _bf16_bits(v))
        if DO_STORE:
            kv_slot = tl.load(loc_ptr + t).to(tl.int64)
            store_row = is_real & (kv_slot >= 0) & (kv_slot < num_kv_slots)
            kv_slot = tl.where(store_row, kv_slot, 0)
            dst = kv_slot * kv_slot_stride + kv_head * 128 + d[None, :]
            store_mask = _lane_mask(store_row, d[None, :])
            if MXFP8:
                k_codes, k_scales = _mxfp8_quantize(k, 1)
                v_codes, v_scales = _mxfp8_quantize(v, 1)
                tl.store(k_buf_ptr + dst, k_codes, mask=store_mask)
                tl.store(v_buf_ptr + dst, v_codes, mask=store_mask)
                # SGLang's interleaved layout: sf[page, h, po % 32, po // 32, block]
                block = tl.arange(0, 4)
                sf = scale_offsets(kv_slot, 0, kv_head, HKV, 4, PAGE, True) + block
                tl.store(sfk_ptr + sf, k_scales, mask=_lane_mask(store_row, block))
                tl.store(sfv_ptr + sf, v_scales, mask=_lane_mask(store_row, block))
            else:
                tl.store(k_buf_ptr + dst, _bf16_bits(k), mask=store_mask)
                tl.store(v_buf_ptr + dst, _bf16_bits(v), mask=store_mask)


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
    check_values: Optional[bool] = None,
    quantize_q: Optional[bool] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """SGLang's ``inkling_attn_prologue_decode`` in one Triton launch (see the module docstring).
    ``check_values`` (ours, keyword-only): check slot values before launching; default: yes, except during
    CUDA-graph capture. ``quantize_q`` (ours): with ``mxfp8_quant``, False keeps q in bf16 (no q scale) while K/V
    are stored as MXFP8; default: ``mxfp8_quant`` (SGLang's contract)."""
    q_mx = check_quantize_q(quantize_q, mxfp8_quant)
    if check_values is None:
        check_values = not stream_capturing(qkvr.device if isinstance(qkvr, torch.Tensor) else torch.device("cpu"))
    geo = validate_prologue_args(
        qkvr, k_cache, v_cache, cache_indices, cache_mask, k_weight, v_weight, q_gamma, k_gamma, eps, loc,
        k_buf, v_buf, q_off, k_off, v_off, dq, dkv, activation, use_residual, track_mask, track_indices,
        do_store, mxfp8_quant, sfk, sfv, page_size, log_scaling_tau, check_values=check_values)
    T, hq, hkv = geo.num_tokens, geo.num_q_heads, geo.num_kv_heads
    device = qkvr.device
    k_out = torch.empty(T, dkv, dtype=torch.bfloat16, device=device)
    v_out = torch.empty(T, dkv, dtype=torch.bfloat16, device=device)
    if q_mx:
        q_out = torch.empty(T, dq, dtype=torch.float8_e4m3fn, device=device)
        sfq = torch.empty(T, hq, HEAD_DIM // 32, dtype=torch.uint8, device=device)
        q_out_arg = q_out.view(torch.uint8)
    else:
        q_out = torch.empty(T, dq, dtype=torch.bfloat16, device=device)
        sfq = None
        q_out_arg = q_out
    if mxfp8_quant:
        k_buf_arg, v_buf_arg = k_buf.view(torch.uint8), v_buf.view(torch.uint8)
        sfk_arg, sfv_arg = sfk.view(torch.uint8), sfv.view(torch.uint8)
    else:
        k_buf_arg, v_buf_arg = k_buf, v_buf
        sfk_arg = sfv_arg = q_out  # unused (MXFP8=False)
    q_scale = sfq.view(_E8M0) if sfq is not None and _E8M0 is not None else sfq  # SGLang returns e8m0
    if T == 0:
        return q_out, k_out, v_out, q_scale

    # Bool tensors travel as bytes; tau as float32.
    cache_mask_arg = cache_mask.view(torch.uint8)
    tau = log_scaling_tau.reshape(-1).float().contiguous() if log_scaling_tau is not None else k_out
    if geo.do_track:
        track_mask_arg = track_mask.reshape(-1).view(torch.uint8)
        track_indices_arg, track_stride = track_indices, track_indices.stride(0)
    else:
        track_mask_arg, track_indices_arg, track_stride = cache_mask_arg, loc, 0
    q_heads = min(4, triton.next_power_of_2(hq))
    num_q_programs = triton.cdiv(hq, q_heads)
    grid = (T, num_q_programs + hkv)
    _inkling_prologue_decode_kernel[grid](
        qkvr, qkvr.stride(0), q_off, k_off, v_off,
        k_cache, v_cache, k_cache.stride(0), k_cache.stride(1),
        cache_indices, cache_mask_arg,
        k_weight, v_weight, k_weight.stride(0), k_weight.stride(1),
        q_gamma, k_gamma, tau, float(eps),
        q_out_arg, k_out, v_out, sfq if sfq is not None else k_out,
        loc, k_buf_arg, v_buf_arg, k_buf.stride(0), sfk_arg, sfv_arg,
        track_mask_arg, track_indices_arg, track_stride, k_cache.shape[0],
        geo.layout.num_slots if geo.layout is not None else k_buf.shape[0],
        HQ=hq, HKV=hkv, Q_HEADS=q_heads, NUM_Q_PROGRAMS=num_q_programs, W=geo.conv_width, PAGE=page_size,
        USE_SILU=geo.use_silu, USE_RESIDUAL=bool(use_residual), HAS_TAU=log_scaling_tau is not None,
        DO_TRACK=geo.do_track, DO_STORE=bool(do_store), MXFP8=bool(mxfp8_quant), Q_MXFP8=q_mx,
        num_warps=4,
    )
    return q_out, k_out, v_out, q_scale
