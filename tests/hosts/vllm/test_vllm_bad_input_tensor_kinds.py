"""Arguments of the wrong kind at the vLLM adapter (as tests/test_bad_input_tensor_kinds.py at the core): tensors on the meta device (the store, the forward, the
batch), a device torch cannot reach, and a batch whose per-request arrays no longer cover ``num_reqs`` (a field set
after construction). Host-free except the ``InklingVllmImpl`` test, which needs vLLM (skipped without it). Every
refusal names the argument and leaves the cache as it was; each test fails on the code before the fix."""

import importlib.util
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglang_inkling_backend.hosts.vllm.attention import LayerAttention
from sglang_inkling_backend.hosts.vllm.batch import VllmBatch
from sglang_inkling_backend.hosts.vllm.block_cache import BlockCacheLayout, vllm_layer_view

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the forward checks' geometry and batch
from test_vllm_forward_checks import BLOCK, BLOCKS, D, HKV, HQ, SPEC, batch  # noqa: E402
META = "holding data, got a tensor on the meta device"


def meta(t):
    return t.to("meta")


def layer_cache(fmt="bf16"):
    layer = LayerAttention(SPEC, fmt, torch.bfloat16)
    block = 128 if fmt == "mxfp8" else BLOCK
    cache = vllm_layer_view(BlockCacheLayout(fmt, HKV, D, block), BLOCKS,
                            dtype=torch.bfloat16 if fmt == "bf16" else torch.uint8)
    return layer, cache


def rows(n):
    return torch.randn(n, HKV, D, generator=torch.Generator().manual_seed(n)).bfloat16()


@pytest.mark.parametrize("fmt", ["bf16", "mxfp8"])
@pytest.mark.parametrize("which", ["key", "value", "slot_mapping"])
def test_the_store_refuses_meta_tensors_before_any_write(fmt, which):
    """Was: K or V on the meta device stored nothing for it, without an error (torch ignores a meta source in an
    indexed store); a meta slot_mapping a RuntimeError from its first read."""
    layer, cache = layer_cache(fmt)
    args = dict(key=rows(3), value=rows(3), slot_mapping=torch.tensor([130, 131, 300] if fmt == "mxfp8"
                                                                     else [17, 18, 40]))
    args[which] = meta(args[which])
    before = cache.clone()
    with pytest.raises(ValueError, match=rf"{which} must be .* {META}"):
        layer.store(args["key"], args["value"], cache, args["slot_mapping"])
    assert torch.equal(cache.view(torch.uint8), before.view(torch.uint8))


def test_the_store_and_forward_refuse_a_meta_cache():
    layer, cache = layer_cache()
    with pytest.raises(ValueError, match=rf"kv_cache must be vLLM's 4-D per-layer view .* {META}"):
        layer.store(rows(1), rows(1), meta(cache), torch.tensor([17]))
    with pytest.raises(ValueError, match=rf"kv_cache must be vLLM's 4-D per-layer view .* {META}"):
        layer.forward(torch.zeros(6, HQ * D).bfloat16(), meta(cache), batch(), torch.zeros(6, HQ * D))


@pytest.mark.parametrize("which", ["query", "output"])
def test_the_forward_refuses_a_meta_query_or_output(which):
    """Was: a meta output took the result silently (nothing computed), a meta query a RuntimeError."""
    layer, cache = layer_cache()
    args = dict(query=torch.randn(6, HQ * D).bfloat16(), output=torch.zeros(6, HQ * D).bfloat16())
    args[which] = meta(args[which])
    with pytest.raises(ValueError, match=rf"{which} must be .* {META}"):
        layer.forward(args["query"], cache, batch(), args["output"])


def test_the_forward_refuses_a_batch_that_is_not_a_vllm_batch():
    layer, cache = layer_cache()
    with pytest.raises(TypeError, match=r"batch must be a VllmBatch .* got NoneType"):  # was: AttributeError
        layer.forward(torch.zeros(6, HQ * D).bfloat16(), cache, None, torch.zeros(6, HQ * D))


@pytest.mark.parametrize("field, value, match", [
    ("seq_lens", torch.tensor([20, 5], dtype=torch.int32),
     r"seq_lens must be at least 3 entries long, one per request \(num_reqs\), got 2"),
    ("block_table", torch.tensor([[1, 2], [3, 0]], dtype=torch.int32),
     r"block_table must be at least 3 entries long, one per request \(num_reqs\), got 2"),
    ("num_reqs", 4, r"query_start_loc must be at least 5 entries long"),
    ("seq_lens", [20, 5, 10], r"seq_lens must be a 1-D int32/int64 tensor, got list"),
])
def test_a_batch_changed_after_construction_is_checked_before_it_is_read(field, value, match):
    """Was: IndexError inside VllmBatch.check_values (its per-request lists indexed by num_reqs)."""
    layer, cache = layer_cache()
    b = batch()
    setattr(b, field, value)
    with pytest.raises((ValueError, TypeError), match=match):
        b.check_values(BLOCKS)
    output = torch.zeros(6, HQ * D).bfloat16()
    with pytest.raises((ValueError, TypeError), match=match):
        layer.forward(torch.randn(6, HQ * D).bfloat16(), cache, b, output)
    assert not output.any()


def test_a_batch_refuses_meta_tensors_at_construction():
    with pytest.raises(ValueError, match=rf"seq_lens must be .* {META}"):
        batch(seq_lens=meta(torch.tensor([20, 5, 10], dtype=torch.int32)))


def test_a_layer_view_on_a_device_torch_cannot_reach_is_refused():
    unreachable = f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"
    for device in (unreachable, "meta"):
        with pytest.raises(ValueError, match=r"device must be a device that can hold data here"):
            vllm_layer_view(BlockCacheLayout("bf16", HKV, D, BLOCK), BLOCKS, device=device)


def test_sinks_on_the_meta_device_are_refused_when_the_layer_is_built():
    with pytest.raises(ValueError, match=rf"sinks must be .* {META}"):
        LayerAttention(SPEC, "bf16", torch.bfloat16, meta(torch.zeros(HQ)))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (the impl is vLLM's)")
@pytest.mark.parametrize("kv_cache", ["meta", "list"])
def test_do_kv_cache_update_refuses_a_cache_without_data_before_picking_a_route(monkeypatch, kv_cache):
    """``InklingVllmImpl.do_kv_cache_update`` reads the cache's device to pick the route: a meta cache (was:
    NotImplementedError from a copy) or a list (was: AttributeError) is refused by name first."""
    from sglang_inkling_backend.hosts.vllm import backend as vb

    config = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16))
    monkeypatch.setattr(vb, "get_current_vllm_config", lambda: config)
    impl = vb.InklingVllmImpl(HQ, D, 1 / math.sqrt(D), HKV, None, None, "auto")
    layer_, cache = layer_cache()
    bad = meta(cache) if kv_cache == "meta" else cache.tolist()
    with pytest.raises((ValueError, TypeError), match=r"kv_cache must be vLLM's 4-D per-layer view"):
        impl.do_kv_cache_update(SimpleNamespace(), rows(2), rows(2), bad, torch.tensor([17, 18]))
    with pytest.raises(ValueError, match=rf"key must be .* {META}"):
        impl.do_kv_cache_update(SimpleNamespace(), meta(rows(2)), rows(2), cache, torch.tensor([17, 18]))
    impl.do_kv_cache_update(SimpleNamespace(), rows(2), rows(2), cache, torch.tensor([17, 18]))  # valid
    assert torch.equal(layer_.paged_kv(cache).k_buffer[17], rows(2)[0])
