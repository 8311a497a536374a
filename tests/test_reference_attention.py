"""The reference attention against a dense float64 softmax written separately here, over bf16, per-tensor fp8 and
MXFP8 pools, in Inkling and generic modes."""

import math

import pytest
import torch

from sglang_inkling_backend import InklingKVPool, LayerPlan
from sglang_inkling_backend.attention_inputs import AttentionParams, inkling_params
from sglang_inkling_backend.reference.attention import paged_decode_attention, paged_extend_attention


def dense_float64(q, k, v, q_positions, scale, window=None, rel=None, cap=0.0, sinks=None):
    """q [R, Hq, D], k/v [L, Hkv, D] (already dequantized), loops written plainly in float64."""
    R, Hq, D = q.shape
    L, Hkv, _ = k.shape
    out = torch.zeros(R, Hq, D, dtype=torch.float64)
    for r in range(R):
        i = int(q_positions[r])
        for h in range(Hq):
            kh = h // (Hq // Hkv)
            logits, values = [], []
            for j in range(L):
                d = i - j
                if d < 0 or (window is not None and d >= window):
                    continue
                s = float((q[r, h].double() * k[j, kh].double()).sum()) * scale
                if rel is not None and d < rel.shape[-1]:
                    s += float(rel[r, h, d])
                if cap > 0:
                    s = cap * math.tanh(s / cap)
                logits.append(s)
                values.append(v[j, kh].double())
            m = max(logits + ([float(sinks[h])] if sinks is not None else []))
            w = [math.exp(s - m) for s in logits]
            z = sum(w) + (math.exp(float(sinks[h]) - m) if sinks is not None else 0.0)
            out[r, h] = sum(wi * vi for wi, vi in zip(w, values)) / z
    return out


def _setup(kv_format, lens, hq=4, hkv=2, d=64, page=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    plan = LayerPlan.from_windows({0: None}, num_q_heads=hq, num_kv_heads=hkv, head_dim=d)
    pool = InklingKVPool(plan, size=256, page_size=page, kv_format=kv_format, k_scale=0.5, v_scale=2.0)
    perm = torch.randperm(255, generator=g)[: sum(lens)] + 1  # scattered slots, never slot 0
    indptr = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)))
    k = torch.randn(sum(lens), hkv, d, generator=g)
    v = torch.randn(sum(lens), hkv, d, generator=g)
    pool.set_kv_buffer(0, perm, k, v)
    return pool, indptr, perm, g


@pytest.mark.parametrize("kv_format", ["bf16", "fp8_e4m3", "mxfp8"])
@pytest.mark.parametrize("mode", ["generic", "window_sinks_cap", "inkling", "inkling_local"])
def test_decode_against_dense_float64(kv_format, mode):
    lens = [1, 7, 20]
    page = 128 if kv_format == "mxfp8" else 16
    pool, indptr, slots, g = _setup(kv_format, lens, page=page)
    q = torch.randn(3, 4, 64, generator=g)
    if mode == "generic":
        params = AttentionParams(softmax_scale=0.125)
    elif mode == "window_sinks_cap":
        params = AttentionParams(softmax_scale=0.125, window=5, logit_cap=2.0, sinks=torch.randn(4, generator=g))
    else:
        rel = torch.randn(3, 4, 6, generator=g)
        params = inkling_params(64, rel, window=4 if mode == "inkling_local" else None)
    out = paged_decode_attention(q, pool.paged_kv(0), indptr, slots, params)
    for b, n in enumerate(lens):
        k, v = pool.read_kv(0, slots[indptr[b]:indptr[b + 1]])
        ref = dense_float64(q[b:b + 1], k, v, [n - 1], params.softmax_scale, params.window,
                            None if params.rel_bias is None else params.rel_bias[b:b + 1], params.logit_cap,
                            params.sinks)
        assert (out[b:b + 1].double() - ref).abs().max() < 2e-6


def test_extend_with_cached_prefix_against_dense_float64():
    lens, qlens = [9, 20], [3, 20]  # request 0: 6 cached + 3 new; request 1: fresh prefill
    pool, indptr, slots, g = _setup("mxfp8", lens, page=128)
    q = torch.randn(sum(qlens), 4, 64, generator=g)
    qo = torch.tensor([0, 3, 23])
    rel = torch.randn(23, 4, 8, generator=g)
    params = AttentionParams(softmax_scale=1 / 64, window=6, rel_bias=rel)
    out = paged_extend_attention(q, pool.paged_kv(0), indptr, slots, qo, params)
    for b in range(2):
        k, v = pool.read_kv(0, slots[indptr[b]:indptr[b + 1]])
        rows = slice(int(qo[b]), int(qo[b + 1]))
        positions = list(range(lens[b] - qlens[b], lens[b]))
        ref = dense_float64(q[rows], k, v, positions, 1 / 64, 6, rel[rows])
        assert (out[rows].double() - ref).abs().max() < 2e-6


def test_mxfp8_pool_attention_close_to_unquantized():
    # not a tolerance on the reference itself: the quantization error of the pool, seen through attention
    lens = [40]
    bf, indptr, slots, g = _setup("bf16", lens, page=128, seed=3)
    mx, _, _, _ = _setup("mxfp8", lens, page=128, seed=3)
    q = torch.randn(1, 4, 64, generator=g)
    p = AttentionParams(softmax_scale=0.125)
    err = (paged_decode_attention(q, mx.paged_kv(0), indptr, slots, p)
           - paged_decode_attention(q, bf.paged_kv(0), indptr, slots, p)).abs().max()
    assert 1e-4 < err < 0.05


def test_errors_name_the_argument():
    pool, indptr, slots, g = _setup("bf16", [4])
    kv = pool.paged_kv(0)
    p = AttentionParams(softmax_scale=0.1)
    with pytest.raises(ValueError, match="q's head_dim 32 does not match the pool's 64"):
        paged_decode_attention(torch.randn(1, 4, 32), kv, indptr, slots, p)
    with pytest.raises(ValueError, match=r"kv_indptr must have batch \+ 1 = 3 entries"):
        paged_decode_attention(torch.randn(2, 4, 64), kv, indptr, slots, p)
    with pytest.raises(ValueError, match=r"kv_indices must be slots in \[0, 272\)"):
        paged_decode_attention(torch.randn(1, 4, 64), kv, indptr, torch.tensor([1, 2, 3, 999]), p)
    with pytest.raises(ValueError, match="q's head count 3 must be a multiple of the pool's KV heads 2"):
        paged_decode_attention(torch.randn(1, 3, 64), kv, indptr, slots, p)
    with pytest.raises(ValueError, match=r"rel_bias must have shape \[1, 4, rel_extent\]"):
        paged_decode_attention(torch.randn(1, 4, 64), kv, indptr, slots,
                               AttentionParams(0.1, rel_bias=torch.zeros(2, 4, 3)))
    with pytest.raises(ValueError, match="each request needs at least as many keys as queries"):
        paged_extend_attention(torch.randn(5, 4, 64), kv, indptr, slots, torch.tensor([0, 5]), p)
    with pytest.raises(ValueError, match="window must be an int >= 1, got 0"):
        AttentionParams(0.1, window=0)
