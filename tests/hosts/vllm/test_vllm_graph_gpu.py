"""The vLLM adapter's GPU path, host-free (no vLLM: it cannot be installed next to the GPU machine's torch): the
layer code ``InklingVllmImpl`` delegates to (``hosts/vllm/attention.LayerAttention``) over a cache in vLLM's block
layout (``block_cache.vllm_layer_view``), with batches as vLLM's ``CommonAttentionMetadata`` carries them
(block tables with null blocks behind windows, slot mappings with -1 padding, decodes first).

- Decode under a CUDA graph: one layer step (the K/V store and the Triton decode through the page table) captured
  once on persistent buffers with the capture's plan bound (the model's max length, as
  ``InklingVllmMetadataBuilder.build_for_cudagraph_capture`` sets), replayed for smaller batches refilled in place;
  every replay equals the torch route on the same cache.
- Eager mixed batches (decodes, then chunked prefills with cached prefixes): the Triton route against the torch
  route on the same cache.
Skipped without CUDA.
"""
import itertools
import math

import torch

try:
    import pytest
except ImportError:  # the GPU box may have no pytest: run as a script (see the bottom)
    pytest = None

HQ, HKV, D, BS = 8, 2, 128, 128
CASES = list(itertools.product(["bf16", "mxfp8", "fp8_e4m3"], [None, 200]))


def layer(kv_format, window, sinks=None, cap=0.0):
    from sglang_inkling_backend.hosts.vllm.attention import LayerAttention
    from sglang_inkling_backend.layer_plan import LayerSpec

    spec = LayerSpec(window=window, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, softmax_scale=1 / math.sqrt(D),
                     logit_cap=cap)
    attention = LayerAttention(spec, kv_format, torch.bfloat16, sinks)
    if kv_format == "fp8_e4m3":
        attention.bind_fp8_scales(0.5, 0.25)
    return attention


def block_tables(rows, max_blocks, num_blocks, g, dev):
    """Each row's blocks: distinct random blocks, never 0 (vLLM's null block)."""
    ids = torch.randperm(num_blocks - 1, device=dev, generator=g)[: rows * max_blocks] + 1
    return ids.view(rows, max_blocks).to(torch.int32)


def null_behind_window(table, seq_lens, query_lens, window):
    """vLLM replaces the blocks a window has left with the null block (0)."""
    if window is None:
        return table
    table = table.clone()
    for r in range(table.shape[0]):
        first_visible = max(0, int(seq_lens[r]) - int(query_lens[r]) - (window - 1))
        table[r, : first_visible // BS] = 0
    return table


def fill_history(attention, cache, table, lens, g, dev, fused_store):
    slots = []
    for r in range(table.shape[0]):
        pos = torch.arange(int(lens[r]), device=dev)
        slots.append(table[r, pos // BS].long() * BS + pos % BS)
    slots = torch.cat(slots)
    k = torch.randn(slots.numel(), HKV, D, device=dev, generator=g).to(torch.bfloat16)
    v = torch.randn(slots.numel(), HKV, D, device=dev, generator=g).to(torch.bfloat16)
    attention.store(k, v, cache, slots, fused_store=fused_store)


def check_decode_graph_capture_and_replay(kv_format, window):
    from sglang_inkling_backend.hosts.vllm.batch import VllmBatch
    from sglang_inkling_backend.hosts.vllm.block_cache import BlockCacheLayout, vllm_layer_view
    from sglang_inkling_backend.routes import TorchRoute, choose_route

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    num_blocks, max_bs, ctx = 96, 8, 1024
    max_blocks = ctx // BS
    layout = BlockCacheLayout(kv_format, HKV, D, BS)
    cache = vllm_layer_view(layout, num_blocks, device=dev, dtype=torch.bfloat16 if kv_format == "bf16"
                            else torch.uint8)
    route = choose_route(dev, (D,))
    assert route.name == "triton"
    attention = layer(kv_format, window)
    tables = block_tables(max_bs, max_blocks, num_blocks, g, dev)
    fill_history(attention, cache, tables, torch.full((max_bs,), ctx, device=dev), g, dev, route.fused_store)
    workspace = route.make_workspace(max_batch=max_bs, geometries={(HQ, HKV, D)}, max_seq_len=ctx, device=dev)
    # vLLM's persistent buffers; rows past the batch are CUDA-graph padding: seq_len 0, stale block-table rows.
    block_table = tables.clone()
    seq_lens = torch.zeros(max_bs, dtype=torch.int32, device=dev)
    slot_mapping = torch.full((max_bs,), -1, dtype=torch.int64, device=dev)
    qsl = torch.arange(max_bs + 1, dtype=torch.int32, device=dev)
    query = torch.zeros(max_bs, HQ * D, dtype=torch.bfloat16, device=dev)
    key = torch.zeros(max_bs, HKV, D, dtype=torch.bfloat16, device=dev)
    value = torch.zeros_like(key)
    output = torch.zeros(max_bs, HQ * D, dtype=torch.bfloat16, device=dev)
    batch = VllmBatch(num_reqs=max_bs, num_actual_tokens=max_bs, num_decodes=max_bs, num_decode_tokens=max_bs,
                      query_start_loc=qsl, seq_lens=seq_lens, block_table=block_table, slot_mapping=slot_mapping,
                      block_size=BS, max_seq_len=ctx, workspace=workspace, route=route)

    def step():
        attention.store(key, value, cache, slot_mapping, fused_store=route.fused_store)
        attention.forward(query, cache, batch, output)

    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up: compiles the kernels, makes the step's plan (a view of the workspace)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    for trial, bs in enumerate((3, 8, 5)):
        rows = torch.randperm(max_bs, device=dev, generator=g)[:bs]
        lens = torch.randint(1, ctx + 1, (bs,), device=dev, generator=g)
        table = null_behind_window(tables[rows], lens, torch.ones_like(lens), window)
        seq_lens.zero_(); slot_mapping.fill_(-1)
        block_table[:bs], seq_lens[:bs] = table, lens.to(torch.int32)
        slot_mapping[:bs] = table[torch.arange(bs, device=dev), (lens - 1) // BS].long() * BS + (lens - 1) % BS
        query.normal_(generator=g); key.normal_(generator=g); value.normal_(generator=g)
        graph.replay()
        torch.cuda.synchronize()
        eager = VllmBatch(num_reqs=bs, num_actual_tokens=bs, num_decodes=bs, num_decode_tokens=bs,
                          query_start_loc=qsl[: bs + 1].clone(), seq_lens=seq_lens[:bs].clone(),
                          block_table=block_table[:bs].clone(), slot_mapping=slot_mapping[:bs].clone(),
                          block_size=BS, max_seq_len=int(lens.max()), route=TorchRoute())
        want = torch.zeros(bs, HQ * D, dtype=torch.bfloat16, device=dev)
        attention.forward(query[:bs], cache, eager, want)
        err = (output[:bs].float() - want.float()).abs().max().item()
        assert err < 2e-2, (kv_format, window, trial, err)
        # the captured store wrote the new tokens where the slot mapping says
        got = attention.paged_kv(cache).read(slot_mapping[:bs])[0]
        if kv_format == "mxfp8":
            from sglang_inkling_backend import mxfp8
            expected = mxfp8.dequantize(*mxfp8.quantize(key[:bs]), torch.float32)
        elif kv_format == "fp8_e4m3":
            expected = (key[:bs].float() / 0.5).to(torch.float8_e4m3fn).float() * 0.5
        else:
            expected = key[:bs].float()
        assert torch.equal(got, expected), (kv_format, trial)


def check_eager_mixed_batch(kv_format, window):
    """Two decodes then two chunked prefills over cached prefixes, with sinks and a logit cap: Triton route
    against the torch route, same cache."""
    from sglang_inkling_backend.hosts.vllm.batch import VllmBatch
    from sglang_inkling_backend.hosts.vllm.block_cache import BlockCacheLayout, vllm_layer_view
    from sglang_inkling_backend.routes import TorchRoute, choose_route

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    num_blocks, ctx = 64, 768
    layout = BlockCacheLayout(kv_format, HKV, D, BS)
    cache = vllm_layer_view(layout, num_blocks, device=dev, dtype=torch.bfloat16 if kv_format == "bf16"
                            else torch.uint8)
    route = choose_route(dev, (D,))
    attention = layer(kv_format, window, sinks=torch.randn(HQ, device=dev, generator=g), cap=30.0)
    seq_lens = torch.tensor([700, 40, 300, 513], device=dev)
    query_lens = torch.tensor([1, 1, 130, 7], device=dev)
    tables = block_tables(4, ctx // BS, num_blocks, g, dev)
    fill_history(attention, cache, tables, seq_lens, g, dev, route.fused_store)
    tables = null_behind_window(tables, seq_lens, query_lens, window)
    qsl = torch.zeros(5, dtype=torch.int32, device=dev)
    qsl[1:] = torch.cumsum(query_lens, 0)
    n = int(qsl[-1])
    q = torch.randn(n, HQ * D, device=dev, generator=g).to(torch.bfloat16)
    workspace = route.make_workspace(max_batch=4, geometries={(HQ, HKV, D)}, max_seq_len=ctx, device=dev)
    outs = {}
    for name, r in (("triton", route), ("torch", TorchRoute())):
        batch = VllmBatch(num_reqs=4, num_actual_tokens=n, num_decodes=2, num_decode_tokens=2, query_start_loc=qsl,
                          seq_lens=seq_lens.to(torch.int32), block_table=tables,
                          slot_mapping=torch.zeros(n, dtype=torch.int64, device=dev), block_size=BS,
                          max_seq_len=ctx, workspace=workspace if name == "triton" else None, route=r)
        outs[name] = attention.forward(q, cache, batch, torch.zeros(n, HQ * D, dtype=torch.bfloat16, device=dev))
    err = (outs["triton"].float() - outs["torch"].float()).abs().max().item()
    assert err < 2e-2, (kv_format, window, err)


if pytest is not None:
    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
    @pytest.mark.parametrize("kv_format, window", CASES)
    def test_vllm_decode_graph_capture_and_replay(kv_format, window):
        check_decode_graph_capture_and_replay(kv_format, window)

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
    @pytest.mark.parametrize("kv_format, window", CASES)
    def test_vllm_eager_mixed_batch(kv_format, window):
        check_eager_mixed_batch(kv_format, window)


if __name__ == "__main__":
    failures = 0
    for check in (check_decode_graph_capture_and_replay, check_eager_mixed_batch):
        for case in CASES:
            try:
                check(*case)
                print(f"PASS {check.__name__}{case}", flush=True)
            except Exception as err:  # report every case, then fail
                failures += 1
                print(f"FAIL {check.__name__}{case}: {type(err).__name__}: {err}", flush=True)
    print(f"{len(CASES) * 2 - failures}/{len(CASES) * 2} passed")
    raise SystemExit(1 if failures else 0)
