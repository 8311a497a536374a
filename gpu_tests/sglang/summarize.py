"""Tables and one JSON from a folder of serve_check.py records (test-only; no GPU).

    python gpu_tests/sglang/summarize.py RUNS_DIR --json results.json > tables.md
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import NEAR_TIE_NATS, compare  # noqa: E402

# (what the row shows, reference run, compared run)
PAIRS = [
    ("parity bf16: SGLang triton vs inkling", "llama-gqa4_triton_auto", "llama-gqa4_inkling_auto"),
    ("parity bf16: SGLang triton vs inkling", "gemma3-swa_triton_auto", "gemma3-swa_inkling_auto"),
    ("broken inkling (softmax scale x1.01) vs inkling", "llama-gqa4_inkling_auto", "llama-gqa4_inkling_auto_broken"),
    ("broken inkling (softmax scale x1.01) vs SGLang triton", "llama-gqa4_triton_auto",
     "llama-gqa4_inkling_auto_broken"),
    ("drift: inkling bf16 vs inkling mxfp8", "llama-gqa4_inkling_auto", "llama-gqa4_inkling_mxfp8"),
    ("drift: SGLang triton bf16 vs triton fp8_e4m3", "llama-gqa4_triton_auto", "llama-gqa4_triton_fp8_e4m3"),
    ("drift: SGLang triton bf16 vs inkling mxfp8", "llama-gqa4_triton_auto", "llama-gqa4_inkling_mxfp8"),
    ("drift: inkling bf16 vs inkling mxfp8", "gemma3-swa_inkling_auto", "gemma3-swa_inkling_mxfp8"),
    ("drift: SGLang triton bf16 vs inkling mxfp8", "gemma3-swa_triton_auto", "gemma3-swa_inkling_mxfp8"),
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    records = {p.stem: json.loads(p.read_text()) for p in sorted(args.runs.glob("*.json"))}
    out = {"near_tie_nats": NEAR_TIE_NATS, "runs": {}, "pairs": []}
    print("| run | server start s | 10 concurrent requests s | prefix-hit cached_tokens | error |")
    print("|---|---|---|---|---|")
    for name, r in records.items():
        hit = (r.get("prefix_hit") or {}).get("cached_tokens")
        out["runs"][name] = {"server_args": r.get("server_args"), "startup_s": r.get("startup_s"),
                             "concurrent_s": r.get("concurrent_s"), "prefix_hit_cached_tokens": hit,
                             "error": r.get("error"), "request_errors": r.get("errors")}
        print(f"| {name} | {r.get('startup_s', 0):.0f} | {r.get('concurrent_s', 0):.2f} | {hit} | "
              f"{r.get('error') or ', '.join(r.get('errors') or []) or '-'} |")
    print()
    print("| model | comparison | requests identical | tokens before first divergence | divergences not at a "
          "near-tie | near-ties in ref | mean abs dlogprob (agreeing prefix) |")
    print("|---|---|---|---|---|---|---|")
    for what, ref, other in PAIRS:
        if ref not in records or other not in records:
            continue
        c = compare(records[ref], records[other])
        out["pairs"].append({"what": what, **c})
        print(f"| {ref.split('_')[0]} | {what} | {c['requests_identical']}/{c['requests']} | "
              f"{c['tokens_agreeing']}/{c['tokens']} | {c['divergences_not_near_tie']} | {c['near_ties_ref']} | "
              f"{c['mean_abs_dlogprob']:.4f} |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
