"""Tables and one JSON from a folder of serve_check.py records (test-only; no GPU).

    python gpu_tests/sglang/summarize.py RUNS_DIR [RUNS_DIR ...] --json results.json > tables.md

A run named in a later folder replaces the one of an earlier folder (the newest call's record of a configuration).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import (NEAR_TIE_NATS, compare, compare_prompt_logprobs, decode_vs_prefill,  # noqa: E402
                     pool_decode_rows)
from make_models import rank2_name  # noqa: E402

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
    ("parity bf16: SGLang triton vs inkling", "inkling-swa_triton_auto_noprefillgraph", "inkling-swa_inkling_auto"),
    ("CUDA graphs: inkling vs inkling --disable-cuda-graph", "inkling-swa_inkling_auto",
     "inkling-swa_inkling_auto_nograph"),
    ("broken inkling (softmax scale x1.01) vs inkling", "inkling-swa_inkling_auto", "inkling-swa_inkling_auto_broken"),
    ("drift: inkling bf16 vs inkling mxfp8", "inkling-swa_inkling_auto", "inkling-swa_inkling_mxfp8"),
    ("drift: SGLang triton bf16 vs triton fp8_e4m3", "inkling-swa_triton_auto_noprefillgraph",
     "inkling-swa_triton_fp8_e4m3_noprefillgraph"),
    ("drift: inkling bf16 vs SGLang triton fp8_e4m3", "inkling-swa_inkling_auto",
     "inkling-swa_triton_fp8_e4m3_noprefillgraph"),
]


def per_rank(run: str) -> str:
    """The same configuration on make_models.py's per-rank model (tp 2's head counts at tp 1)."""
    model, rest = run.split("_", 1)
    return f"{rank2_name(model)}_{rest}"


# every comparison again for the per-rank models (a pair shows only where both runs are in the folders given)
PAIRS += [(what, per_rank(ref), per_rank(other)) for what, ref, other in PAIRS]


def _num(x, fmt=".4f"):
    return "-" if x is None else format(x, fmt)


# inkling-swa's and gemma3-swa's sliding window (make_models.py): the decode-vs-prefill rows split at it
WINDOW = 256


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    records = {p.stem: json.loads(p.read_text()) for folder in args.runs for p in sorted(folder.glob("*.json"))}
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
    usable = {name for name, r in records.items() if not r.get("error")}
    for what, ref, other in PAIRS:
        if ref not in usable or other not in usable:
            continue
        c = compare(records[ref], records[other])
        c["prompt_logprobs"] = compare_prompt_logprobs(records[ref], records[other])
        out["pairs"].append({"what": what, **c})
        print(f"| {ref.split('_')[0]} | {what} | {c['requests_identical']}/{c['requests']} | "
              f"{c['tokens_agreeing']}/{c['tokens']} | {c['divergences_not_near_tie']} | {c['near_ties_ref']} | "
              f"{_num(c['mean_abs_dlogprob'])} |")
    teacher_forced = [p for p in out["pairs"] if p["prompt_logprobs"]]
    if teacher_forced:
        print()
        print("| comparison | prompt positions (teacher-forced, one extend) | top-1 flips | flips not at a near-tie | "
              "mean abs dlogprob |")
        print("|---|---|---|---|---|")
        for p in teacher_forced:
            t = p["prompt_logprobs"]
            print(f"| {p['ref']} vs {p['other']} | {t['positions']} | {t['top1_flips']} | "
                  f"{t['top1_flips_not_near_tie']} | {t['mean_abs_dlogprob']:.4f} |")
    out["decode_vs_prefill"] = [d for d in (decode_vs_prefill(records[n]) for n in sorted(usable)) if d]
    if out["decode_vs_prefill"]:
        print()
        print("| run | prompt lengths | decode tokens rescored | mean abs dlogprob, decode vs prefill | max | "
              "prefill top-1 is not the decode's token |")
        print("|---|---|---|---|---|---|")
        for d in out["decode_vs_prefill"]:
            for label, rows in (("< window", [r for r in d["rows"] if r["prompt_len"] < WINDOW]),
                                ("> window", [r for r in d["rows"] if r["prompt_len"] >= WINDOW])):
                pooled = pool_decode_rows(rows)
                if not pooled["tokens"]:
                    continue
                print(f"| {d['label']} | {label} ({', '.join(str(r['prompt_len']) for r in rows)}) | "
                      f"{pooled['tokens']} | {pooled['mean_abs_dlogprob']:.4f} | {pooled['max_abs_dlogprob']:.3f} | "
                      f"{pooled['prefill_top1_not_decode_token']} |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
