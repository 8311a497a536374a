"""The vLLM layer code on the Triton route, on the CPU under Triton's interpreter (small shapes; the GPU run is
test_vllm_graph_gpu.py): a mixed batch over vLLM's block layout, decodes through the page table and a chunked
prefill through the extend kernel, against the torch route on the same cache. K/V are written by the torch
quantizer (the interpreter's fp32 -> e4m3 cast is wrong at ties: ../shared/spec/mxfp8-kv.md)."""
import math

import pytest
import torch

from sglang_inkling_backend.hosts.vllm.attention import LayerAttention
from sglang_inkling_backend.hosts.vllm.batch import VllmBatch
from sglang_inkling_backend.hosts.vllm.block_cache import BlockCacheLayout, vllm_layer_view
from sglang_inkling_backend.layer_plan import LayerSpec
from sglang_inkling_backend.routes import TorchRoute, load_route_module

family, why = load_route_module("sglang_inkling_backend.gpu.route")
pytestmark = pytest.mark.skipif(family is None, reason=f"Triton is not available: {why}")

HQ, HKV, D = 4, 1, 32


@pytest.mark.parametrize("kv_format,block_size", [("bf16", 16), ("mxfp8", 128)])
@pytest.mark.parametrize("window", [None, 24])
def test_triton_route_matches_torch_route_on_vllms_layout(kv_format, block_size, window):
    from sglang_inkling_backend.gpu.route import GpuRoute

    g = torch.Generator().manual_seed(2)
    spec = LayerSpec(window=window, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, softmax_scale=1 / math.sqrt(D))
    attention = LayerAttention(spec, kv_format, torch.bfloat16)
    layout = BlockCacheLayout(kv_format, HKV, D, block_size)
    seq_lens, query_lens = [150, 9, 40], [1, 1, 5]
    blocks_per_row = -(-max(seq_lens) // block_size)
    num_blocks = 3 * blocks_per_row + 1  # distinct blocks per row, block 0 (vLLM's null block) unused
    cache = vllm_layer_view(layout, num_blocks, dtype=torch.bfloat16 if kv_format == "bf16" else torch.uint8)
    table = (torch.randperm(num_blocks - 1, generator=g) + 1).view(3, blocks_per_row).to(torch.int32)
    slots = torch.cat([table[r, torch.arange(n) // block_size].long() * block_size + torch.arange(n) % block_size
                       for r, n in enumerate(seq_lens)])
    attention.store(torch.randn(slots.numel(), HKV, D, generator=g).bfloat16(),
                    torch.randn(slots.numel(), HKV, D, generator=g).bfloat16(), cache, slots)
    qsl = torch.tensor([0, 1, 2, 7], dtype=torch.int32)
    q = torch.randn(7, HQ * D, generator=g).bfloat16()
    triton_route = GpuRoute()
    outs = {}
    for route in (triton_route, TorchRoute()):
        workspace = route.make_workspace(max_batch=3, geometries={(HQ, HKV, D)}, max_seq_len=160,
                                         device=torch.device("cpu"))
        batch = VllmBatch(num_reqs=3, num_actual_tokens=7, num_decodes=2, num_decode_tokens=2, query_start_loc=qsl,
                          seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_table=table,
                          slot_mapping=torch.zeros(7, dtype=torch.int64), block_size=block_size, max_seq_len=160,
                          workspace=workspace, route=route)
        outs[route.name] = attention.forward(q, cache, batch, torch.zeros(7, HQ * D, dtype=torch.bfloat16))
    err = (outs["triton"].float() - outs["torch"].float()).abs().max().item()
    assert err < 2e-2, err
    assert outs["torch"].abs().max() > 0.05  # the comparison is over real outputs, not zeros


def test_decode_and_extend_rows_plan_once_per_step_and_group_with_the_bytes_of_per_layer_plans(monkeypatch):
    """Three layers (two full, one windowed) over vLLM's block layout, a mixed batch, on the Triton route: the step's
    decode and extend rows are planned once per layer group (two groups, by each group's first layer) and every
    layer's output has the bytes of the same layer planning for itself."""
    from sglang_inkling_backend import triton as kernels
    from sglang_inkling_backend.gpu.route import GpuRoute

    class PerLayerPlans(GpuRoute):
        def plan_decode_group(self, *args, **kwargs):
            return None

        def plan_extend_group(self, *args, **kwargs):
            return None

    plans = []
    real = kernels.decode_attention.plan_decode
    monkeypatch.setattr(kernels, "plan_decode", lambda *a, **k: plans.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(4)
    block_size = 16
    specs = [LayerSpec(window=w, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, softmax_scale=1 / math.sqrt(D))
             for w in (None, None, 24)]
    layers = [LayerAttention(spec, "bf16", torch.bfloat16) for spec in specs]
    layout = BlockCacheLayout("bf16", HKV, D, block_size)
    seq_lens, query_lens = [150, 9, 40], [1, 1, 5]
    blocks_per_row = -(-max(seq_lens) // block_size)
    num_blocks = 3 * blocks_per_row + 1
    caches = [vllm_layer_view(layout, num_blocks, dtype=torch.bfloat16) for _ in layers]
    table = (torch.randperm(num_blocks - 1, generator=g) + 1).view(3, blocks_per_row).to(torch.int32)
    slots = torch.cat([table[r, torch.arange(n) // block_size].long() * block_size + torch.arange(n) % block_size
                       for r, n in enumerate(seq_lens)])
    for layer, cache in zip(layers, caches):
        layer.store(torch.randn(slots.numel(), HKV, D, generator=g).bfloat16(),
                    torch.randn(slots.numel(), HKV, D, generator=g).bfloat16(), cache, slots)
    qsl = torch.tensor([0, 1, 2, 7], dtype=torch.int32)
    q = torch.randn(7, HQ * D, generator=g).bfloat16()
    outs, counts, batches = {}, {}, {}
    for route in (GpuRoute(), PerLayerPlans()):
        workspace = route.make_workspace(max_batch=3, geometries={(HQ, HKV, D)}, max_seq_len=160,
                                         device=torch.device("cpu"))
        batch = VllmBatch(num_reqs=3, num_actual_tokens=7, num_decodes=2, num_decode_tokens=2, query_start_loc=qsl,
                          seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_table=table,
                          slot_mapping=torch.zeros(7, dtype=torch.int64), block_size=block_size, max_seq_len=160,
                          workspace=workspace, route=route)
        before = len(plans)
        outs[type(route).__name__] = [layer.forward(q, cache, batch, torch.zeros(7, HQ * D, dtype=torch.bfloat16))
                                      for layer, cache in zip(layers, caches)]
        counts[type(route).__name__] = len(plans) - before
        batches[type(route).__name__] = batch
    assert counts == {"GpuRoute": 2, "PerLayerPlans": 2}  # one Triton plan per window either way (the step's cache)
    groups = batches["GpuRoute"]._decode_groups  # made by each group's first layer, run by the others
    assert len(groups) == 2 and {plan.window for plan in groups.values()} == {None, 24}
    assert list(batches["PerLayerPlans"]._decode_groups.values()) == [None, None]
    groups = batches["GpuRoute"]._extend_groups  # the prefill rows' plans, the same way
    assert len(groups) == 2 and {plan.window for plan in groups.values()} == {None, 24}
    assert all(plan.rows == 5 for plan in groups.values())
    assert list(batches["PerLayerPlans"]._extend_groups.values()) == [None, None]
    assert all(torch.equal(a, b) for a, b in zip(outs["GpuRoute"], outs["PerLayerPlans"]))
    assert not torch.equal(outs["GpuRoute"][0][:2], outs["GpuRoute"][2][:2])  # the window changes the decode rows
