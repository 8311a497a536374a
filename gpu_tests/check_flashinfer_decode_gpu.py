"""GPU check of the FlashInfer decode family (``sglang_inkling_backend.flashinfer.decode``) inside the Triton route,
with the real FlashInfer (run on the GPU machine with FlashInfer importable; CI has no GPU).

Over a bf16 pool of random slots, every layer kind the family serves (full; a window cut to its keys; a soft cap;
GQA 4 on tensor cores and GQA 2 without), against float32 attention on the same K/V
(``reference.attention.paged_decode_attention``; the bf16 values are exact in float32, its own error ~1e-6):
  1. eager: the route plans on the first call of the step;
  2. CUDA graphs: ``plan_graph_step`` before capture, the layers captured in one graph, then for three new batches of
     other lengths ``plan_graph_step`` again and a replay (the family's wrappers and buffers reused).
Bound: relative Frobenius error <= 8e-3 (FlashInfer's bf16 output: about 2**-9 relative, and its bf16 P.V).
A layer the family must not serve (a relative bias) is checked to run this package's kernel with the same bound.
Prints one JSON line per check and exits 1 if any failed.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.layer_plan import LayerSpec, attention_params  # noqa: E402
from sglang_inkling_backend.rails import gather_rails, window_start  # noqa: E402
from sglang_inkling_backend.reference.attention import paged_decode_attention  # noqa: E402
from sglang_inkling_backend.step_plans import DecodePlanCache  # noqa: E402
from sglang_inkling_backend.gpu.route import route_for  # noqa: E402

BOUND = 8e-3
SLOTS, D, CTX, MAX_BS = 1 << 16, 128, 4096, 16
failures = []


def record(name, err, **info):
    ok = err <= BOUND
    if not ok:
        failures.append(name)
    print(json.dumps({"check": name, "ok": ok, "rel_err": err, **info}), flush=True)


def rel_err(got, want):
    return float((got.float() - want).norm() / want.norm())


class Step:
    num_decode_rows = 0

    def __init__(self, rails_by_window, max_seq_len):
        self.rails_by_window, self.max_seq_len, self.plans = rails_by_window, max_seq_len, DecodePlanCache()

    def decode_keys(self, window, reads_page_tables):
        return self.rails_by_window[window]


def batch(gen, lens, windows, dev):
    table = torch.randperm(SLOTS, generator=gen, device="cpu")[: len(lens) * CTX].reshape(len(lens), CTX).to(dev)
    seq = torch.tensor(lens, device=dev)
    rails = {w: gather_rails(table, torch.arange(len(lens), device=dev), seq,
                             None if w is None else window_start(seq, torch.ones_like(seq), w)) for w in windows}
    return rails, seq


def main():
    dev = torch.device("cuda")
    route, note = route_for(dev)
    print(note, flush=True)
    if route.decode_family is None:
        print("no FlashInfer decode family here", flush=True)
        sys.exit(1)
    gen = torch.Generator().manual_seed(int(os.environ.get("SEED", "11")))
    layers = [LayerSpec(window=None, num_q_heads=32, num_kv_heads=8, head_dim=D),
              LayerSpec(window=512, num_q_heads=32, num_kv_heads=8, head_dim=D, logit_cap=30.0),
              LayerSpec(window=None, num_q_heads=16, num_kv_heads=8, head_dim=D, softmax_scale=1.0 / D)]
    pools = {}
    for spec in layers:
        if spec.num_kv_heads not in pools:
            pools[spec.num_kv_heads] = PagedKV(torch.randn(SLOTS, spec.num_kv_heads, D, generator=gen).bfloat16().to(dev),
                                               torch.randn(SLOTS, spec.num_kv_heads, D, generator=gen).bfloat16().to(dev))
    windows = {spec.window for spec in layers}

    def run_layers(qs, keys):
        return [route.decode(q, pools[s.num_kv_heads], keys.decode_keys(s.window, False),
                             attention_params(s, rows=q.shape[0]), max_seq_len=keys.max_seq_len, plans=keys.plans,
                             workspace=None) for s, q in zip(layers, qs)]

    def check(name, outs, qs, keys):
        for i, (spec, q, out) in enumerate(zip(layers, qs, outs)):
            rails = keys.decode_keys(spec.window, False)
            want = paged_decode_attention(q.float(), PagedKV(pools[spec.num_kv_heads].k_buffer.float(),
                                                              pools[spec.num_kv_heads].v_buffer.float()),
                                          rails.indptr, rails.indices, attention_params(spec, rows=q.shape[0]))
            record(f"{name} layer {i}", rel_err(out, want), window=spec.window, heads=spec.num_q_heads)

    # 1. eager
    lens = [1, 37, 4096, 600, 2049, 130, 9, 3000]
    rails, _ = batch(gen, lens, windows, dev)
    keys = Step(rails, max(lens))
    qs = [torch.randn(len(lens), s.num_q_heads, D, generator=gen).bfloat16().to(dev) for s in layers]
    check("eager", run_layers(qs, keys), qs, keys)
    served = route.decode_family is not None and route.decode_family.served
    print(json.dumps({"check": "eager served by FlashInfer", "ok": served}), flush=True)
    if not served:
        failures.append("eager served by FlashInfer")

    # 2. CUDA graphs: capture once, replay three new batches of the same size
    bs = 8
    q_bufs = [torch.zeros(bs, s.num_q_heads, D, dtype=torch.bfloat16, device=dev) for s in layers]
    graph_keys = None
    graph = torch.cuda.CUDAGraph()
    for round_ in range(4):
        lens = [int(x) for x in torch.randint(1, CTX + 1, (bs,), generator=gen)]
        rails, _ = batch(gen, lens, windows, dev)
        keys = Step(rails, CTX)
        route.plan_graph_step(keys, layers, torch.tensor(lens), kv_format="bf16", max_bs=MAX_BS,
                              max_seq_len=CTX)
        for buf, s in zip(q_bufs, layers):
            buf.copy_(torch.randn(bs, s.num_q_heads, D, generator=gen).bfloat16().to(dev))
        if round_ == 0:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                run_layers(q_bufs, keys)  # warm-up, outside the capture
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(graph):
                graph_outs = run_layers(q_bufs, keys)
            graph_keys = keys
        graph.replay()
        torch.cuda.synchronize()
        check(f"graph replay {round_}", graph_outs, q_bufs, keys)
    del graph_keys

    # a layer the family does not serve: a relative bias, this package's kernel
    spec = LayerSpec(window=None, num_q_heads=32, num_kv_heads=8, head_dim=D, rel_extent=64, softmax_scale=1.0 / D)
    lens = [5, 700, 4096]
    rails, _ = batch(gen, lens, {None}, dev)
    q = torch.randn(len(lens), 32, D, generator=gen).bfloat16().to(dev)
    bias = torch.randn(len(lens), 32, 64, generator=gen).to(dev)
    params = attention_params(spec, rows=len(lens), rel_bias=bias)
    out = route.decode(q, pools[8], rails[None], params, max_seq_len=CTX, plans=DecodePlanCache(), workspace=None)
    want = paged_decode_attention(q.float(), PagedKV(pools[8].k_buffer.float(), pools[8].v_buffer.float()),
                                  rails[None].indptr, rails[None].indices,
                                  AttentionParams(1.0 / D, rel_bias=bias.float()))
    record("relative bias (Triton kernel)", rel_err(out, want))
    print(json.dumps({"failed": failures}), flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
