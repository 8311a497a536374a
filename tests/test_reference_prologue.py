"""The torch reference of the Inkling decode prologue: hand-computed conv/shift/track cases, the RMSNorm rounding
points, tau, MXFP8 bytes at their layout positions, padding rows, and every argument error (buffers untouched)."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_inkling_backend import mxfp8
from sglang_inkling_backend.reference.prologue import (
    inkling_attn_prologue_decode,
    inkling_rel_logits,
    log_scaling_tau,
)
from sglang_inkling_backend.scale_layout import ScaleLayout

D = 128
BF16_EPS = 2.0 ** -7  # bf16 spacing just above 1.0


def make_case(T=4, hq=2, hkv=1, W=4, cache_slots=8, kv_slots=256, mxfp8_mode=False, seed=0, d_rel=16):
    """Random inputs in SGLang's calling convention: qkvr is the q slice of the packed row (a strided view)."""
    g = torch.Generator().manual_seed(seed)
    dq, dkv = hq * D, hkv * D
    packed = torch.randn(T, dq + 2 * dkv + hq * d_rel, generator=g).bfloat16()
    kv_dtype = torch.float8_e4m3fn if mxfp8_mode else torch.bfloat16
    args = dict(
        qkvr=packed[:, :dq],
        k_cache=torch.randn(cache_slots, W - 1, dkv, generator=g).bfloat16(),
        v_cache=torch.randn(cache_slots, W - 1, dkv, generator=g).bfloat16(),
        cache_indices=torch.arange(1, T + 1, dtype=torch.int32),
        cache_mask=torch.ones(T, dtype=torch.bool),
        k_weight=(torch.randn(dkv, W, generator=g) * 0.5).bfloat16(),
        v_weight=(torch.randn(dkv, W, generator=g) * 0.5).bfloat16(),
        q_gamma=(1 + 0.1 * torch.randn(D, generator=g)).bfloat16(),
        k_gamma=(1 + 0.1 * torch.randn(D, generator=g)).bfloat16(),
        eps=1e-6,
        loc=torch.arange(3, 3 + 5 * T, 5, dtype=torch.int64),
        k_buf=torch.zeros(kv_slots, hkv, D, dtype=kv_dtype),
        v_buf=torch.zeros(kv_slots, hkv, D, dtype=kv_dtype),
        q_off=0, k_off=dq, v_off=dq + dkv, dq=dq, dkv=dkv,
    )
    if mxfp8_mode:
        shape = (kv_slots // 128, hkv, 32, 4, 4)
        args.update(mxfp8_quant=True, sfk=torch.zeros(shape, dtype=torch.uint8),
                    sfv=torch.zeros(shape, dtype=torch.uint8))
    return args, packed


def clone_args(args):
    return {k: (v.clone() if isinstance(v, torch.Tensor) and k != "qkvr" else v) for k, v in args.items()}


# ------------------------------------------------------------------------------------------------------------
# Conv, shift update, track: hand-computed
# ------------------------------------------------------------------------------------------------------------

def tiny_conv_case():
    """One KV head, W=4. Channel c has weights [0.5, 0.25, -1, 2] and history rows [1, 2, 3] * (c + 1)."""
    args, packed = make_case(T=3, hq=1, hkv=1, W=4, cache_slots=6)
    dkv = D
    c = torch.arange(dkv, dtype=torch.float32)
    args["k_weight"] = torch.tensor([0.5, 0.25, -1.0, 2.0]).repeat(dkv, 1).bfloat16()
    args["v_weight"] = torch.tensor([1.0, 0.0, 0.0, 1.0]).repeat(dkv, 1).bfloat16()
    hist = torch.stack([torch.full((dkv,), 1.0), torch.full((dkv,), 2.0), torch.full((dkv,), 3.0)])
    for slot in range(6):
        args["k_cache"][slot] = (hist * (slot + 1)).bfloat16()
        args["v_cache"][slot] = (hist * (slot + 1)).bfloat16()
    # token x = 0.5 on every k channel, 4.0 on every v channel.
    packed[:, D:2 * D] = 0.5
    packed[:, 2 * D:3 * D] = 4.0
    args["cache_indices"] = torch.tensor([2, 4, -1], dtype=torch.int32)
    args["cache_mask"] = torch.tensor([True, False, False])
    args["k_gamma"] = torch.ones(D).bfloat16()
    return args, packed, c


def test_conv_with_residual_hand_computed():
    args, packed, _ = tiny_conv_case()
    k_cache_before = args["k_cache"].clone()
    q, k, v, _ = inkling_attn_prologue_decode(**args)
    # Row 0: slot 2 (history 3, 6, 9), cm = 1. k: 0.5*3 + 0.25*6 - 1*9 + 2*0.5 + 0.5 (residual) = -4.5
    #        v: 1*3 + 1*4 + 4 = 11
    # Row 1: cm = 0: k = 2*0.5 + 0.5 = 1.5; v = 4 + 4 = 8
    # Row 2: padding (reads slot 0, times cm = 0): same as row 1.
    # k is then RMS-normed per head (all channels equal -> +-1 with gamma 1); v is the bf16 conv.
    assert torch.equal(v.float(), torch.tensor([11.0, 8.0, 8.0]).view(3, 1).expand(3, D))
    expected_k = torch.tensor([-4.5, 1.5, 1.5]).view(3, 1)
    inv = 1.0 / torch.sqrt(expected_k ** 2 + 1e-6)
    assert torch.equal(k.float(), (expected_k * inv).bfloat16().float().expand(3, D))
    assert torch.equal(args["k_cache"][0], k_cache_before[0])  # padding row never writes slot 0


def test_cache_mask_as_sglang_decode_passes_it():
    """SGLang's Inkling decode passes the conv metadata's mask as [B, 1, 1]; flipping one flag shows it is read."""
    args, _, _ = tiny_conv_case()

    def run(**changes):
        fresh = {"k_cache": args["k_cache"].clone(), "v_cache": args["v_cache"].clone()}
        return inkling_attn_prologue_decode(**{**args, **fresh, **changes})

    flat = run()
    shaped = run(cache_mask=args["cache_mask"].view(3, 1, 1))
    flipped = run(cache_mask=torch.tensor([False, False, False]).view(3, 1, 1))
    for a, b in zip(flat[:3], shaped[:3]):
        assert torch.equal(a, b)
    assert torch.equal(flipped[2][0].float(), torch.full((D,), 8.0))  # row 0 without history: v = 4 + 4
    assert not torch.equal(flat[2][0], flipped[2][0])


def test_shift_update_hand_computed_and_padding_untouched():
    args, packed, _ = tiny_conv_case()
    before_k, before_v = args["k_cache"].clone(), args["v_cache"].clone()
    inkling_attn_prologue_decode(**args)
    # slot 2 had history (3, 6, 9), cm = 1: new window (6, 9, x=0.5)
    assert torch.equal(args["k_cache"][2].float(), torch.tensor([6.0, 9.0, 0.5]).view(3, 1).expand(3, D))
    assert torch.equal(args["v_cache"][2].float(), torch.tensor([6.0, 9.0, 4.0]).view(3, 1).expand(3, D))
    # slot 4 (cm = 0): history dropped, new window (0, 0, x)
    assert torch.equal(args["k_cache"][4].float(), torch.tensor([0.0, 0.0, 0.5]).view(3, 1).expand(3, D))
    # every other slot (0 read by the padding row, 1, 3, 5) untouched
    for slot in (0, 1, 3, 5):
        assert torch.equal(args["k_cache"][slot], before_k[slot])
        assert torch.equal(args["v_cache"][slot], before_v[slot])


def test_shift_reads_all_taps_before_writing_width_2_and_5():
    for W in (2, 5):
        args, packed = make_case(T=2, W=W, cache_slots=4, seed=W)
        before = args["k_cache"].clone()
        inkling_attn_prologue_decode(**args)
        x = packed[:, 2 * D:3 * D]
        for t, slot in enumerate(args["cache_indices"].tolist()):
            expected = torch.cat([before[slot, 1:], x[t:t + 1]])
            assert torch.equal(args["k_cache"][slot], expected)


def test_track_slot_gets_the_updated_window():
    args, packed, _ = tiny_conv_case()
    args["track_mask"] = torch.tensor([True, False, True])
    args["track_indices"] = torch.tensor([5, 1, 3])  # row 1 untracked, row 2 padding: slots 1 and 3 untouched
    before = args["k_cache"].clone()
    inkling_attn_prologue_decode(**args)
    assert torch.equal(args["k_cache"][5], args["k_cache"][2])
    assert torch.equal(args["k_cache"][5].float(), torch.tensor([6.0, 9.0, 0.5]).view(3, 1).expand(3, D))
    assert torch.equal(args["v_cache"][5], args["v_cache"][2])
    assert torch.equal(args["k_cache"][1], before[1])
    assert torch.equal(args["k_cache"][3], before[3])


def test_strided_qkvr_equals_full_packed_row():
    args, packed = make_case(T=3, hq=2, hkv=2, seed=3)
    a, b = clone_args(args), clone_args(args)
    b["qkvr"] = packed.clone()
    out_a = inkling_attn_prologue_decode(**a)
    out_b = inkling_attn_prologue_decode(**b)
    for x, y in zip(out_a[:3], out_b[:3]):
        assert torch.equal(x, y)
    assert torch.equal(a["k_cache"], b["k_cache"]) and torch.equal(a["k_buf"], b["k_buf"])


def test_silu_activation():
    args, packed, _ = tiny_conv_case()
    args["activation"] = "silu"
    _, _, v, _ = inkling_attn_prologue_decode(**args)
    pre = torch.tensor([7.0, 4.0, 4.0])  # conv before silu and residual
    expected = (pre / (1 + torch.exp(-pre)) + 4.0).bfloat16().float()
    assert torch.equal(v[:, 0].float(), expected)


# ------------------------------------------------------------------------------------------------------------
# RMSNorm rounding points and tau
# ------------------------------------------------------------------------------------------------------------

def test_q_norm_constant_head_exact():
    args, packed = make_case(T=1, hq=2)
    packed[0, :D] = 2.0
    packed[0, D:2 * D] = -0.5
    args["eps"] = 0.0
    q, _, _, _ = inkling_attn_prologue_decode(**args)
    assert torch.equal(q[0, :D], args["q_gamma"])
    assert torch.equal(q[0, D:], -args["q_gamma"])


def _independent_norm(x64, gamma, eps):
    inv = 1.0 / torch.sqrt((x64 ** 2).mean(-1, keepdim=True) + eps)
    return (x64 * inv * gamma.double()).to(torch.bfloat16)


def test_k_norm_rounds_conv_to_bf16_first():
    args, packed = make_case(T=64, hq=1, hkv=2, cache_slots=70, seed=11)
    args["cache_indices"] = torch.arange(1, 65, dtype=torch.int32)
    args["loc"] = torch.arange(64) + 10
    k_cache, v_cache = args["k_cache"].clone(), args["v_cache"].clone()
    _, k, v, _ = inkling_attn_prologue_decode(**args)

    def conv64(x, hist, weight):  # float64: exact for these bf16 products and short sums
        w = weight.double()
        return (sum(hist[:, i].double() * w[:, i] for i in range(3)) + x.double() * w[:, 3] + x.double()).view(64, 2, D)

    conv = conv64(packed[:, D:3 * D], k_cache[1:65], args["k_weight"])
    v_conv = conv64(packed[:, 3 * D:5 * D], v_cache[1:65], args["v_weight"])
    with_point = _independent_norm(conv.to(torch.bfloat16).double(), args["k_gamma"], 1e-6)
    without_point = _independent_norm(conv, args["k_gamma"], 1e-6)
    ulp = (k.view(64, 2, D).float() - with_point.float()).abs() / with_point.float().abs().clamp(min=1e-3)
    assert float(ulp.max()) <= BF16_EPS  # at most one bf16 ulp off an independent float64 computation
    assert (k.view(64, 2, D) == with_point).float().mean() > 0.99
    assert (k.view(64, 2, D) != without_point).sum() > 0  # the rounding point is observable
    assert torch.equal(v.view(64, 2, D), v_conv.to(torch.bfloat16))  # v only rounds


def test_norm_is_ieee_float32_bit_for_bit():
    """inv = 1 / sqrt(sum_sq / 128 + eps) with correctly rounded float32 sqrt and division (numpy's are), then
    bf16((x * inv) * gamma): the same bits a CUDA kernel with sqrt.rn / div.rn gets. (torch's float32 CPU sqrt is
    not correctly rounded; this once cost a GPU-vs-reference mismatch.)"""
    import numpy as np

    from sglang_inkling_backend.reference.prologue import head_rmsnorm

    g = torch.Generator().manual_seed(2)
    x = (torch.randn(8192, D, generator=g) * torch.rand(8192, 1, generator=g) * 4).bfloat16().float()
    gamma = (1 + 0.2 * torch.randn(D, generator=g)).bfloat16()
    ours = head_rmsnorm(x, gamma, 1e-6)
    xn = x.numpy()
    sum_sq = (xn.astype(np.float64) ** 2).sum(-1, keepdims=True).astype(np.float32)
    inv = np.float32(1.0) / np.sqrt(sum_sq / np.float32(128) + np.float32(1e-6))
    expected = torch.from_numpy((xn * inv) * gamma.float().numpy()).bfloat16()
    assert torch.equal(ours, expected)


def test_tau_folds_after_the_norm_rounding():
    args, _ = make_case(T=3, hq=2, seed=5)
    tau = torch.tensor([1.0, 1.0693147, 1.37])
    q_plain, k_plain, v_plain, _ = inkling_attn_prologue_decode(**clone_args(args))
    q_tau, k_tau, v_tau, _ = inkling_attn_prologue_decode(**clone_args(args), log_scaling_tau=tau)
    assert torch.equal(q_tau, (q_plain.float() * tau.view(3, 1)).bfloat16())
    assert torch.equal(k_tau, k_plain) and torch.equal(v_tau, v_plain)


# ------------------------------------------------------------------------------------------------------------
# Stores: bf16 and MXFP8 (bytes and scale positions), padding rows, loc < 0
# ------------------------------------------------------------------------------------------------------------

def test_bf16_store_and_skips():
    args, _ = make_case(T=4, hq=1, hkv=2)
    args["cache_indices"] = torch.tensor([1, -1, 2, 3], dtype=torch.int32)
    args["loc"] = torch.tensor([10, 11, -1, 13])
    _, k, v, q_scale = inkling_attn_prologue_decode(**args)
    assert q_scale is None
    written = (args["k_buf"].view(256, -1) != 0).any(1).nonzero().flatten().tolist()
    assert written == [10, 13]  # padding row (11) and loc -1 skipped
    assert torch.equal(args["k_buf"][10].view(-1), k[0]) and torch.equal(args["v_buf"][13].view(-1), v[3])


def test_do_store_false_stores_nothing():
    args, _ = make_case(T=2)
    args["do_store"] = False
    args["k_buf"] = torch.zeros(256, 1, D, dtype=torch.float8_e4m3fn)  # any pool dtype when not storing
    inkling_attn_prologue_decode(**args)
    assert not args["k_buf"].view(torch.uint8).any()


def test_mxfp8_q_bytes_and_scales_equal_quantize():
    args, _ = make_case(T=3, hq=2, hkv=2, mxfp8_mode=True, seed=7)
    bf16_args = clone_args(args)
    bf16_args.update(mxfp8_quant=False, sfk=None, sfv=None, k_buf=torch.zeros(256, 2, D).bfloat16(),
                     v_buf=torch.zeros(256, 2, D).bfloat16())
    tau = torch.tensor([1.5, 1.0, 1.25])
    q_ref, k_ref, v_ref, _ = inkling_attn_prologue_decode(**bf16_args, log_scaling_tau=tau)
    q8, k, v, q_scale = inkling_attn_prologue_decode(**args, log_scaling_tau=tau)
    data, scales = mxfp8.quantize(q_ref.view(3, 2, D))
    assert q8.dtype == torch.float8_e4m3fn and q8.shape == (3, 2 * D)
    assert torch.equal(q8.view(torch.uint8), data.view(torch.uint8).view(3, 2 * D))
    assert q_scale.shape == (3, 2, 4)
    assert torch.equal(q_scale.view(torch.uint8), scales)
    assert torch.equal(k, k_ref) and torch.equal(v, v_ref)


def test_mxfp8_kv_store_at_interleaved_positions():
    hkv = 2
    args, _ = make_case(T=4, hq=1, hkv=hkv, mxfp8_mode=True, kv_slots=384, seed=9)
    args["loc"] = torch.tensor([5, 127, 128 + 33, 256 + 98])
    args["cache_indices"] = torch.tensor([1, 2, -1, 4], dtype=torch.int32)  # row 2 is padding: not stored
    _, k, v, _ = inkling_attn_prologue_decode(**args)
    sfk, sfv = args["sfk"].view(-1), args["sfv"].view(-1)
    # where the core's layout puts each scale byte (the layout itself against SGLang's: tests/test_scale_layout.py)
    sf_offsets = ScaleLayout.for_pool(384, hkv, D, 128).flat_index(args["loc"])
    expected_sf_written = set()
    for t in (0, 1, 3):
        slot = int(args["loc"][t])
        for name, out, buf, sf in (("k", k, args["k_buf"], sfk), ("v", v, args["v_buf"], sfv)):
            data, scales = mxfp8.quantize(out[t].view(hkv, D))
            assert torch.equal(buf[slot].view(torch.uint8), data.view(torch.uint8)), name
            for h in range(hkv):
                for b in range(4):
                    off = int(sf_offsets[t, h, b])
                    assert int(sf[off]) == int(scales[h, b]), (name, t, h, b)
                    expected_sf_written.add(off)
    written_rows = (args["k_buf"].view(torch.uint8).view(384, -1) != 0).any(1).nonzero().flatten().tolist()
    assert written_rows == [5, 127, 256 + 98]
    assert set((sfk != 0).nonzero().flatten().tolist()) == expected_sf_written


def test_e8m0_scale_buffers_accepted():
    args, _ = make_case(T=2, mxfp8_mode=True)
    u8 = clone_args(args)
    args["sfk"] = args["sfk"].view(torch.float8_e8m0fnu)
    args["sfv"] = args["sfv"].view(torch.float8_e8m0fnu)
    inkling_attn_prologue_decode(**args)
    inkling_attn_prologue_decode(**u8)
    assert torch.equal(args["sfk"].view(torch.uint8), u8["sfk"])


# ------------------------------------------------------------------------------------------------------------
# Errors: SGLang's messages, then ours; nothing written on error
# ------------------------------------------------------------------------------------------------------------

def _mutable(args):
    return {k: v for k, v in args.items() if isinstance(v, torch.Tensor) and k != "qkvr"}


ERROR_CASES = [
    # (name, mxfp8 mode, edit, exception, message fragment)
    ("misaligned dq", True, lambda a: a.update(dq=192), ValueError,
     "MXFP8 fused decode prologue requires head_dim-aligned Q/K/V."),
    ("misaligned dkv", True, lambda a: a.update(dkv=96), ValueError,
     "MXFP8 fused decode prologue requires head_dim-aligned Q/K/V."),
    ("missing sfk", True, lambda a: a.update(sfk=None), ValueError,
     "MXFP8 fused decode prologue requires K/V scale buffers."),
    ("missing sfv", True, lambda a: a.update(sfv=None), ValueError,
     "MXFP8 fused decode prologue requires K/V scale buffers."),
    ("flat scales", True, lambda a: a.update(sfk=torch.zeros(256, 1, 4, dtype=torch.uint8)), ValueError,
     "MXFP8 fused decode prologue requires interleaved K/V scale buffers with shape (2, 1, 32, 4, 4), "
     "got (256, 1, 4) and (2, 1, 32, 4, 4)."),
    ("non-contiguous scales", True,
     lambda a: a.update(sfv=torch.zeros(2, 1, 32, 4, 8, dtype=torch.uint8)[..., ::2]), ValueError,
     "MXFP8 fused decode prologue requires contiguous interleaved SFK/SFV."),
    ("page size", True, lambda a: a.update(page_size=64), ValueError, "needs page_size 128"),
    ("mxfp8 without store", True, lambda a: a.update(do_store=False), ValueError, "requires do_store=True"),
    ("scale dtype", True, lambda a: a.update(sfk=a["sfk"].float()), TypeError, "sfk must be"),
    ("mxfp8 bf16 pool", True, lambda a: a.update(k_buf=torch.zeros(256, 1, D).bfloat16()), TypeError,
     "k_buf must be torch.float8_e4m3fn"),
    ("bf16 misaligned", False, lambda a: a.update(dkv=64), ValueError, "multiples of head_dim 128"),
    ("bf16 pool dtype", False, lambda a: a.update(v_buf=torch.zeros(256, 1, D)), TypeError,
     "v_buf must be torch.bfloat16"),
    ("qkvr dtype", False, lambda a: a.update(qkvr=a["qkvr"].float()), TypeError, "qkvr must be torch.bfloat16"),
    ("qkvr rank", False, lambda a: a.update(qkvr=a["qkvr"][0]), ValueError, "qkvr must be 2-D"),
    ("qkvr storage", False, lambda a: a.update(qkvr=a["qkvr"].clone()), ValueError, "storage is too small"),
    ("cache dtype", False, lambda a: a.update(k_cache=a["k_cache"].float()), TypeError, "k_cache must be"),
    ("cache shape", False, lambda a: a.update(v_cache=a["v_cache"][:, :2]), ValueError, "v_cache must have shape"),
    ("weight shape", False, lambda a: a.update(k_weight=a["k_weight"][:64]), ValueError, "k_weight must be"),
    ("indices dtype", False, lambda a: a.update(cache_indices=a["cache_indices"].float()), TypeError,
     "cache_indices must be"),
    ("indices length", False, lambda a: a.update(cache_indices=a["cache_indices"][:2]), ValueError,
     "cache_indices must have shape (4,)"),
    ("mask dtype", False, lambda a: a.update(cache_mask=a["cache_mask"].int()), TypeError, "cache_mask must be"),
    ("mask length", False, lambda a: a.update(cache_mask=a["cache_mask"][:2].view(2, 1, 1)), ValueError,
     "cache_mask must have T=4 elements"),
    ("gamma shape", False, lambda a: a.update(q_gamma=torch.ones(64).bfloat16()), ValueError,
     "q_gamma must have shape (128,)"),
    ("gamma dtype", False, lambda a: a.update(k_gamma=torch.ones(D)), TypeError, "k_gamma must be"),
    ("strided loc", False, lambda a: a.update(loc=(torch.arange(8) + 3)[::2]), ValueError, "loc must be contiguous"),
    ("strided gamma", False, lambda a: a.update(q_gamma=torch.ones(256).bfloat16()[::2]), ValueError,
     "q_gamma must be contiguous"),
    ("loc dtype", False, lambda a: a.update(loc=a["loc"].float()), TypeError, "loc must be"),
    ("activation", False, lambda a: a.update(activation="gelu"), ValueError, "activation must be"),
    ("eps", False, lambda a: a.update(eps=-1.0), ValueError, "eps must be"),
    ("offset type", False, lambda a: a.update(k_off=1.5), TypeError, "k_off must be an int"),
    ("cache slot range", False, lambda a: a.update(cache_indices=torch.tensor([1, 2, 3, 8], dtype=torch.int32)),
     ValueError, "cache_indices must be -1 (padding) or a conv-cache slot in [0, 8)"),
    ("duplicate cache slot", False,
     lambda a: a.update(cache_indices=torch.tensor([1, 2, 2, -1], dtype=torch.int32)), ValueError,
     "must be distinct"),
    ("loc range", False, lambda a: a.update(loc=torch.tensor([3, 8, 256, 18])), ValueError, "loc must be < 256"),
    ("duplicate loc", False, lambda a: a.update(loc=torch.tensor([3, 3, 9, 18])), ValueError,
     "loc must be distinct"),
    ("track without indices", False, lambda a: a.update(track_mask=torch.ones(4, dtype=torch.bool)), ValueError,
     "track_indices is required"),
    ("track slot range", False, lambda a: a.update(track_mask=torch.ones(4, dtype=torch.bool),
                                                    track_indices=torch.tensor([5, 6, 7, 9])), ValueError,
     "track_indices of tracked real rows must be conv-cache slots in [0, 8)"),
    ("track slot collides", False, lambda a: a.update(track_mask=torch.ones(4, dtype=torch.bool),
                                                       track_indices=torch.tensor([5, 6, 7, 1])), ValueError,
     "must be distinct"),
    ("tau length", False, lambda a: a.update(log_scaling_tau=torch.ones(3)), ValueError,
     "log_scaling_tau must have at least T=4"),
    ("tau dtype", False, lambda a: a.update(log_scaling_tau=torch.ones(4, dtype=torch.int32)), TypeError,
     "log_scaling_tau must be a float tensor"),
    # a tensor on the meta device holds no data: refused by name (checks.require_tensor) before the device check
    ("device", False, lambda a: a.update(loc=a["loc"].to("meta")), ValueError,
     "loc must be a torch.Tensor holding data, got a tensor on the meta device"),
]


@pytest.mark.parametrize("mx", [False, True])
def test_graph_padding_rows_share_sglangs_padding_slot_zero(mx):
    """SGLang pads CUDA-graph batches with zero-filled rows: conv slot 0 and KV slot 0, several rows per step. They
    are accepted, and the real rows come out as with -1 padding rows (which write nothing)."""
    padded, _ = make_case(T=4, mxfp8_mode=mx)
    sentinel = {**padded, **{k: v.clone() for k, v in _mutable(padded).items()}}  # qkvr stays the shared view
    padded.update(cache_indices=torch.tensor([1, 2, 0, 0], dtype=torch.int32), loc=torch.tensor([3, 8, 0, 0]))
    sentinel.update(cache_indices=torch.tensor([1, 2, -1, -1], dtype=torch.int32), loc=torch.tensor([3, 8, -1, -1]))
    out_padded = inkling_attn_prologue_decode(**padded)
    out_sentinel = inkling_attn_prologue_decode(**sentinel)
    for a, b in zip(out_padded[:3], out_sentinel[:3]):
        assert torch.equal(a[:2], b[:2])
    for name in ("k_cache", "v_cache"):
        assert torch.equal(padded[name][1:3], sentinel[name][1:3])
    for name in ("k_buf", "v_buf"):
        assert torch.equal(padded[name][[3, 8]], sentinel[name][[3, 8]])


@pytest.mark.parametrize("name,mx,edit,exc,message", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_errors_leave_buffers_untouched(name, mx, edit, exc, message):
    args, _ = make_case(T=4, mxfp8_mode=mx)
    edit(args)
    before = {k: v.clone() for k, v in _mutable(args).items() if v.device.type != "meta"}
    with pytest.raises(exc) as info:
        inkling_attn_prologue_decode(**args)
    assert message in str(info.value)
    for k, v in before.items():
        assert torch.equal(args[k].view(torch.uint8) if args[k].dtype.itemsize == 1 else args[k],
                           v.view(torch.uint8) if v.dtype.itemsize == 1 else v), k


def test_sglang_messages_exact():
    args, _ = make_case(T=2, mxfp8_mode=True)
    args["sfk"] = None
    # SGLang's sentence first, then what was passed
    with pytest.raises(ValueError, match=r"^MXFP8 fused decode prologue requires K/V scale buffers\. sfk and sfv "
                                         r"must be uint8 / float8_e8m0fnu tensors, got sfk=None, sfv=torch.uint8"):
        inkling_attn_prologue_decode(**args)


# ------------------------------------------------------------------------------------------------------------
# Tau and the relative logits
# ------------------------------------------------------------------------------------------------------------

def test_log_scaling_tau_values():
    tau = log_scaling_tau(torch.tensor([0, 127999, 255999, 1048575]), 128000, 0.1)
    assert tau.dtype == torch.float32
    expected = torch.tensor([1.0, 1.0, 1.0 + 0.1 * math.log(2.0), 1.0 + 0.1 * math.log(1048576 / 128000)])
    assert torch.allclose(tau, expected, rtol=0, atol=1e-6)
    assert tau[0] == 1.0 and tau[1] == 1.0


def test_rel_logits_prescale_and_postscale():
    g = torch.Generator().manual_seed(1)
    r = torch.randn(3, 2, 16, generator=g).bfloat16()
    proj = torch.randn(16, 64, generator=g).bfloat16()
    tau = torch.tensor([1.0, 1.5, 2.0])
    plain = inkling_rel_logits(r, proj)
    manual = (r.double() @ proj.double()).bfloat16()
    assert plain.shape == (3, 2, 64) and plain.dtype == torch.bfloat16
    assert ((plain.float() - manual.float()).abs() <= manual.float().abs() * BF16_EPS).all()
    pre = inkling_rel_logits(r, proj, tau)
    r_scaled = (r.float() * tau.view(3, 1, 1)).bfloat16()
    assert torch.equal(pre, inkling_rel_logits(r_scaled, proj))
    post = inkling_rel_logits(r, proj, tau, prescale_tau=False)
    assert torch.equal(post, (plain.float() * tau.view(3, 1, 1)).bfloat16())
    assert torch.equal(pre[0], plain[0])  # tau = 1 changes nothing


def test_mxfp8_kv_with_q_kept_bf16():
    """quantize_q=False (ours): K/V stored exactly as in MXFP8 mode, q the bf16 mode's q, no q scale."""
    args, _ = make_case(T=3, hq=2, hkv=2, mxfp8_mode=True, seed=7)
    bf16_args = clone_args(args)
    bf16_args.update(mxfp8_quant=False, sfk=None, sfv=None, k_buf=torch.zeros(256, 2, D).bfloat16(),
                     v_buf=torch.zeros(256, 2, D).bfloat16())
    q_ref, _, _, _ = inkling_attn_prologue_decode(**bf16_args)
    mx_args = clone_args(args)
    _, k_mx, v_mx, q_scale_mx = inkling_attn_prologue_decode(**mx_args)
    q, k, v, q_scale = inkling_attn_prologue_decode(**args, quantize_q=False)
    assert q.dtype == torch.bfloat16 and torch.equal(q, q_ref) and q_scale is None and q_scale_mx is not None
    assert torch.equal(k, k_mx) and torch.equal(v, v_mx)
    for key in ("k_buf", "v_buf", "sfk", "sfv", "k_cache", "v_cache"):
        assert torch.equal(args[key].view(torch.uint8), mx_args[key].view(torch.uint8)), key
    with pytest.raises(ValueError, match=r"quantize_q=True needs mxfp8_quant=True"):
        inkling_attn_prologue_decode(**clone_args(bf16_args), quantize_q=True)
    with pytest.raises(TypeError, match="quantize_q must be None or a bool"):
        inkling_attn_prologue_decode(**clone_args(args), quantize_q=1)
