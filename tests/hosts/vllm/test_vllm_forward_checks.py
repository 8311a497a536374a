"""The vLLM adapter's layer (``hosts/vllm/attention.LayerAttention``, host-free) refuses what the re-probe of the
bad-input issue found it taking (bench/results/current/bad-input-probe/), in vLLM's words and before any write:
the batch's values (``query_start_loc``, ``seq_lens``, ``block_table``) once per step, the query and output shapes,
sinks and per-tensor scales at binding; and an empty step's store is valid."""

import math

import pytest
import torch

from sglang_inkling_backend.hosts.vllm.attention import LayerAttention
from sglang_inkling_backend.hosts.vllm.batch import VllmBatch
from sglang_inkling_backend.hosts.vllm.block_cache import BlockCacheLayout, vllm_layer_view
from sglang_inkling_backend.layer_plan import LayerSpec
from sglang_inkling_backend.routes import TorchRoute

HQ, HKV, D, BLOCK, BLOCKS = 4, 2, 32, 16, 8
SPEC = LayerSpec(window=None, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, softmax_scale=1 / math.sqrt(D))


def batch(**changes):
    """Two decodes (20 and 5 keys) and a 4-token prefill over 10 keys; blocks 1-4 hold them."""
    fields = dict(num_reqs=3, num_actual_tokens=6, num_decodes=2, num_decode_tokens=2,
                  query_start_loc=torch.tensor([0, 1, 2, 6], dtype=torch.int32),
                  seq_lens=torch.tensor([20, 5, 10], dtype=torch.int32),
                  block_table=torch.tensor([[1, 2], [3, 0], [4, 0]], dtype=torch.int32),
                  slot_mapping=torch.zeros(6, dtype=torch.int64), block_size=BLOCK, max_seq_len=32,
                  route=TorchRoute())
    fields.update(changes)
    return VllmBatch(**fields)


def layer_cache():
    layer = LayerAttention(SPEC, "bf16", torch.bfloat16)
    cache = vllm_layer_view(BlockCacheLayout("bf16", HKV, D, BLOCK), BLOCKS, dtype=torch.bfloat16)
    cache.normal_(generator=torch.Generator().manual_seed(0))
    return layer, cache


def test_a_valid_batch_is_served():
    layer, cache = layer_cache()
    out = layer.forward(torch.randn(6, HQ * D).bfloat16(), cache, batch(), torch.zeros(6, HQ * D).bfloat16())
    assert out.abs().max() > 0.05


@pytest.mark.parametrize("changes, match", [
    (dict(block_table=torch.tensor([[1, 9], [3, 0], [4, 0]], dtype=torch.int32)),
     r"block_table entries that seq_lens reach must be blocks of the cache in \[0, 8\), got 9"),
    (dict(block_table=torch.tensor([[1, 2], [-1, 0], [4, 0]], dtype=torch.int32)),
     r"block_table entries .* got -1"),
    (dict(seq_lens=torch.tensor([20, 5, 2], dtype=torch.int32)),
     r"seq_lens\[2\]=2 is shorter than request 2's 4 query tokens"),
    (dict(seq_lens=torch.tensor([20, -3, 10], dtype=torch.int32)), r"seq_lens must be >= 0, got seq_lens\[1\]=-3"),
    (dict(query_start_loc=torch.tensor([0, 2, 2, 6], dtype=torch.int32)),
     r"query_start_loc must begin 0, 1, \.\.\., 2"),
    (dict(query_start_loc=torch.tensor([1, 2, 3, 7], dtype=torch.int32)), r"query_start_loc must start at 0"),
    (dict(query_start_loc=torch.tensor([0, 1, 2, 5], dtype=torch.int32)),
     r"query_start_loc must .* end at num_actual_tokens \(6\)"),
    (dict(seq_lens=torch.tensor([40, 5, 10], dtype=torch.int32)), r"seq_lens\[0\]=40 needs 3 blocks of 16"),
])
def test_bad_batch_values_are_refused_in_vllms_words_before_any_write(changes, match):
    layer, cache = layer_cache()
    output = torch.full((6, HQ * D), 7.0).bfloat16()
    with pytest.raises(ValueError, match=match):
        layer.forward(torch.randn(6, HQ * D).bfloat16(), cache, batch(**changes), output)
    assert bool((output == 7.0).all())  # no decode row written before the refusal


@pytest.mark.parametrize("query, output, error, match", [
    (torch.zeros(6, 100), torch.zeros(6, HQ * D), ValueError, r"query must be \[tokens >= 6"),
    (torch.zeros(5, HQ * D), torch.zeros(6, HQ * D), ValueError, r"query must be \[tokens >= 6"),
    (torch.zeros(6, HQ * D), torch.zeros(4, HQ * D), ValueError, r"output must be \[tokens >= 6"),
    (torch.zeros(6, HQ * D), torch.zeros(6, HQ * D, dtype=torch.int32), TypeError,
     "output must be a floating-point tensor"),
    (torch.zeros(6, HQ * D, dtype=torch.int32), torch.zeros(6, HQ * D), TypeError,
     "query must be a floating-point tensor"),
])
def test_bad_query_or_output_is_refused(query, output, error, match):
    layer, cache = layer_cache()
    with pytest.raises(error, match=match):
        layer.forward(query, cache, batch(), output)


def test_a_kv_cache_that_is_not_a_tensor_is_refused():
    layer, cache = layer_cache()
    with pytest.raises(ValueError, match="kv_cache must be vLLM's 4-D per-layer view"):
        layer.forward(torch.zeros(6, HQ * D), [cache], batch(), torch.zeros(6, HQ * D))


@pytest.mark.parametrize("sinks, match", [
    (torch.zeros(3), r"sinks must be a floating-point tensor of shape \[4\]"),
    ([0.0] * 4, r"sinks must be a floating-point tensor of shape \[4\]"),
])
def test_misshapen_sinks_are_refused_when_the_layer_is_built(sinks, match):
    with pytest.raises(ValueError, match=match):
        LayerAttention(SPEC, "bf16", torch.bfloat16, sinks=sinks)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_sinks_are_refused_at_the_first_forward_not_at_construction(bad):
    """vLLM builds the layer before it loads the weights (the sinks may be torch.empty then): their values are read
    at the first forward, once per tensor version, before any write; a reload through torch (copy_) is read again."""
    layer, cache = layer_cache()
    sinks = torch.full((HQ,), 0.5, dtype=torch.bfloat16)
    layer = LayerAttention(SPEC, "bf16", torch.bfloat16, sinks=torch.full((HQ,), float("nan")))  # not refused
    layer.sinks = sinks
    query, out = torch.randn(6, HQ * D).bfloat16(), torch.zeros(6, HQ * D).bfloat16()
    assert layer.forward(query, cache, batch(), out).isfinite().all()
    with torch.no_grad():
        sinks[1] = bad  # bumps the version
    out = torch.zeros(6, HQ * D).bfloat16()
    with pytest.raises(ValueError, match="sinks must be finite"):
        layer.forward(query, cache, batch(), out)
    assert not out.any()


@pytest.mark.parametrize("args, error, match", [
    ((None, "bf16", torch.bfloat16), TypeError, "spec must be a LayerSpec"),
    ((SPEC, "fp4", torch.bfloat16), ValueError, "kv_format must be one of"),
    ((SPEC, "bf16", "bfloat16"), TypeError, "model_dtype must be a floating-point torch.dtype"),
])
def test_bad_layer_arguments_are_refused_when_the_layer_is_built(args, error, match):
    with pytest.raises(error, match=match):
        LayerAttention(*args)


@pytest.mark.parametrize("scale, error", [("2.0", TypeError), (True, TypeError), (0.0, ValueError),
                                          (float("nan"), ValueError)])
def test_fp8_scales_are_numbers(scale, error):
    layer = LayerAttention(SPEC, "fp8_e4m3", torch.bfloat16)
    with pytest.raises(error, match="k_scale must be a finite number > 0"):
        layer.bind_fp8_scales(scale, 1.0)
    layer.bind_fp8_scales(2.0, 0.5)
    assert (layer.spec.k_scale, layer.spec.v_scale) == (2.0, 0.5)


def test_an_empty_step_stores_nothing():
    layer, cache = layer_cache()
    before = cache.clone()
    empty = torch.zeros(0, HKV, D).bfloat16()
    layer.store(empty, empty, cache, torch.zeros(0, dtype=torch.int64))  # was: refused as a bad key shape
    assert torch.equal(cache, before)


def test_what_vllm_leaves_unread_is_not_refused():
    """A decode of 0 keys is vLLM's CUDA-graph padding row; a windowed layer does not read the blocks before its
    window (vLLM may have freed them)."""
    padded = batch(seq_lens=torch.tensor([20, 0, 10], dtype=torch.int32))
    padded.check_values(BLOCKS)
    stale = batch(block_table=torch.tensor([[9999, 2], [3, 0], [4, 0]], dtype=torch.int32))
    stale.check_values(BLOCKS, window=4)  # request 0: keys 16-19 only, in block 2
    with pytest.raises(ValueError, match="block_table entries that seq_lens reach must be blocks"):
        stale.check_values(BLOCKS)


@pytest.mark.parametrize("window", [None, 4])
def test_a_padding_decode_row_is_served_on_the_torch_route_without_changing_the_others(window):
    """vLLM's CUDA-graph padding row (a decode of 0 keys) is read as one key, its table's first block, on the torch
    route as on the page-table route (``VllmBatch.decode_pages``): the other rows' outputs are the bytes of the same
    step with that row given 5 real keys, and a padding row whose first block is past the cache is refused."""
    spec = LayerSpec(window=window, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, softmax_scale=1 / math.sqrt(D))
    layer = LayerAttention(spec, "bf16", torch.bfloat16)
    _, cache = layer_cache()
    query = torch.randn(6, HQ * D, generator=torch.Generator().manual_seed(1)).bfloat16()
    padded = layer.forward(query, cache, batch(seq_lens=torch.tensor([20, 0, 10], dtype=torch.int32)),
                           torch.zeros(6, HQ * D).bfloat16())
    real = layer.forward(query, cache, batch(), torch.zeros(6, HQ * D).bfloat16())
    assert torch.equal(padded[[0, 2, 3, 4, 5]], real[[0, 2, 3, 4, 5]])
    assert not torch.equal(padded[1], real[1])  # the padding row read 1 key, not request 1's 5
    past = batch(seq_lens=torch.tensor([20, 0, 10], dtype=torch.int32),
                 block_table=torch.tensor([[1, 2], [9, 0], [4, 0]], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"block_table entries that seq_lens reach.* got 9"):
        layer.forward(query, cache, past, torch.zeros(6, HQ * D).bfloat16())


def test_a_slot_mapping_refilled_in_place_is_checked_again():
    """A mapping refilled through its numpy view keeps its torch version, as vLLM's mapping buffer refilled by a
    kernel does: the step's memo is emptied by ``new_step`` (the metadata builder's first act), and the next store
    reads it again, refusing it before anything is written."""
    layer, cache = layer_cache()
    rows = torch.randn(3, HKV, D).bfloat16()
    mapping = torch.tensor([17, 18, 40])
    layer.store(rows, rows, cache, mapping)
    before = cache.clone()
    mapping.numpy()[1] = BLOCKS * BLOCK  # one past the cache, no version bump
    assert LayerAttention._step_slots
    LayerAttention.new_step()
    assert not LayerAttention._step_slots
    with pytest.raises(ValueError, match=r"slot_mapping .* \[0, 128\)"):
        layer.store(rows, rows, cache, mapping)
    assert torch.equal(cache, before)


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings, strategies as st  # noqa: E402

FORWARD_DEFECTS = (None, "block_past_cache", "block_negative", "seq_negative", "prefill_seq_below_query",
                   "seq_past_table", "qsl_decode_gap", "qsl_not_from_0", "qsl_end")


def _dense(q, k, v, n_keys, qlen):
    """float64 attention of q [qlen, HQ, D] (the last qlen positions) over k, v [n_keys, HKV, D]."""
    k, v = k.double().repeat_interleave(HQ // HKV, 1), v.double().repeat_interleave(HQ // HKV, 1)
    s = torch.einsum("qhd,khd->qhk", q.double(), k) * D ** -0.5
    dist = torch.arange(n_keys - qlen, n_keys)[:, None] - torch.arange(n_keys)[None, :]
    s = s.masked_fill((dist < 0)[:, None, :], float("-inf"))
    return torch.einsum("qhk,khd->qhd", torch.softmax(s, -1), v)


@settings(derandomize=True, database=None, deadline=None, max_examples=60,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_forward_property_refuses_before_writing_or_matches_float64(data):
    """Each example: decodes then prefills over blocks of a bf16 cache, and at most one defect in the batch's values.
    A defective batch raises ValueError naming a vLLM argument with the output untouched; a valid one matches the
    float64 attention of each request's keys (the prefills' own keys from the forward, as stored)."""
    layer, cache = layer_cache()
    num_decodes = data.draw(st.integers(0, 2))
    qlens = [1] * num_decodes + data.draw(st.lists(st.integers(2, 5), min_size=0 if num_decodes else 1, max_size=2))
    seq_lens = [data.draw(st.integers(q, 2 * BLOCK)) for q in qlens]
    free = list(range(1, BLOCKS))  # block 0 is vLLM's null block
    table = torch.zeros(len(qlens), 2, dtype=torch.int32)
    for r, n in enumerate(seq_lens):
        for b in range(-(-n // BLOCK)):
            table[r, b] = free.pop(data.draw(st.integers(0, len(free) - 1)))
    n_tokens = sum(qlens)
    qsl = torch.tensor([0] + qlens, dtype=torch.int32).cumsum(0).to(torch.int32)
    seqs = torch.tensor(seq_lens, dtype=torch.int32)
    defect = data.draw(st.sampled_from(FORWARD_DEFECTS))
    prefills = [r for r in range(len(qlens)) if r >= num_decodes]
    if defect == "block_past_cache":
        table[0, 0] = data.draw(st.integers(BLOCKS, 10 ** 4))
    elif defect == "block_negative":
        table[0, 0] = -1
    elif defect == "seq_negative":
        seqs[0] = -1
    elif defect == "prefill_seq_below_query" and prefills:
        seqs[prefills[0]] = qlens[prefills[0]] - 1
    elif defect == "seq_past_table":
        seqs[0] = 2 * BLOCK + 1
    elif defect == "qsl_decode_gap" and num_decodes and len(qlens) >= 2:
        qsl[1] += 1  # decode 0 given two query rows, the next request one fewer
    elif defect == "qsl_not_from_0":
        qsl += 1
    elif defect == "qsl_end":
        qsl[-1] -= 1
    else:
        defect = None
    event(f"defect: {defect}")
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 1000)))
    query = torch.randn(n_tokens, HQ * D, generator=g).bfloat16()
    out = torch.full((n_tokens, HQ * D), 7.0, dtype=torch.bfloat16)
    b = batch(num_reqs=len(qlens), num_actual_tokens=n_tokens, num_decodes=num_decodes,
              num_decode_tokens=num_decodes, query_start_loc=qsl, seq_lens=seqs, block_table=table,
              slot_mapping=torch.zeros(n_tokens, dtype=torch.int64), max_seq_len=2 * BLOCK + 2)
    if defect is not None:
        with pytest.raises(ValueError, match=r"block_table|seq_lens|query_start_loc|num_actual_tokens"):
            layer.forward(query, cache, b, out)
        assert torch.equal(out, torch.full_like(out, 7.0))
        return
    # the prefills' own keys: what the model computed, stored in the cache at their slots
    key = torch.zeros(n_tokens, HKV, D).bfloat16()
    value = torch.zeros(n_tokens, HKV, D).bfloat16()
    kv = layer.paged_kv(cache)
    for r in range(len(qlens)):
        slots = [int(table[r, p // BLOCK]) * BLOCK + p % BLOCK for p in range(seq_lens[r])]
        rows = range(int(qsl[r]), int(qsl[r + 1]))
        for row, slot in zip(rows, slots[-qlens[r]:]):
            key[row], value[row] = kv.k_buffer[slot], kv.v_buffer[slot]
    layer.forward(query, cache, b, out, key, value)
    for r in range(len(qlens)):
        slots = torch.tensor([int(table[r, p // BLOCK]) * BLOCK + p % BLOCK for p in range(seq_lens[r])])
        rows = slice(int(qsl[r]), int(qsl[r + 1]))
        want = _dense(query[rows].view(-1, HQ, D), kv.k_buffer[slots], kv.v_buffer[slots], seq_lens[r], qlens[r])
        got = out[rows].view(-1, HQ, D).double()
        assert (got - want).abs().max() < 2e-2  # bf16 output of values of size ~1
