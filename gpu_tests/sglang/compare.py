"""Compare two serve_check.py JSON records request by request (test-only; runs anywhere, no GPU).

For every request: the tokens agree up to the first divergence; a divergence is a *near-tie* when, at that
position in the reference run, the top-2 logprobs are within ``NEAR_TIE_NATS`` (a logprob gap is the logit gap).
``NEAR_TIE_NATS = 0.125`` is two bf16 steps (one per logit of the pair) at |logit| in [8, 16): SGLang's logits are
bf16, and on the H200 llama-gqa4's top-2 gaps came in multiples of 0.0625 (logits in [8, 16)), gemma3-swa's in
finer ones (smaller logits), bench/results/history/2026-12-01-sglang-h200-harness/.
Also: positions where both runs agree, mean |delta logprob| of the chosen tokens over the agreeing prefix,
near-ties seen in the reference run (counted, shown), the prefix-cache hit (cached_tokens) of both runs.

    python gpu_tests/sglang/compare.py REF.json OTHER.json [--json out.json]
    python gpu_tests/sglang/compare.py --self RUN.json [RUN2.json]   # decode against prefill (--rescore runs)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

NEAR_TIE_NATS = 0.125


def requests_of(record: dict, evict_phase: bool = False) -> list[dict]:
    """The requests in a fixed order: the concurrent ones, the text prompt, the prefix hit, then with
    ``evict_phase`` (serve_check ``--evict-tokens``) the two documents' first and second requests (None where the
    record has no such phase)."""
    out = list(record.get("concurrent") or []) + [record.get("text"), record.get("prefix_hit")]
    if evict_phase:
        phase = record.get("evict_reload") or {}
        out += list(phase.get("first") or [None, None]) + list(phase.get("second") or [None, None])
    return out


def compare(ref: dict, other: dict) -> dict:
    rows = []
    evict_phase = bool(ref.get("evict_reload") or other.get("evict_reload"))
    for i, (a, b) in enumerate(zip(requests_of(ref, evict_phase), requests_of(other, evict_phase))):
        if a is None or b is None:
            rows.append({"request": i, "missing": True})
            continue
        n = min(len(a["output_ids"]), len(b["output_ids"]))
        first = next((j for j in range(n) if a["output_ids"][j] != b["output_ids"][j]), None)
        agree = n if first is None else first
        gaps = [pos[0][1] - pos[1][1] for pos in a["top2"][:n] if len(pos) >= 2]
        near_ties = [j for j, g in enumerate(gaps) if g <= NEAR_TIE_NATS]
        dlp = [abs(x - y) for x, y in zip(a["logprobs"][:agree], b["logprobs"][:agree])]
        row = {"request": i, "tokens": n, "agree": agree, "first_divergence": first,
               "gap_at_divergence": gaps[first] if first is not None and first < len(gaps) else None,
               "divergence_is_near_tie": (first is not None and first < len(gaps) and gaps[first] <= NEAR_TIE_NATS),
               "near_ties_ref": len(near_ties), "min_gap_ref": min(gaps) if gaps else None,
               "mean_abs_dlogprob": sum(dlp) / len(dlp) if dlp else None,
               "cached_tokens": [a.get("cached_tokens"), b.get("cached_tokens")],
               "cached_tokens_details": [a.get("cached_tokens_details"), b.get("cached_tokens_details")]}
        rows.append(row)
    ok = [r for r in rows if not r.get("missing")]
    total = sum(r["tokens"] for r in ok)
    agreed = sum(r["agree"] for r in ok)
    diverged = [r for r in ok if r["first_divergence"] is not None]
    all_dlp = [r["mean_abs_dlogprob"] * r["agree"] for r in ok if r["mean_abs_dlogprob"] is not None]
    return {"ref": ref.get("label"), "other": other.get("label"), "requests": len(rows),
            "missing": sum(1 for r in rows if r.get("missing")), "tokens": total, "tokens_agreeing": agreed,
            "requests_identical": len(ok) - len(diverged), "requests_diverged": len(diverged),
            "divergences_not_near_tie": sum(1 for r in diverged if not r["divergence_is_near_tie"]),
            "near_ties_ref": sum(r["near_ties_ref"] for r in ok),
            "mean_abs_dlogprob": (sum(all_dlp) / agreed) if agreed else None, "rows": rows}


def compare_decode_rates(ref: dict, other: dict) -> dict | None:
    """serve_check.py --decode-rate in both runs: each one's median tokens/s one request at a time, their ratio, and
    the accept lengths SGLang reported (speculative runs)."""
    a, b = ref.get("decode_rate"), other.get("decode_rate")
    if not a or not b:
        return None
    lengths = lambda rate: [r["spec_accept_length"] for r in rate["runs"]]  # noqa: E731
    return {"ref_tok_s": a["tok_s_median"], "other_tok_s": b["tok_s_median"],
            "other_over_ref": b["tok_s_median"] / a["tok_s_median"], "ref_accept_lengths": lengths(a),
            "other_accept_lengths": lengths(b)}


def compare_prompt_logprobs(ref: dict, other: dict) -> dict | None:
    """Teacher-forced over every prompt position (serve_check.py --prompt-logprobs): top-1 flips, those not at a
    near-tie of the reference, and mean |delta logprob| of the prompt's own next tokens."""
    if not ref.get("prompt_logprobs") or not other.get("prompt_logprobs"):
        return None
    positions = flips = real_flips = 0
    deltas = []
    for a, b in zip(ref["prompt_logprobs"], other["prompt_logprobs"]):
        deltas += [abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"]) if x is not None and y is not None]
        for ta, tb in zip(a["top2"], b["top2"]):
            if len(ta) < 2 or not tb:
                continue
            positions += 1
            if ta[0][0] != tb[0][0]:
                flips += 1
                real_flips += (ta[0][1] - ta[1][1]) > NEAR_TIE_NATS
    return {"positions": positions, "top1_flips": flips, "top1_flips_not_near_tie": real_flips,
            "mean_abs_dlogprob": sum(deltas) / len(deltas) if deltas else None}


def decode_vs_prefill(record: dict) -> dict | None:
    """One run against itself (serve_check.py --rescore): each decode step's logprob of its greedy token against the
    logprob one extend pass over prompt + output gives the same token. Output token 0 comes from the prefill in both,
    so rows start at token 1. A backend whose decode attends differently from its prefill shows here without a peer."""
    if not record.get("rescored"):
        return None
    rows = []
    for i, (r, s) in enumerate(zip(record["concurrent"], record["rescored"])):
        if r is None or s is None:
            continue
        n_prompt = len(s["logprobs"]) - len(r["output_ids"])
        prefill = s["logprobs"][n_prompt + 1:]
        decode = r["logprobs"][1:len(prefill) + 1]
        deltas = [abs(x - y) for x, y in zip(decode, prefill)]
        top1 = [pos[0][0] for pos in s["top2"][n_prompt + 1:]]
        flips = sum(1 for t, o in zip(top1, r["output_ids"][1:]) if t != o)
        rows.append({"request": i, "prompt_len": n_prompt, "tokens": len(deltas),
                     "mean_abs_dlogprob": sum(deltas) / len(deltas) if deltas else None,
                     "max_abs_dlogprob": max(deltas) if deltas else None, "prefill_top1_not_decode_token": flips})
    return {"label": record.get("label"), **pool_decode_rows(rows), "rows": rows}


def pool_decode_rows(rows: list[dict]) -> dict:
    """decode_vs_prefill's rows (any subset) as one: tokens, token-weighted mean, max, top-1 mismatches."""
    tokens = sum(r["tokens"] for r in rows)
    weighted = sum(r["mean_abs_dlogprob"] * r["tokens"] for r in rows if r["tokens"])
    return {"tokens": tokens, "mean_abs_dlogprob": weighted / tokens if tokens else None,
            "max_abs_dlogprob": max((r["max_abs_dlogprob"] or 0.0) for r in rows) if rows else None,
            "prefill_top1_not_decode_token": sum(r["prefill_top1_not_decode_token"] for r in rows)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", type=Path)
    parser.add_argument("other", type=Path, nargs="?")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--self", action="store_true", help="decode against prefill within each run given")
    args = parser.parse_args(argv)
    if args.self:
        results = [decode_vs_prefill(json.loads(p.read_text())) for p in (args.ref, args.other) if p]
        for result in results:
            if result is None:
                print("no rescored requests (serve_check.py --rescore)")
                continue
            print(f"{result['label']}: decode vs prefill over {result['tokens']} tokens: mean |dlogprob| "
                  f"{result['mean_abs_dlogprob']}, max {result['max_abs_dlogprob']}, prefill's top-1 is not the "
                  f"decode's token at {result['prefill_top1_not_decode_token']}")
            for r in result["rows"]:
                print("  ", r)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
        return 0
    if args.other is None:
        parser.error("OTHER is needed unless --self")
    ref, other = json.loads(args.ref.read_text()), json.loads(args.other.read_text())
    result = compare(ref, other)
    result["prompt_logprobs"] = compare_prompt_logprobs(ref, other)
    result["decode_rate"] = compare_decode_rates(ref, other)
    print(f"{result['ref']} vs {result['other']}: {result['requests_identical']}/{result['requests']} requests "
          f"identical, {result['tokens_agreeing']}/{result['tokens']} tokens before divergence, "
          f"{result['divergences_not_near_tie']} divergences not at a near-tie, near-ties in ref "
          f"{result['near_ties_ref']}, mean |dlogprob| {result['mean_abs_dlogprob']}; teacher-forced prompt "
          f"logprobs: {result['prompt_logprobs']}")
    if result["decode_rate"]:
        rate = result["decode_rate"]
        print(f"decode one request at a time: {rate['ref_tok_s']:.1f} against {rate['other_tok_s']:.1f} tokens/s "
              f"({rate['other_over_ref']:.2f}x), accept lengths {rate['other_accept_lengths']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    for r in result["rows"]:
        print("  ", r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
