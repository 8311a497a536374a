"""Decode step time through the real vLLM engine at batch x context points, measured as ``vllm bench latency``
measures a batch (test-only).

``vllm bench latency`` (vllm 0.33 ``benchmarks/latency.py``) times ``LLM.generate`` of one batch of ``--batch-size``
random prompts of ``--input-len`` tokens (``np.random.randint(10000)``), ``temperature 1.0, top_p 1.0, ignore_eos``,
prefix caching off, so each timing is a prefill of the whole batch and ``--output-len`` decode steps. Here one engine
per backend serves every point: each point is timed with 1 output token (the prefill and one sampled token) and
with ``1 + STEPS`` (``ITERS`` times each, after a warm-up of each), and the decode step is the difference of the
medians over ``STEPS``: a step of the whole batch at that context, CUDA graphs as the engine runs them.

    python gpu_tests/vllm/latency_points.py --model DIR --backend CUSTOM --kv-cache-dtype mxfp8 \
        --points 32x4096,128x4096,16x32768 --out speed.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from engine_check import leave_checkout  # beside this script (its folder is first on sys.path)

STEPS = 64
ITERS = 3


def parse_points(text: str) -> list[tuple[int, int]]:
    points = []
    for item in text.split(","):
        batch, _, ctx = item.strip().partition("x")
        if not batch.isdigit() or not ctx.isdigit() or int(batch) < 1 or int(ctx) < 1:
            raise ValueError(f"--points: {item!r} is not BATCHxCONTEXT (e.g. 32x4096)")
        points.append((int(batch), int(ctx)))
    return points


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--points", default="32x4096,128x4096,16x32768")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--iters", type=int, default=ITERS)
    parser.add_argument("--kv-cache-gib", type=float, default=24.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    leave_checkout(args)
    points = parse_points(args.points)

    import numpy as np
    from vllm import LLM, SamplingParams

    longest = max(ctx for _, ctx in points) + args.steps + 16
    widest = max(b for b, _ in points)
    started = time.time()
    llm = LLM(model=str(args.model), dtype="bfloat16", attention_backend=args.backend,
              kv_cache_dtype=args.kv_cache_dtype, max_model_len=longest, max_num_seqs=widest,
              enable_prefix_caching=False, gpu_memory_utilization=0.8,
              kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30), seed=0,
              compilation_config={"cudagraph_capture_sizes": sorted({1, *(b for b, _ in points)})})
    config = llm.llm_engine.vllm_config
    record = {"label": f"{args.backend}:{args.kv_cache_dtype}", "backend": args.backend,
              "kv_cache_dtype": args.kv_cache_dtype, "start_s": time.time() - started,
              "num_gpu_blocks": config.cache_config.num_gpu_blocks, "block_size": config.cache_config.block_size,
              "cudagraph_mode": str(config.compilation_config.cudagraph_mode), "steps": args.steps, "points": []}
    rng = np.random.default_rng(0)
    for batch, ctx in points:
        prompts = [{"prompt_token_ids": row} for row in rng.integers(10000, size=(batch, ctx)).tolist()]

        def timed(tokens: int) -> float:
            params = SamplingParams(n=1, temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=tokens,
                                    detokenize=False)
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            elapsed = time.perf_counter() - t0
            assert all(len(o.outputs[0].token_ids) == tokens for o in outs)
            return elapsed

        timed(1), timed(1 + args.steps)  # warm-up
        short = [timed(1) for _ in range(args.iters)]
        long = [timed(1 + args.steps) for _ in range(args.iters)]
        step_ms = (statistics.median(long) - statistics.median(short)) / args.steps * 1e3
        row = {"batch": batch, "ctx": ctx, "prefill_s": short, "with_decode_s": long, "decode_step_ms": step_ms,
               "decode_tok_s": batch / step_ms * 1e3}
        record["points"].append(row)
        print(f"{record['label']} {batch}x{ctx}: decode step {step_ms:.3f} ms ({row['decode_tok_s']:.0f} tok/s), "
              f"prefill+1 {statistics.median(short):.3f} s", flush=True)
        args.out.write_text(json.dumps(record, indent=1))  # after every point: a cut-off call keeps what it measured
    return 0


if __name__ == "__main__":
    sys.exit(main())
