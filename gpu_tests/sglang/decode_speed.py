"""End-to-end decode speed of the real SGLang server (test-only; GPU machine): for each (batch, context), ``batch``
concurrent requests of ``context`` random prompt tokens, timed twice on fresh prompts (no prefix-cache hits):
once generating ``--new-tokens`` tokens (ignore_eos), once generating 1. The difference is the decode steps alone:

    step ms = (T_new - T_1) / (new_tokens - 1),   decode tokens/s = batch * (new_tokens - 1) / (T_new - T_1)

The server runs with CUDA graphs up to ``--cuda-graph-max-bs-decode`` and the given backend / KV dtype; its log
gives the KV tokens that fit. Writes one JSON record and prints one line per point.

    python3 gpu_tests/sglang/decode_speed.py --model /tmp/models/llama-gqa4 --backend inkling --kv-cache-dtype mxfp8 \\
        --points 1x4096,32x4096,128x4096,1x32768,32x32768 --out run.json --log run.log
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_check import VOCAB_HIGH, VOCAB_LOW, Server, post  # noqa: E402


def timed_batch(url: str, batch: int, context: int, new_tokens: int, seed: int) -> float:
    """Seconds until all ``batch`` requests finished (sent at once)."""
    rng = random.Random(seed)
    bodies = [{"input_ids": [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(context)],
               "sampling_params": {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True}}
              for _ in range(batch)]
    errors = []

    def one(body):
        try:
            got = post(url + "/generate", body, timeout=900)["meta_info"].get("completion_tokens")
            if got != new_tokens:
                errors.append(f"got {got} tokens, asked for {new_tokens}")
        except Exception as exc:  # the error is the result
            errors.append(repr(exc))

    threads = [threading.Thread(target=one, args=(b,)) for b in bodies]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} of {batch} requests failed: {errors[0]}")
    return time.monotonic() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--points", default="1x4096,32x4096,128x4096,1x32768,32x32768", help="BATCHxCONTEXT, ...")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--startup-timeout", type=float, default=240.0)
    args = ap.parse_args()
    points = [tuple(int(x) for x in p.split("x")) for p in args.points.split(",")]
    max_bs = max(b for b, _ in points)
    server_args = ["--model-path", args.model, "--attention-backend", args.backend, "--kv-cache-dtype",
                   args.kv_cache_dtype, "--dtype", "bfloat16", "--chunked-prefill-size", "8192",
                   "--skip-server-warmup", "--mem-fraction-static", "0.3", "--cuda-graph-max-bs-decode", str(max_bs),
                   "--max-running-requests", str(max_bs)]
    server = Server(server_args, args.log, dict(os.environ), args.startup_timeout)
    record = {"backend": args.backend, "kv_cache_dtype": args.kv_cache_dtype, "model": Path(args.model).name,
              "new_tokens": args.new_tokens, "server_args": server_args, "points": []}
    rc = 0
    try:
        record["startup_s"] = server.start()
        timed_batch(server.url, 2, 256, 8, seed=1)  # compile the kernels before timing
        for i, (batch, context) in enumerate(points):
            full = timed_batch(server.url, batch, context, args.new_tokens, seed=100 + 2 * i)
            one = timed_batch(server.url, batch, context, 1, seed=101 + 2 * i)
            steps = args.new_tokens - 1
            point = {"batch": batch, "context": context, "t_new_s": full, "t_one_s": one,
                     "step_ms": 1000 * (full - one) / steps, "decode_tok_s": batch * steps / (full - one)}
            record["points"].append(point)
            print(f"{args.backend}/{args.kv_cache_dtype} B={batch} ctx={context}: step {point['step_ms']:.2f} ms, "
                  f"{point['decode_tok_s']:.0f} tok/s (T_new {full:.2f} s, T_1 {one:.2f} s)", flush=True)
    except Exception as exc:
        record["error"] = repr(exc)
        print(f"{args.backend}/{args.kv_cache_dtype}: {exc!r}", flush=True)
        rc = 1
    finally:
        server.stop()
    log = args.log.read_text(errors="replace") if args.log.exists() else ""
    record["kv_cache_lines"] = [line for line in log.splitlines() if "KV Cache is allocated" in line][-1:]
    args.out.write_text(json.dumps(record, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
