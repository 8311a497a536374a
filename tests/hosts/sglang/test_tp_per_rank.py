"""Tensor parallel at the Inkling seam, at the level that runs here: one full-attention Inkling decode step
(prologue with MXFP8 store, then paged attention with relative bias) computed once at tp 1 and once per rank at
tp 2 and tp 4, where each rank holds its slice of query heads and its KV heads (replicated when tp > Hkv, with the
short-conv weights and conv state of those KV channels replicated too).

Every step is local to a head (conv per channel, RMSNorm per head, MXFP8 blocks inside a head, attention per query
head over its KV head), so each rank's output must equal its heads of the tp-1 output bit for bit, and its pool
must hold the same bytes as the tp-1 pool's copy of its KV heads."""

import pytest
import torch

from sglang_inkling_backend import InklingKVPool, LayerPlan, mxfp8
from sglang_inkling_backend.kv_pool import bytes_per_token
from sglang_inkling_backend.attention_inputs import inkling_params
from sglang_inkling_backend.reference.attention import paged_decode_attention
from sglang_inkling_backend.reference.prologue import inkling_attn_prologue_decode

HQ, HKV, D, W, REL = 8, 2, 128, 4, 16
B, HISTORY = 3, (40, 7, 130)
PAGE = 128


def make_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(torch.bfloat16)  # noqa: E731
    dq, dkv = HQ * D, HKV * D
    return dict(
        qkvr=rnd(B, dq + 2 * dkv),
        k_cache=rnd(4, W - 1, dkv), v_cache=rnd(4, W - 1, dkv),
        k_weight=rnd(dkv, W, scale=0.3), v_weight=rnd(dkv, W, scale=0.3),
        q_gamma=rnd(D, scale=0.1) + 1, k_gamma=rnd(D, scale=0.1) + 1,
        history=[(rnd(n, HKV, D), rnd(n, HKV, D, scale=4.0)) for n in HISTORY],
        rel=rnd(B, HQ, REL),
        cache_indices=torch.tensor([2, 0, 3], dtype=torch.int32),
    )


def kv_heads_of_rank(rank: int, tp: int) -> list[int]:
    """KV heads a rank holds: a contiguous slice when tp <= Hkv, one replicated head when tp > Hkv."""
    if tp <= HKV:
        per = HKV // tp
        return list(range(rank * per, (rank + 1) * per))
    return [rank // (tp // HKV)]


def run_rank(inputs, rank: int, tp: int):
    """One decode step on one rank: its slices of the packed row, the conv state and weights of its KV channels,
    its own MXFP8 pool sized by the per-rank plan."""
    plan = LayerPlan.from_windows({0: None}, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D).with_tp(tp)
    hq, hkv = plan.spec(0).num_q_heads, plan.spec(0).num_kv_heads
    q_heads = list(range(rank * hq, (rank + 1) * hq))
    kv_heads = kv_heads_of_rank(rank, tp)
    assert len(kv_heads) == hkv
    q_cols = torch.cat([torch.arange(h * D, (h + 1) * D) for h in q_heads])
    kv_cols = torch.cat([torch.arange(h * D, (h + 1) * D) for h in kv_heads])
    dq_full, dkv_full = HQ * D, HKV * D
    row = inputs["qkvr"]
    qkvr = torch.cat([row[:, q_cols], row[:, dq_full + kv_cols], row[:, dq_full + dkv_full + kv_cols]], 1)
    k_cache = inputs["k_cache"][:, :, kv_cols].clone()
    v_cache = inputs["v_cache"][:, :, kv_cols].clone()
    pool = InklingKVPool(plan, size=2 * PAGE, page_size=PAGE, kv_format="mxfp8")
    slots, indptr = [], [0]
    next_slot = 1
    for (hk, hv), n in zip(inputs["history"], HISTORY):
        s = torch.arange(next_slot, next_slot + n + 1)  # history plus the new token's slot
        next_slot += n + 1
        pool.set_kv_buffer(0, s[:-1], hk[:, kv_heads], hv[:, kv_heads])
        slots.append(s)
        indptr.append(indptr[-1] + n + 1)
    slots = torch.cat(slots)
    loc = torch.tensor([int(slots[i - 1]) for i in indptr[1:]])
    sfk, sfv = pool.get_kv_scale_buffer(0)
    dq, dkv = hq * D, hkv * D
    q_out, k_out, v_out, q_scale = inkling_attn_prologue_decode(
        qkvr, k_cache, v_cache, inputs["cache_indices"], torch.ones(B, dtype=torch.bool),
        inputs["k_weight"][kv_cols], inputs["v_weight"][kv_cols], inputs["q_gamma"], inputs["k_gamma"], 1e-6,
        loc, pool.get_key_buffer(0), pool.get_value_buffer(0), 0, dq, dq + dkv, dq, dkv,
        mxfp8_quant=True, sfk=sfk, sfv=sfv, page_size=PAGE)
    q = mxfp8.dequantize(q_out.view(B, hq, D), q_scale.view(torch.uint8).view(B, hq, D // 32), torch.float32)
    out = paged_decode_attention(q, pool.paged_kv(0), torch.tensor(indptr), slots,
                                 inkling_params(D, inputs["rel"][:, q_heads]))
    return out, pool, slots, k_cache, plan


@pytest.mark.parametrize("tp", [2, 4])
def test_each_rank_reproduces_its_heads_of_tp1_exactly(tp):
    inputs = make_inputs()
    full_out, full_pool, slots, full_conv, _ = run_rank(inputs, 0, 1)
    hq = HQ // tp
    for rank in range(tp):
        out, pool, rank_slots, conv, plan = run_rank(inputs, rank, tp)
        assert torch.equal(out, full_out[:, rank * hq:(rank + 1) * hq]), (tp, rank)
        kv_heads = kv_heads_of_rank(rank, tp)
        assert torch.equal(rank_slots, slots)
        assert torch.equal(pool.get_key_buffer(0)[slots].view(torch.uint8),
                           full_pool.get_key_buffer(0)[slots][:, kv_heads].view(torch.uint8))
        layout, full_layout = pool.scale_layout(0), full_pool.scale_layout(0)
        assert torch.equal(layout.gather(pool.get_kv_scale_buffer(0)[1], slots),
                           full_layout.gather(full_pool.get_kv_scale_buffer(0)[1], slots)[:, kv_heads])
        kv_cols = torch.cat([torch.arange(h * D, (h + 1) * D) for h in kv_heads])
        assert torch.equal(conv, full_conv[:, :, kv_cols])  # the replicated conv state evolves identically


def test_per_rank_kv_bytes_with_replication():
    plan = LayerPlan.from_windows({0: None}, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    per_rank = {tp: bytes_per_token(plan.with_tp(tp), "mxfp8") for tp in (1, 2, 4, 8)}
    # one layer, 2 KV heads: 2 * 2 * (128 + 4) at tp 1; one head per rank from tp 2 on (replicated at 4 and 8)
    assert per_rank == {1: 528, 2: 264, 4: 264, 8: 264}
    assert bytes_per_token(plan.with_tp(4), "bf16") == 512
    with pytest.raises(ValueError, match="num_q_heads=8 is not divisible by tp_size=3"):
        plan.with_tp(3)
