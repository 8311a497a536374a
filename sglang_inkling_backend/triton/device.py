"""Device helpers shared by the Triton attention kernels (decode tiles, decode blocks, extend): UE8M0 scale
decoding, the one Triton scale-offset function, tile loads and dequantization, and the logit pipeline
(scale, relative bias, soft cap, window mask) in base 2.

Scales are made from the UE8M0 byte's exponent bits (``byte << 23`` as float32 is ``2**(byte - 127)``), not
``exp2``, a per-element transcendental.
"""

from __future__ import annotations

import triton
import triton.language as tl

# KV formats (constexpr in the kernels)
KV_FLOAT = 0  # bf16 / fp16 / fp32 buffers
KV_FP8 = 1  # float8_e4m3fn with a per-tensor k_scale / v_scale
KV_MXFP8 = 2  # float8_e4m3fn with a UE8M0 scale per 32 channels

try:  # Grid Dependency Control (programmatic dependent launch, sm_90+): Triton's CUDA extras (3.4 and later)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # plan.pdl_status then says why the merge cannot launch early
    gdc_launch_dependents = gdc_wait = None



@triton.jit
def log2e():
    """log2(e): the kernels' softmax runs in base 2 (exp2). A function, not a constexpr global: the interpreter
    cannot multiply a tensor by a global constexpr (Triton 3.9), and the call folds to the same constant."""
    return 1.4426950408889634


@triton.jit
def e4m3_bytes_to_float(x):
    """e4m3fn bytes (uint8) as float32, exactly, with integer operations: for GPUs without e4m3 conversions (sm_80,
    sm_86), where an 8-bit pool reaches the kernels as bytes. Sign and the 7 exponent-mantissa bits go to fp16's
    places (``s << 15 | em << 7``: fp16 exponent field e, mantissa m << 7), which is the e4m3 value times 2**-8 for
    normals and subnormals alike; times 256 in float32 is exact. 0x7F / 0xFF are e4m3's NaNs."""
    u = x.to(tl.uint16)
    half = (((u & 0x80) << 8) | ((u & 0x7F) << 7)).to(tl.float16, bitcast=True)
    return tl.where((u & 0x7F) == 0x7F, float("nan"), half.to(tl.float32) * 256.0)


@triton.jit
def as_compute(x, DTYPE: tl.constexpr):
    """A loaded KV tile in DTYPE: e4m3 bytes (uint8, see ``e4m3_bytes_to_float``) decoded with integer operations,
    anything else (float8e4nv, bf16, fp16, fp32) by conversion."""
    if x.dtype == tl.uint8:
        return e4m3_bytes_to_float(x).to(DTYPE)
    return x.to(DTYPE)


@triton.jit
def e8m0_to_float(byte):
    """UE8M0 byte -> 2**(byte - 127) as float32, from the exponent bits (exact for bytes 1..254)."""
    return (byte.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def scale_offsets(slot0, offs, h, HKV: tl.constexpr, NB: tl.constexpr, PAGE: tl.constexpr,
                  INTERLEAVED: tl.constexpr):
    """Offset of the first of the ``NB`` scale bytes of (slot ``slot0 + offs``, head ``h``) in an MXFP8 pool's
    scale buffer: ``ScaleLayout``'s formula (``scale_layout.py``; tests/triton_tests/test_triton_scale_offsets.py checks they
    agree). The one Triton copy of it: decode, extend, the K/V store and the prologue all call it.

    ``slot0`` is int64 (a vector of slots with ``offs = 0``, or one page-aligned tile's first slot with
    ``offs = tl.arange(0, BLOCK_N)``: then the result is a scalar base plus 32-bit offsets, the same for every
    tile). Interleaved (page 128): (page, head) atoms of ``[32, PAGE // 32, NB]`` bytes, and ``slot0 % PAGE + offs``
    must stay below PAGE (a tile inside one page). Flat: ``[slots, HKV, NB]``."""
    if INTERLEAVED:
        po = (slot0 % PAGE).to(tl.int32) + offs
        return ((slot0 // PAGE) * HKV + h) * (PAGE * NB) + ((po % 32) * (PAGE // 32) + po // 32) * NB
    else:
        return (slot0 * HKV + h) * NB + offs * (HKV * NB)


@triton.jit
def load_raw_tile(buf_ptr, sf_ptr, slots, mask_n, h, stride_slot, stride_head,
                  HKV: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr,
                  PAGE: tl.constexpr, INTERLEAVED: tl.constexpr):
    """The stored bytes of rows ``slots`` of head ``h``: ``[BLOCK_N, D]`` in the pool's dtype and, for MXFP8, the
    scale bytes ``[BLOCK_N, D // 32]`` (a zero placeholder otherwise). Masked rows read as 0 (scale byte 127)."""
    NB: tl.constexpr = D // 32
    rows = slots * stride_slot + h * stride_head
    x = tl.load(buf_ptr + rows[:, None] + tl.arange(0, D)[None, :], mask=mask_n[:, None], other=0.0)
    if KV_FORMAT == 2:
        sf = tl.load(sf_ptr + scale_offsets(slots, 0, h, HKV, NB, PAGE, INTERLEAVED)[:, None]
                     + tl.arange(0, NB)[None, :], mask=mask_n[:, None], other=127)
    else:
        sf = tl.zeros([BLOCK_N, NB], tl.uint8)
    return x, sf


@triton.jit
def load_raw_page_tile(buf_ptr, sf_ptr, slot0, offs_t, mask_n, h, stride_slot, stride_head,
                       HKV: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr,
                       PAGE: tl.constexpr, INTERLEAVED: tl.constexpr):
    """``load_raw_tile`` for the contiguous slots ``slot0 + offs_t`` (one page-aligned tile): the addresses are a
    scalar base plus 32-bit offsets that are the same for every tile."""
    NB: tl.constexpr = D // 32
    base = buf_ptr + (slot0 * stride_slot + h * stride_head)
    x = tl.load(base + (offs_t * stride_slot)[:, None] + tl.arange(0, D)[None, :], mask=mask_n[:, None], other=0.0)
    if KV_FORMAT == 2:
        sf = tl.load(sf_ptr + scale_offsets(slot0, offs_t, h, HKV, NB, PAGE, INTERLEAVED)[:, None]
                     + tl.arange(0, NB)[None, :], mask=mask_n[:, None], other=127)
    else:
        sf = tl.zeros([BLOCK_N, NB], tl.uint8)
    return x, sf


@triton.jit
def dequant_tile(x, sf, D: tl.constexpr, BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr,
                 DOT_DTYPE: tl.constexpr):
    """A raw tile as DOT_DTYPE; MXFP8 blocks times their scale (a power of two: exact). The per-tensor fp8 scale is
    NOT applied here (the caller folds it into the logits / the output)."""
    if KV_FORMAT == 2:
        NB: tl.constexpr = D // 32
        x3 = tl.reshape(as_compute(x, tl.float32), (BLOCK_N, NB, 32))
        x = tl.reshape(x3 * e8m0_to_float(sf)[:, :, None], (BLOCK_N, D))
    return as_compute(x, DOT_DTYPE)


@triton.jit
def dequant_tile_relative(x, sf, mask_n, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """An MXFP8 tile as fp16 relative to its largest scale, and that scale: ``(tile16, 2**(e_max - 127))``.

    e4m3 -> fp16 is one packed conversion per two elements and exact; each 32-block is then multiplied by
    ``2**(e - e_max) <= 1`` (exact while the tile's block exponents span at most 15, a factor of 32768; beyond that
    the smallest elements of the far-smaller blocks round in fp16's subnormal range, an absolute error under
    2**-24 of the tile's largest block scale). The common factor ``2**(e_max - 127)`` is applied to the dot's
    result, a scalar per tile. This replaces a float32 multiply per element (and its register footprint)."""
    NB: tl.constexpr = D // 32
    sfi = tl.where(mask_n[:, None], sf.to(tl.int32), 0)
    e_max = tl.max(tl.max(sfi, 1), 0)
    rel = tl.maximum(sfi - e_max, -126)
    factor = ((rel + 127) << 23).to(tl.float32, bitcast=True).to(tl.float16)  # 0 below fp16's 2**-24
    x3 = tl.reshape(as_compute(x, tl.float16), (BLOCK_N, NB, 32)) * factor[:, :, None]
    return tl.reshape(x3, (BLOCK_N, D)), (e_max << 23).to(tl.float32, bitcast=True)


@triton.jit
def load_kv_tile(buf_ptr, sf_ptr, slots, mask_n, h, stride_slot, stride_head,
                 HKV: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr,
                 PAGE: tl.constexpr, INTERLEAVED: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Rows ``slots`` of head ``h`` as a dequantized ``[BLOCK_N, D]`` tile in DOT_DTYPE (masked rows are 0)."""
    x, sf = load_raw_tile(buf_ptr, sf_ptr, slots, mask_n, h, stride_slot, stride_head, HKV, D, BLOCK_N, KV_FORMAT,
                          PAGE, INTERLEAVED)
    return dequant_tile(x, sf, D, BLOCK_N, KV_FORMAT, DOT_DTYPE)


@triton.jit
def soft_cap(x, cap):
    """cap * tanh(x / cap), tanh through exp2 (portable to the interpreter and AMD)."""
    y = x / cap
    t = tl.exp2(-2.0 * log2e() * tl.abs(y))
    th = (1.0 - t) / (1.0 + t)
    return cap * tl.where(y < 0, -th, th)


@triton.jit
def scale_logits(qk, qk_scale, HAS_CAP: tl.constexpr):
    """Raw q.k times ``qk_scale`` (which includes log2(e)): base-2 logits, or natural ones when a cap will apply (the
    cap is on the natural logit, after the bias)."""
    if HAS_CAP:
        return qk * (qk_scale / log2e())
    return qk * qk_scale


@triton.jit
def add_logit_bias(qk, bias, HAS_CAP: tl.constexpr):
    """``scale_logits``' logits plus a natural-unit bias (float32)."""
    if HAS_CAP:
        return qk + bias
    return qk + bias * log2e()


@triton.jit
def cap_logits(qk, logit_cap, HAS_CAP: tl.constexpr):
    """``scale_logits``' logits (bias added) as base-2 logits, through the soft cap when there is one."""
    if HAS_CAP:
        return soft_cap(qk, logit_cap) * log2e()
    return qk


@triton.jit
def decode_logits(qk, qk_scale, start, offs_n, mask_n, q_pos, bias_row_ptr, heads, mask_g, stride_rb_head,
                  rel_extent, logit_cap, BLOCK_N: tl.constexpr, HAS_REL_BIAS: tl.constexpr, HAS_CAP: tl.constexpr,
                  KEYS_FIRST: tl.constexpr = False):
    """A decode tile's raw q.k -> base-2 logits: times ``qk_scale`` (which includes log2(e)), plus the relative bias
    within ``rel_extent`` of the query (``bias_row_ptr``: this request's ``[Hq, rel_extent]`` row), the logit cap
    on the natural-base logit after the bias, and -inf for keys outside ``mask_n``. ``qk`` is ``[heads, keys]``,
    or ``[keys, heads]`` with ``KEYS_FIRST``."""
    if KEYS_FIRST:
        key_mask = mask_n[:, None]
    else:
        key_mask = mask_n[None, :]
    qk = scale_logits(qk, qk_scale, HAS_CAP)
    if HAS_REL_BIAS:
        dist = q_pos - offs_n
        if start + BLOCK_N - 1 > q_pos - rel_extent:
            in_reach = mask_n & (dist < rel_extent)
            if KEYS_FIRST:
                bias = tl.load(bias_row_ptr + heads[None, :] * stride_rb_head + dist[:, None],
                               mask=mask_g[None, :] & in_reach[:, None], other=0.0).to(tl.float32)
            else:
                bias = tl.load(bias_row_ptr + heads[:, None] * stride_rb_head + dist[None, :],
                               mask=mask_g[:, None] & in_reach[None, :], other=0.0).to(tl.float32)
            qk = add_logit_bias(qk, bias, HAS_CAP)
    qk = cap_logits(qk, logit_cap, HAS_CAP)
    return tl.where(key_mask, qk, float("-inf"))


@triton.jit
def request_split_len(n_keys, split_len, num_splits, BLOCK_N: tl.constexpr):
    """One request's split length: its ``n_keys`` keys spread over the plan's ``num_splits`` splits in whole tiles,
    at most the plan's ``split_len``. The plan sizes ``split_len`` for its longest request (under CUDA graphs, the
    context limit); sizing each request's splits by its own keys keeps every split busy on shorter requests
    instead of leaving one split to do all of a short request's work."""
    per = (n_keys + num_splits - 1) // num_splits
    per = ((per + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    return tl.minimum(tl.maximum(per, BLOCK_N), split_len)


@triton.jit
def split_bounds(lens_ptr, b, split, split_len, num_splits, window, BLOCK_N: tl.constexpr,
                 HAS_WINDOW: tl.constexpr, PAGE_ALIGNED: tl.constexpr, PAGE_TABLE: tl.constexpr):
    """Request ``b``'s first rail entry, its key count, the first key its window sees, and split ``split``'s key
    range ``[tok_begin, tok_end)`` (empty when the split has no keys). ``lens_ptr``: ``kv_indptr`` (CSR), or
    ``seq_lens`` with ``PAGE_TABLE`` (then the first rail entry is 0: positions index the page table's row).
    ``PAGE_ALIGNED``: splits start at multiples of BLOCK_N from the tile holding ``first`` (whole pages: a tile
    never crosses a page, and no page entirely before the window is read; keys before ``first`` are masked by the
    caller). Split lengths: ``request_split_len`` (the merge kernel computes the same)."""
    if PAGE_TABLE:
        kv_start = tl.zeros([], tl.int64)
        seq_len = tl.load(lens_ptr + b).to(tl.int32)
    else:
        kv_start = tl.load(lens_ptr + b).to(tl.int64)
        seq_len = (tl.load(lens_ptr + b + 1) - tl.load(lens_ptr + b)).to(tl.int32)
    first = 0
    if HAS_WINDOW:
        first = tl.maximum(seq_len - window, 0)
    if PAGE_ALIGNED:
        start = (first // BLOCK_N) * BLOCK_N
    else:
        start = first
    length = request_split_len(seq_len - start, split_len, num_splits, BLOCK_N)
    tok_begin = start + split * length
    tok_end = tl.minimum(tok_begin + length, seq_len)
    return kv_start, seq_len, first, tok_begin, tok_end


@triton.jit
def page_tile_first_slot(row_ptr, start, PAGE_TABLE: tl.constexpr, KV_PAGE: tl.constexpr):
    """The first slot of the page-aligned tile at key ``start``. ``PAGE_TABLE``: ``row_ptr`` is the request's page
    table row (page ids, pages of ``KV_PAGE`` slots); otherwise the request's first CSR entry (whole pages: the
    key's own slot)."""
    if PAGE_TABLE:
        return tl.load(row_ptr + start // KV_PAGE).to(tl.int64) * KV_PAGE + start % KV_PAGE
    else:
        return tl.load(row_ptr + start).to(tl.int64)


@triton.jit
def q_power_of_two_norm(q_max, qk_scale):
    """q * 2**(127 - E) has |q| < 2 (E: the biased exponent of max|q|): exact in fp16 for bf16 q down to 2**-14 of
    its largest element. Returns that factor and ``qk_scale`` times 2**(E - 127), which moves into the logits."""
    q_exp = (q_max.to(tl.int32, bitcast=True) >> 23) & 0xFF
    return ((254 - q_exp) << 23).to(tl.float32, bitcast=True), qk_scale * (q_exp << 23).to(tl.float32, bitcast=True)


@triton.jit
def fold_sinks(m_i, l_i, sinks_ptr, heads, mask_g):
    """Add each head's sink logit to the softmax state: returns (the factor for the output so far, l_i, m_i)."""
    sink = tl.load(sinks_ptr + heads, mask=mask_g, other=0.0).to(tl.float32) * log2e()
    m_fin = tl.maximum(m_i, sink)
    scale_old = tl.exp2(m_i - m_fin)
    return scale_old, l_i * scale_old + tl.exp2(sink - m_fin), m_fin
