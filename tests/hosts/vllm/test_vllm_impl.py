"""The vLLM impl end to end on one layer, with vLLM's own classes (skips without vLLM): K/V written through
``do_kv_cache_update`` at vLLM's slot mapping, a mixed batch (decodes first, then a chunked prefill) through
``forward``, against a float64 oracle written here on the same stored (quantized) K/V; windows with vLLM's null
blocks, sinks, soft-cap, GQA; and the refusals the impl makes at construction."""

import importlib.util
import math
from types import SimpleNamespace

import pytest
import torch

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed (scripts/setup_vllm.sh makes .venv-vllm)", allow_module_level=True)

from sglang_inkling_backend.hosts.vllm import backend as vb  # noqa: E402
from sglang_inkling_backend.hosts.vllm.batch import VllmBatch  # noqa: E402
from sglang_inkling_backend.hosts.vllm.cache_dtypes import MXFP8_CACHE_DTYPE  # noqa: E402
from sglang_inkling_backend.hosts.vllm.block_cache import BlockCacheLayout, vllm_layer_view  # noqa: E402
from sglang_inkling_backend.routes import TorchRoute  # noqa: E402

CACHE_DTYPE = {"bf16": "auto", "fp8_e4m3": "fp8_e4m3", "mxfp8": MXFP8_CACHE_DTYPE}


@pytest.fixture(autouse=True)
def model_dtype(monkeypatch):
    config = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16))
    monkeypatch.setattr(vb, "get_current_vllm_config", lambda: config)


def make_impl(kv_format, hq=8, hkv=2, d=64, window=None, cap=None, sinks=None):
    return vb.InklingVllmImpl(hq, d, 1 / math.sqrt(d), hkv, None, window, CACHE_DTYPE[kv_format],
                              logits_soft_cap=cap, sinks=sinks)


def oracle(q, k, v, positions, window, scale, cap, sinks):
    """float64 attention of queries at ``positions`` over keys 0..len(k)-1 (causal, window: distance < W)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("thd,khd->thk", q, k) * scale
    if cap:
        s = cap * torch.tanh(s / cap)
    j = torch.arange(k.shape[0])
    dist = positions[:, None] - j[None, :]
    visible = (dist >= 0) & ((dist < window) if window else True)
    s = s.masked_fill(~visible[:, None, :], float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.double()[None, :, None].expand(s.shape[0], -1, 1)], dim=2)
        p = torch.softmax(s, dim=2)[..., :-1]
    else:
        p = torch.softmax(s, dim=2)
    return torch.einsum("thk,khd->thd", p, v)


def run_layer(kv_format, window=None, cap=None, with_sinks=False, seed=0):
    hq, hkv, d, bs = 8, 2, 64, 128 if kv_format == "mxfp8" else 16
    g = torch.Generator().manual_seed(seed)
    sinks = torch.randn(hq, generator=g) if with_sinks else None
    impl = make_impl(kv_format, hq, hkv, d, window, cap, sinks)
    layer = SimpleNamespace(_k_scale_float=0.25, _v_scale_float=0.5)
    layout = BlockCacheLayout(kv_format, hkv, d, bs)
    cache = vllm_layer_view(layout, 24, dtype=torch.bfloat16 if kv_format == "bf16" else torch.uint8)
    # Three requests: two decodes (seq 300 and 5), one chunked prefill (4 new tokens after 20). Block 0 is vLLM's
    # null block: the long request's first blocks stand replaced by it, as vLLM does once a window moves past.
    seq_lens, query_lens = [300, 5, 24], [1, 1, 4]
    blocks_of = {0: [3, 7, 4], 1: [9], 2: [5]} if kv_format == "mxfp8" else \
        {0: list(range(1, 20)), 1: [20], 2: [21, 22]}
    if window:  # blocks wholly before the window's first key are the null block, as vLLM leaves them
        first = (seq_lens[0] - 1 - (window - 1)) // bs
        blocks_of[0][:first] = [0] * first
    max_blocks = max(len(b) for b in blocks_of.values())
    table = torch.zeros(3, max_blocks, dtype=torch.int32)
    for r, blocks in blocks_of.items():
        table[r, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
    slot_of = lambda r, p: int(table[r, p // bs]) * bs + p % bs  # noqa: E731
    keys = {r: (torch.randn(n, hkv, d, generator=g) * 2).bfloat16() for r, n in enumerate(seq_lens)}
    vals = {r: torch.randn(n, hkv, d, generator=g).bfloat16() for r, n in enumerate(seq_lens)}
    history = [(r, p) for r, n in enumerate(seq_lens) for p in range(n - query_lens[r])]
    impl.do_kv_cache_update(layer, torch.stack([keys[r][p] for r, p in history]),
                            torch.stack([vals[r][p] for r, p in history]), cache,
                            torch.tensor([slot_of(r, p) for r, p in history]))
    # The step: new tokens in batch order, one padded token (slot -1) at the end, as vLLM pads.
    step = [(r, p) for r, n in enumerate(seq_lens) for p in range(n - query_lens[r], n)]
    slot_mapping = torch.tensor([slot_of(r, p) for r, p in step] + [-1])
    new_k = torch.stack([keys[r][p] for r, p in step] + [torch.zeros(hkv, d).bfloat16()])
    new_v = torch.stack([vals[r][p] for r, p in step] + [torch.zeros(hkv, d).bfloat16()])
    impl.do_kv_cache_update(layer, new_k, new_v, cache, slot_mapping)
    qsl = torch.tensor([0, 1, 2, 6], dtype=torch.int32)
    batch = VllmBatch(num_reqs=3, num_actual_tokens=6, num_decodes=2, num_decode_tokens=2, query_start_loc=qsl,
                      seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_table=table,
                      slot_mapping=slot_mapping, block_size=bs, max_seq_len=300, route=TorchRoute())
    q = torch.randn(7, hq, d, generator=g).bfloat16()
    out = torch.full((7, hq * d), 7.0, dtype=torch.bfloat16)
    impl.forward(layer, q, new_k, new_v, cache, batch, out)
    kv = impl.attention.paged_kv(cache)
    expected = []
    for r, n in enumerate(seq_lens):
        k, v = kv.read(torch.tensor([slot_of(r, p) for p in range(n)]))  # the stored (quantized) K/V
        if query_lens[r] > 1:  # a prefill reads its own new keys from the forward (layer_step.forward_rows_keys)
            k[n - query_lens[r]:] = keys[r][n - query_lens[r]:].float()
            v[n - query_lens[r]:] = vals[r][n - query_lens[r]:].float()
        rows = q[int(qsl[r]): int(qsl[r + 1])]
        positions = torch.arange(n - query_lens[r], n)
        expected.append(oracle(rows, k, v, positions, window, impl.spec.scale, cap, sinks))
    return out, torch.cat(expected).reshape(6, hq * d), (q, kv, impl)


@pytest.mark.parametrize("kv_format", ["bf16", "fp8_e4m3", "mxfp8"])
@pytest.mark.parametrize("window,cap,sinks", [(None, None, False), (100, None, False), (100, 30.0, True)])
def test_forward_matches_the_float64_oracle(kv_format, window, cap, sinks):
    out, expected, _ = run_layer(kv_format, window, cap, sinks)
    err = (out[:6].double() - expected).abs().max().item()
    assert err < 2e-2, err  # bf16 output rounding of values of size ~1
    assert torch.equal(out[6], torch.full_like(out[6], 7.0))  # the padded row is left alone


def test_the_oracle_tells_a_window_from_full_attention():
    """The comparison above can fail: the same layer against the oracle without its window is far off."""
    out, _, (q, kv, impl) = run_layer("bf16", window=100)
    _, full, _ = run_layer("bf16", window=None)
    assert (out[:6].double() - full).abs().max().item() > 0.1


def test_mxfp8_store_writes_the_interleaved_scale_atoms():
    _, _, (_, kv, _) = run_layer("mxfp8")
    assert kv.layout.interleaved and tuple(kv.k_scales.shape) == (24, 2, 32, 4, 2)
    assert int((kv.k_scales[3] != 0).sum()) > 0  # block 3 holds request 0's first 128 keys


@pytest.mark.parametrize("kwargs,match", [
    (dict(alibi_slopes=[1.0] * 8), "ALiBi"),
    (dict(kv_sharing_target_layer_name="model.layers.0.self_attn.attn"), "cross-layer KV sharing"),
    (dict(attn_type="encoder_only"), "decoder attention"),
    (dict(kv_cache_dtype="fp8_e5m2"), "--kv-cache-dtype 'fp8_e5m2' is not served"),
    # vLLM's argument names, not the record's (LayerSpec.softmax_scale, LayerSpec.logit_cap)
    (dict(scale=3e38), r"scale \(the layer's softmax scale\) 3e\+38 overflows float32"),
    (dict(scale=0.0), r"scale \(the layer's softmax scale\) must be a finite number > 0"),
    (dict(logits_soft_cap=-30.0), r"logits_soft_cap must be a finite number >= 0, got -30.0"),
    (dict(sliding_window=0), r"sliding_window must be"),
    (dict(num_kv_heads=0), r"num_kv_heads must be"),
])
def test_impl_refuses_what_it_cannot_serve(kwargs, match):
    args = dict(num_heads=8, head_size=64, scale=0.125, num_kv_heads=2, alibi_slopes=None, sliding_window=None,
                kv_cache_dtype="auto")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        vb.InklingVllmImpl(**args)


def test_store_refuses_slots_outside_the_cache():
    impl = make_impl("bf16")
    layout = BlockCacheLayout("bf16", 2, 64, 16)
    cache = vllm_layer_view(layout, 2, dtype=torch.bfloat16)
    before = cache.clone()
    k = torch.zeros(2, 2, 64).bfloat16()
    with pytest.raises(ValueError, match="slot_mapping"):
        impl.do_kv_cache_update(SimpleNamespace(), k, k, cache, torch.tensor([3, 32]))
    assert torch.equal(cache, before)
