"""Start-up and decode times of the real server, configurations measured back to back (not a test).

    python integration/measure_times.py [--model gemma-3-270m] [--repeats 5] [--out FILE]

For each configuration: seconds from launch to a healthy /health, then the best of ``--repeats`` of a 1-token and a
33-token greedy request on the same prompt; decode ms/token = (t33 - t1) / 32. Best-of-N because the CPU may be
shared; the numbers are for reporting, never asserted.
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # the checkout (demo/): a script run lacks it
from demo.models import prepare_model  # noqa: E402
from demo.server import SGLangServer  # noqa: E402
from workloads import TIMING_PROMPT  # noqa: E402

CONFIGS = [("torch_native", "auto", 1), ("inkling", "auto", 1), ("inkling", "mxfp8", 1),
           ("torch_native", "auto", 2), ("inkling", "auto", 2), ("inkling", "mxfp8", 2)]


def best_seconds(server, max_new_tokens, repeats):
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        server.generate(TIMING_PROMPT, max_new_tokens=max_new_tokens)
        times.append(time.perf_counter() - started)
    return min(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    model_dir = prepare_model(args.model)
    results = []
    for backend, kv, tp in CONFIGS:
        with SGLangServer(model_dir, backend, kv, tp_size=tp) as server:
            one = best_seconds(server, 1, args.repeats)
            many = best_seconds(server, 33, args.repeats)
        row = {"model": args.model, "backend": backend, "kv": kv, "tp": tp,
               "startup_s": round(server.startup_seconds, 1), "first_token_ms": round(one * 1000, 1),
               "decode_ms_per_token": round((many - one) / 32 * 1000, 1)}
        print(json.dumps(row), flush=True)
        results.append(row)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
