"""The tables of a vLLM device call's runs (runs/*.json from run_call.sh): every engine_check run of a model against
that model's reference run (vLLM's own TRITON_ATTN over bf16, graphs on, offline), with ``gpu_tests/sglang/compare.py``
(tokens identical up to the first divergence; a divergence passes only at a near-tie of the reference, top-2 within
0.125 nats), plus the pairs named in ``PAIRS`` (graphs against eager, served against offline); and the decode-speed
table of the ``speed_*`` runs as ratios (peer step time / ours). Runs anywhere, no GPU.

    python gpu_tests/vllm/summarize.py RUNS_DIR --json summary.json > tables.md
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sglang"))
from compare import compare  # noqa: E402

REFERENCE = "{model}_TRITON_ATTN_auto"
# (reference, other) suffixes after "{model}_": same engine, another mode
PAIRS = [("CUSTOM_mxfp8", "CUSTOM_mxfp8_eager"), ("CUSTOM_auto", "CUSTOM_auto_eager"),
         ("CUSTOM_mxfp8", "CUSTOM_mxfp8_nocompile"), ("CUSTOM_mxfp8", "CUSTOM_mxfp8_serve"),
         ("TRITON_ATTN_auto", "TRITON_ATTN_auto_serve"), ("CUSTOM_auto", "CUSTOM_auto_broken"),
         ("FLASHINFER_auto", "CUSTOM_auto")]


def verdict(result: dict) -> str:
    if result["missing"]:
        return "MISSING"
    if result["divergences_not_near_tie"]:
        return "DIFFERS"
    return "same" if not result["requests_diverged"] else "near-ties only"


def row(ref: dict, other: dict) -> dict:
    result = compare(ref, other)
    return {"ref": ref["label"], "other": other["label"], "verdict": verdict(result),
            "requests_identical": f"{result['requests_identical']}/{result['requests']}",
            "tokens_agreeing": f"{result['tokens_agreeing']}/{result['tokens']}",
            "divergences_not_near_tie": result["divergences_not_near_tie"],
            "near_ties_ref": result["near_ties_ref"], "mean_abs_dlogprob": result["mean_abs_dlogprob"],
            "prefix_hit_cached": [ref["prefix_hit"].get("cached_tokens"), other["prefix_hit"].get("cached_tokens")]}


def parity_rows(runs: dict[str, dict]) -> list[dict]:
    rows = []
    models = sorted({name.split("_")[0] for name in runs if not name.startswith("speed")})
    for model in models:
        ref_name = REFERENCE.format(model=model)
        if ref_name in runs:
            for name in sorted(runs):
                if name.startswith(model + "_") and name != ref_name:
                    rows.append(row(runs[ref_name], runs[name]))
        for a, b in PAIRS:
            a_name, b_name = f"{model}_{a}", f"{model}_{b}"
            if a_name in runs and b_name in runs and a_name != ref_name:
                rows.append(row(runs[a_name], runs[b_name]))
    return rows


def speed_rows(runs: dict[str, dict]) -> list[dict]:
    speed = {r["label"]: r for name, r in runs.items() if name.startswith("speed")}
    peers = [label for label in ("FLASHINFER:auto", "FLASHINFER:fp8") if label in speed]
    rows = []
    for label, record in sorted(speed.items()):
        for point in record["points"]:
            out = {"backend": label, "batch": point["batch"], "ctx": point["ctx"],
                   "decode_step_ms": point["decode_step_ms"], "decode_tok_s": point["decode_tok_s"]}
            for peer in peers:
                match = [p for p in speed[peer]["points"] if (p["batch"], p["ctx"]) == (point["batch"], point["ctx"])]
                if match:
                    out[f"{peer} / this"] = match[0]["decode_step_ms"] / point["decode_step_ms"]
            rows.append(out)
    return rows


def load_runs(folder: Path) -> dict[str, dict]:
    runs = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        if path.stem.startswith("speed") or record.get("concurrent"):
            runs[path.stem] = record
    return runs


def markdown(rows: list[dict]) -> str:
    if not rows:
        return "(none)\n"
    keys = list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="folders of runs/*.json")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    runs = {}
    for folder in args.runs:
        runs.update(load_runs(folder))
    summary = {"parity": parity_rows(runs), "speed": speed_rows(runs),
               "engines": {name: r.get("engine") for name, r in runs.items() if r.get("engine")}}
    print("## Parity (reference: vLLM's TRITON_ATTN, bf16 KV, graphs on)\n")
    print(markdown(summary["parity"]))
    print("## Decode step (llama-gqa4-l16; ratio > 1: this backend faster than the peer)\n")
    print(markdown(summary["speed"]))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
