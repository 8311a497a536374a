"""Teacher-forced drift of several runs from one reference run (serve_check.py --prompt-logprobs records), and the
paired difference of two drifts with its noise (test-only; runs anywhere, no GPU).

For every prompt position both runs scored: |delta logprob| of the prompt's own next token against the reference.
A drift is the mean over positions; top-1 flips not at a near-tie are counted as in ``compare.py``. The paired
difference of two runs A and B is the mean over positions of |dA| - |dB|; its noise is the standard error over
requests (positions within one request are not independent), with the position-level one alongside.

    python gpu_tests/sglang/drift_pairs.py --ref REF.json --run NAME=RUN.json [--run ...] \\
        [--pair "NAME_A::NAME_B" ...] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import compare_prompt_logprobs  # noqa: E402


def per_request_deltas(ref: dict, run: dict) -> list[list[float]]:
    """|delta logprob| per scored prompt position, one list per request (positions both runs scored)."""
    return [[abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"]) if x is not None and y is not None]
            for a, b in zip(ref["prompt_logprobs"], run["prompt_logprobs"])]


def _mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    var = sum((x - mean) ** 2 for x in values) / (n - 1) if n > 1 else float("nan")
    return mean, math.sqrt(var / n)


def paired(ref: dict, a: dict, b: dict) -> dict:
    """Mean of |dA| - |dB| over positions, with its standard error over requests and over positions."""
    da, db = per_request_deltas(ref, a), per_request_deltas(ref, b)
    diffs = [[x - y for x, y in zip(ra, rb)] for ra, rb in zip(da, db)]
    flat = [d for r in diffs for d in r]
    mean, se_positions = _mean_se(flat)
    # cluster standard error: per-request sums around the overall mean
    n = sum(len(r) for r in diffs)
    k = len([r for r in diffs if r])
    resid = [sum(d - mean for d in r) for r in diffs if r]
    se_requests = math.sqrt(k / (k - 1) * sum(x * x for x in resid)) / n if k > 1 else float("nan")
    return {"positions": len(flat), "requests": k, "mean_difference": mean, "se_requests": se_requests,
            "se_positions": se_positions}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--run", action="append", default=[], help="NAME=path")
    ap.add_argument("--pair", action="append", default=[], help="NAME_A::NAME_B")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    ref = json.loads(Path(args.ref).read_text())
    runs = {}
    for item in args.run:
        name, path = item.split("=", 1)
        runs[name] = json.loads(Path(path).read_text())
    out = {"ref": args.ref, "drift": {}, "pairs": []}
    print("| run | prompt positions | top-1 flips not at a near-tie | mean abs delta logprob |")
    print("|---|---|---|---|")
    for name, run in runs.items():
        c = compare_prompt_logprobs(ref, run)
        out["drift"][name] = c
        print(f"| {name} | {c['positions']} | {c['top1_flips_not_near_tie']} | {c['mean_abs_dlogprob']:.4f} |")
    if args.pair:
        print()
        print("| A - B | mean(abs dA - abs dB) | s.e. over requests | s.e. over positions | requests |")
        print("|---|---|---|---|---|")
    for item in args.pair:
        a, b = item.split("::")
        p = {"a": a, "b": b, **paired(ref, runs[a], runs[b])}
        out["pairs"].append(p)
        print(f"| {a} - {b} | {p['mean_difference']:+.4f} | {p['se_requests']:.4f} | {p['se_positions']:.4f} | "
              f"{p['requests']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
