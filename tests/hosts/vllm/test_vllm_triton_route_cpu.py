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


SEQ_LENS = [150, 9, 40]  # a mixed batch: two decodes, then a 5-token chunk over 35 cached keys
QUERY_START_LOC = [0, 1, 2, 7]


def stored_caches(layers, kv_format, block_size, g):
    """One vLLM cache view per layer, the batch's keys stored in randomly ordered blocks (block 0, vLLM's null
    block, unused), and their block table."""
    layout = BlockCacheLayout(kv_format, HKV, D, block_size)
    blocks_per_row = -(-max(SEQ_LENS) // block_size)
    num_blocks = 3 * blocks_per_row + 1
    caches = [vllm_layer_view(layout, num_blocks, dtype=torch.bfloat16 if kv_format == "bf16" else torch.uint8)
              for _ in layers]
    table = (torch.randperm(num_blocks - 1, generator=g) + 1).view(3, blocks_per_row).to(torch.int32)
    slots = torch.cat([table[r, torch.arange(n) // block_size].long() * block_size + torch.arange(n) % block_size
                       for r, n in enumerate(SEQ_LENS)])
    for layer, cache in zip(layers, caches):
        layer.store(torch.randn(slots.numel(), HKV, D, generator=g).bfloat16(),
                    torch.randn(slots.numel(), HKV, D, generator=g).bfloat16(), cache, slots)
    return caches, table


def mixed_batch(route, table, block_size):
    workspace = route.make_workspace(max_batch=3, geometries={(HQ, HKV, D)}, max_seq_len=160,
                                     device=torch.device("cpu"))
    return VllmBatch(num_reqs=3, num_actual_tokens=7, num_decodes=2, num_decode_tokens=2,
                     query_start_loc=torch.tensor(QUERY_START_LOC, dtype=torch.int32),
                     seq_lens=torch.tensor(SEQ_LENS, dtype=torch.int32), block_table=table,
                     slot_mapping=torch.zeros(7, dtype=torch.int64), block_size=block_size, max_seq_len=160,
                     workspace=workspace, route=route)


def layer_spec(window):
    return LayerSpec(window=window, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, softmax_scale=1 / math.sqrt(D))


@pytest.mark.parametrize("kv_format,block_size", [("bf16", 16), ("mxfp8", 128)])
@pytest.mark.parametrize("window", [None, 24])
def test_triton_route_matches_torch_route_on_vllms_layout(kv_format, block_size, window):
    from sglang_inkling_backend.gpu.route import GpuRoute

    g = torch.Generator().manual_seed(2)
    attention = LayerAttention(layer_spec(window), kv_format, torch.bfloat16)
    (cache,), table = stored_caches([attention], kv_format, block_size, g)
    q = torch.randn(7, HQ * D, generator=g).bfloat16()
    outs = {}
    for route in (GpuRoute(), TorchRoute()):
        outs[route.name] = attention.forward(q, cache, mixed_batch(route, table, block_size),
                                             torch.zeros(7, HQ * D, dtype=torch.bfloat16))
    err = (outs["triton"].float() - outs["torch"].float()).abs().max().item()
    assert err < 2e-2, err
    assert outs["torch"].abs().max() > 0.05  # the comparison is over real outputs, not zeros


def test_decode_and_extend_rows_plan_once_per_step_and_group_with_the_bytes_of_per_layer_plans(monkeypatch):
    """Three layers (two full, one windowed) over vLLM's block layout, a mixed batch, on the Triton route: the step's
    decode and extend rows are planned once per layer group (two groups, by each group's first layer) and every
    layer's output has the bytes of the same layer planning for itself."""
    from sglang_inkling_backend import triton as kernels
    from sglang_inkling_backend.gpu.route import GpuRoute

    class Recording(GpuRoute):
        def __init__(self, group_plans: bool):
            super().__init__()
            self.group_plans, self.made = group_plans, {"decode": [], "extend": []}

        def plan_decode_group(self, *args, **kwargs):
            plan = super().plan_decode_group(*args, **kwargs) if self.group_plans else None
            self.made["decode"].append(plan)
            return plan

        def plan_extend_group(self, *args, **kwargs):
            plan = super().plan_extend_group(*args, **kwargs) if self.group_plans else None
            self.made["extend"].append(plan)
            return plan

    triton_plans = []
    real = kernels.decode_attention.plan_decode
    monkeypatch.setattr(kernels, "plan_decode", lambda *a, **k: triton_plans.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(4)
    block_size = 16
    layers = [LayerAttention(layer_spec(w), "bf16", torch.bfloat16) for w in (None, None, 24)]
    caches, table = stored_caches(layers, "bf16", block_size, g)
    q = torch.randn(7, HQ * D, generator=g).bfloat16()
    grouped, per_layer = Recording(True), Recording(False)
    outs, counts = {}, {}
    for route in (grouped, per_layer):
        batch = mixed_batch(route, table, block_size)  # one step, every layer
        before = len(triton_plans)
        outs[route] = [layer.forward(q, cache, batch, torch.zeros(7, HQ * D, dtype=torch.bfloat16))
                       for layer, cache in zip(layers, caches)]
        counts[route.group_plans] = len(triton_plans) - before
    assert counts == {True: 2, False: 2}  # one Triton plan per window either way (the step's cache)
    # one plan per group and row kind, made by the group's first layer, run by the others
    for kind in ("decode", "extend"):
        assert {plan.window for plan in grouped.made[kind]} == {None, 24} and len(grouped.made[kind]) == 2
        assert per_layer.made[kind] == [None, None]
    assert all(plan.rows == 5 for plan in grouped.made["extend"])
    assert all(torch.equal(a, b) for a, b in zip(outs[grouped], outs[per_layer]))
    assert not torch.equal(outs[grouped][0][:2], outs[grouped][2][:2])  # the window changes the decode rows


@pytest.mark.parametrize("kv_format,block_size", [("bf16", 16), ("mxfp8", 128)])
def test_a_mixed_steps_kernels_write_the_hosts_output_rows(kv_format, block_size):
    """With the step's group plans the decode and extend kernels write vLLM's output rows themselves (what they
    return is those rows: no result buffer, no copy kernel per layer); rows past num_actual_tokens untouched."""
    from sglang_inkling_backend.gpu.route import GpuRoute

    class Returned(GpuRoute):
        results = {}

        def run_decode_group(self, *args, **kwargs):
            self.results["decode"] = super().run_decode_group(*args, **kwargs)
            return self.results["decode"]

        def run_extend_group(self, *args, **kwargs):
            self.results["extend"] = super().run_extend_group(*args, **kwargs)
            return self.results["extend"]

    g = torch.Generator().manual_seed(5)
    attention = LayerAttention(layer_spec(None), kv_format, torch.bfloat16)
    (cache,), table = stored_caches([attention], kv_format, block_size, g)
    q = torch.randn(9, HQ * D, generator=g).bfloat16()  # vLLM pads its buffers past the step's 7 rows
    route = Returned()
    output = torch.full((9, HQ * D), 3.0, dtype=torch.bfloat16)
    attention.forward(q, cache, mixed_batch(route, table, block_size), output)
    assert route.results["decode"].data_ptr() == output.data_ptr()
    assert route.results["extend"].data_ptr() == output[2].data_ptr()
    assert torch.all(output[7:] == 3.0) and not torch.any(output[:7] == 3.0)
    want = attention.forward(q, cache, mixed_batch(TorchRoute(), table, block_size),
                             torch.zeros(9, HQ * D, dtype=torch.bfloat16))
    assert (output[:7].float() - want[:7].float()).abs().max().item() < 2e-2


def test_an_output_the_kernels_cannot_write_takes_a_copy_of_their_result():
    """``attend``'s ``out`` may be any float tensor of the query's shape: one the kernels cannot write (head_dim
    strided, or float64) gets their result copied in, equal to a contiguous bf16 output's."""
    from sglang_inkling_backend import layer_step
    from sglang_inkling_backend.gpu.route import GpuRoute
    from sglang_inkling_backend.layer_plan import attention_params

    g = torch.Generator().manual_seed(6)
    attention = LayerAttention(layer_spec(None), "bf16", torch.bfloat16)
    (cache,), table = stored_caches([attention], "bf16", 16, g)
    q = torch.randn(7, HQ * D, generator=g).bfloat16()
    want = attention.forward(q, cache, mixed_batch(GpuRoute(), table, 16), torch.zeros(7, HQ * D).bfloat16())
    batch = mixed_batch(GpuRoute(), table, 16)
    attention.forward(q, cache, batch, torch.zeros(7, HQ * D).bfloat16())  # the step's group plans, made
    strided = torch.zeros(7, HQ, D * 2, dtype=torch.bfloat16)[..., ::2]  # head_dim stride 2
    wide = torch.zeros(7, HQ, D, dtype=torch.float64)  # a dtype no kernel writes
    kv = attention.paged_kv(cache)
    group_key = attention.decode_group_key(kv)
    decode_group = batch.plans.value(("decode group", group_key), lambda: None)
    extend_group = batch.plans.value(("extend group", group_key + (attention.spec.scale, kv.k_scale, kv.v_scale,
                                                                   False)), lambda: None)
    q3 = q.view(7, HQ, D)
    params_of = lambda first, last: attention_params(attention.spec, rows=last - first)  # noqa: E731
    for out in (strided, wide):
        layer_step.attend(batch.route, attention.spec, q3, kv, batch, params_of, batch.workspace, out,
                          decode_group=decode_group, extend_group=extend_group)
    assert decode_group is not None and extend_group is not None
    assert torch.equal(strided.reshape(7, HQ * D), want) and torch.equal(wide.reshape(7, HQ * D).bfloat16(), want)
