"""The vLLM adapter's K/V store (``hosts/vllm/attention.LayerAttention.store``, host-free: no vLLM needed) checks
every argument before its first write: a bad ``slot_mapping`` (below -1, past the cache, a slot twice, float, bool,
2-D) or K/V rows that do not cover it raise a ValueError/TypeError naming it, and the cache is unchanged. Valid
padding (-1) goes to the null block; K/V rows past the mapping (vLLM's padding) are not written."""

import pytest
import torch

from sglang_inkling_backend.hosts.vllm.attention import LayerAttention
from sglang_inkling_backend.hosts.vllm.block_cache import BlockCacheLayout, vllm_layer_view
from sglang_inkling_backend.layer_plan import LayerSpec

HKV, D, BLOCK, BLOCKS = 2, 32, 16, 3


def layer_and_cache():
    spec = LayerSpec(window=None, num_q_heads=4, num_kv_heads=HKV, head_dim=D, softmax_scale=D ** -0.5)
    layer = LayerAttention(spec, "bf16", torch.bfloat16)
    cache = vllm_layer_view(BlockCacheLayout("bf16", HKV, D, BLOCK), BLOCKS, dtype=torch.bfloat16)
    return layer, cache


def rows(n):
    return torch.arange(1, n * HKV * D + 1, dtype=torch.float32).reshape(n, HKV, D).bfloat16()


@pytest.mark.parametrize("slot_mapping, k_rows, error, match", [
    (torch.tensor([17, -2]), 2, ValueError,
     r"slot_mapping entries must be slots in \[0, 48\) or -1 \(padding\), got -2"),
    (torch.tensor([17, 48]), 2, ValueError, r"slot_mapping must be slots in \[0, 48\)"),
    (torch.tensor([17, 17]), 2, ValueError,
     r"slot_mapping must not name a slot twice in one write \(slots 0-15, the padding sink, excepted\), got slot 17 "
     r"2 times"),
    (torch.tensor([17.0, 18.0]), 2, TypeError, r"slot_mapping must be a 1-D int32/int64 tensor of slots, got "
                                               r"torch.float32"),
    (torch.tensor([True, False]), 2, TypeError, r"slot_mapping must be a 1-D int32/int64 tensor of slots, got "
                                                r"torch.bool"),
    (torch.tensor([[17, 18]]), 2, TypeError, r"slot_mapping must be a 1-D int32/int64 tensor"),
    (torch.tensor([17, 18, 19]), 2, ValueError, r"key must be \[tokens >= 3 \(slot_mapping's entries\)"),
])
def test_bad_store_arguments_raise_before_any_write(slot_mapping, k_rows, error, match):
    layer, cache = layer_and_cache()
    before = cache.clone()
    with pytest.raises(error, match=match):
        layer.store(rows(k_rows), rows(k_rows), cache, slot_mapping)
    assert torch.equal(cache, before)


def test_a_key_of_the_wrong_width_raises():
    layer, cache = layer_and_cache()
    with pytest.raises(ValueError, match=r"key must be \[tokens >= 1 .*, 2, 32\] or \[tokens, 64\], got \(1, 3, 32\)"):
        layer.store(torch.zeros(1, 3, D).bfloat16(), torch.zeros(1, 3, D).bfloat16(), cache, torch.tensor([5]))


def test_padding_goes_to_the_null_block_and_padded_rows_are_not_written():
    layer, cache = layer_and_cache()
    k = rows(4)  # 4 rows, 3 mapped: vLLM pads K/V past num_actual_tokens
    layer.store(k, k, cache, torch.tensor([17, -1, 40]))
    kv = layer.paged_kv(cache)
    assert torch.equal(kv.k_buffer[17], k[0]) and torch.equal(kv.k_buffer[40], k[2])
    written = (kv.k_buffer != 0).flatten(1).any(1).nonzero().flatten().tolist()
    assert written == [0, 17, 40]  # slot 0 (the null block) took the padding row; row 3 went nowhere
    assert torch.equal(kv.k_buffer[0], k[1])


def test_the_mapping_is_read_and_padded_once_per_step(monkeypatch):
    """Every layer of a step stores at the step's one mapping: it is read (a device sync on an accelerator) and
    padded once for all layers, on every device; a refill with a version bump, or any refill after ``new_step``
    (the metadata builder's first act each step), is read again."""
    from sglang_inkling_backend import checks
    from sglang_inkling_backend.hosts.vllm import attention
    calls, pads = [], []
    real, real_pad = checks.require_slots, attention.padded_slots
    monkeypatch.setattr(checks, "require_slots", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(attention, "padded_slots", lambda m: pads.append(1) or real_pad(m))
    LayerAttention.new_step()
    layer, cache = layer_and_cache()
    other, cache2 = layer_and_cache()
    mapping = torch.tensor([3, 4])
    for each, c in ((layer, cache), (other, cache2)):  # two layers of one step, one mapping tensor
        each.store(rows(2), rows(2), c, mapping)
    assert (len(calls), len(pads)) == (1, 1)
    assert torch.equal(layer.paged_kv(cache).k_buffer[3:5], other.paged_kv(cache2).k_buffer[3:5])
    mapping.copy_(torch.tensor([5, 48]))  # refilled in place with a version bump: checked again
    with pytest.raises(ValueError, match="slot_mapping"):
        layer.store(rows(2), rows(2), cache, mapping)
    mapping.numpy()[1] = 48  # refilled without a version bump (a kernel's write): read again after new_step
    LayerAttention.new_step()
    with pytest.raises(ValueError, match="slot_mapping"):
        layer.store(rows(2), rows(2), cache, mapping)


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

DEFECTS = (None, "below_padding", "past_cache", "twice", "float", "short_key")


@settings(derandomize=True, database=None, deadline=None, max_examples=80,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_store_property_raises_before_writing_or_writes_exactly(data):
    """Each example: a slot mapping over the cache's non-null blocks with some padding, and at most one defect. A
    defective call raises ValueError/TypeError with the cache byte-identical; a valid one writes each mapped row at
    its slot (padding rows at the null block) and nothing else outside the null block."""
    layer, cache = layer_and_cache()
    n = data.draw(st.integers(1, 12))
    slots = data.draw(st.lists(st.integers(BLOCK, BLOCK * BLOCKS - 1), min_size=n, max_size=n, unique=True))
    padding = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    mapping = torch.tensor([-1 if pad else s for s, pad in zip(slots, padding)])
    defect = data.draw(st.sampled_from(DEFECTS))
    k_rows = n + data.draw(st.integers(0, 2))  # vLLM may pad K/V past the mapping
    if defect == "below_padding":
        mapping[data.draw(st.integers(0, n - 1))] = data.draw(st.integers(-100, -2))
    elif defect == "past_cache":
        mapping[data.draw(st.integers(0, n - 1))] = data.draw(st.integers(BLOCK * BLOCKS, 10 ** 6))
    elif defect == "twice" and n >= 2:
        mapping[1] = mapping[0] = slots[0]
    elif defect == "float":
        mapping = mapping.float()
    elif defect == "short_key":
        k_rows = n - 1
    else:
        defect = None
    k = rows(max(k_rows, 0)) if k_rows > 0 else torch.zeros(0, HKV, D).bfloat16()
    before = cache.clone()
    if defect is not None:
        with pytest.raises((ValueError, TypeError)):
            layer.store(k, k, cache, mapping)
        assert torch.equal(cache, before)
        return
    layer.store(k, k, cache, mapping)
    kv = layer.paged_kv(cache)
    want = torch.zeros_like(kv.k_buffer)
    for row, slot in enumerate(mapping.tolist()):
        if slot >= 0:
            want[slot] = k[row]
    assert torch.equal(kv.k_buffer[BLOCK:], want[BLOCK:]) and torch.equal(kv.v_buffer[BLOCK:], want[BLOCK:])
