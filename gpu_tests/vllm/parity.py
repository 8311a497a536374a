"""The vLLM call's parity rule (test-only; runs anywhere, no GPU): an engine passes when its answers are as close to
the reference engine's (vLLM's TRITON_ATTN) as another correct implementation's are, measured at the same contexts.

Why not tokens with a fixed near-tie threshold: on the call's random models a softmax scale x1.01 moved no greedy
token away from a near-tie (``bench/results/current/vllm-h200/engine-h100-2026-12-07``). Why not each engine against
a float32 oracle (``integration/margins.py``): a 16-bit engine's own distance from float32 on these models is of the
order of the control's effect, and the oracle judges each engine alone, so the error both engines share cannot
cancel.

The rule, tried on a CPU with HF transformers playing the engines (``parity_rule_cpu.py``,
``bench/results/current/vllm-parity-rule-cpu/``):
- **Paired distance.** Every engine scores the same token ids teacher-forced (``engine_check.py``'s
  ``teacher_forced``: the 10 random prompts, 7,055 positions, in chunked prefill), and the distance of two engines
  is the mean |delta logprob| of the prompt's tokens over all positions. Greedy answers are compared too, over the
  tokens before each request's first divergence (the same contexts there).
- **The model's own floor.** Changes at the rounding level (P kept in float32 instead of the model's dtype, SDPA
  instead of a fused kernel) moved the logprobs by the same amount, within 4%: the floor is the model's
  sensitivity to rounding, not a property of a kernel. The call measures it with engines known to be correct
  (``FLOOR_RUNS``), and a candidate passes at most ``FACTOR`` times the largest floor measured. Without a floor run
  nothing is judged ("NO FLOOR").
- **float16.** In float16 the x1.01 control sits at 12.8x the floor on llama-gqa4 and 5.0x on gemma3-swa; in bf16 at
  1.97x and 1.26x, where no factor separates it from a correct kernel. The parity engines run the model in float16
  (run_call.sh tag ``fp16``).

    python gpu_tests/vllm/parity.py RUNS_DIR [--json parity.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from summarize import load_runs, markdown as markdown_table  # noqa: E402  (puts gpu_tests/sglang on the path)
from compare import requests_of  # noqa: E402

# run_call.sh makes the call's models with these (make_models.py's flags): q/k x2 (attention logits x4), so a
# softmax-scale error moves them; sharper attention grows the models' rounding noise faster than the control's
# effect (gemma3-swa in float16, two prompts teacher-forced: the control at 2.3x the floor with q/k x3, 3.3x with
# x2). 64 strong output rows: wider top-2 gaps than 512
MODEL_ARGS = ("--strong-tokens", "64", "--qk-scale", "2")
REFERENCE = "TRITON_ATTN_auto"
# engines whose distance to the reference is the model's floor: another implementation, and the same kernel with
# other rounding around it (vLLM's eager ops instead of torch.compile's fusions)
FLOOR_RUNS = ("FLASHINFER_auto", "TRITON_ATTN_auto_eager")
FACTOR = 2.0
DTYPE_TAGS = ("fp16",)  # run_call.sh's tags that change the model's dtype: each dtype is judged on its own
# Judged as drift, not parity: an 8-bit cache rounds every K/V value to 3 mantissa bits; vLLM has no MXFP8 attention
# of its own to hold it against, so its distance is reported in floors and not judged.
DRIFT_KV = ("mxfp8", "fp8", "fp8_e4m3")


def split_name(name: str, model: str) -> tuple[str, tuple[str, ...]]:
    """``{model}_{BACKEND}_{kv}[_{tag+tag}]`` -> (``BACKEND_kv``, tags), BACKEND with its own underscores."""
    rest = name[len(model) + 1:]
    parts = rest.split("_")
    for i, part in enumerate(parts):
        if part in ("auto", "bfloat16", "float16", *DRIFT_KV):
            return "_".join(parts[:i + 1]), tuple(t for t in "_".join(parts[i + 1:]).split("+") if t)
    raise ValueError(f"run {name!r}: no KV dtype in its name ({{model}}_{{BACKEND}}_{{kv}}[_{{tags}}])")


def teacher_forced_distance(ref: dict, other: dict) -> dict:
    """Mean |delta logprob| of the prompt tokens over every position both scored (the same contexts by design)."""
    deltas = []
    for a, b in zip(ref.get("teacher_forced") or [], other.get("teacher_forced") or []):
        if a["prompt_ids"] != b["prompt_ids"]:
            raise ValueError(f"{ref.get('label')} and {other.get('label')} scored different prompts")
        deltas += [abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"]) if x is not None and y is not None]
    return {"positions": len(deltas), "mean_abs_dlogprob": statistics.fmean(deltas) if deltas else None,
            "max_abs_dlogprob": max(deltas) if deltas else None}


def greedy_distance(ref: dict, other: dict) -> dict:
    """Mean |delta logprob| of the chosen tokens before each request's first divergence, and how many diverged."""
    deltas, diverged = [], 0
    for a, b in zip(requests_of(ref), requests_of(other)):
        n = min(len(a["output_ids"]), len(b["output_ids"]))
        agree = next((j for j in range(n) if a["output_ids"][j] != b["output_ids"][j]), n)
        diverged += agree < max(len(a["output_ids"]), len(b["output_ids"]))
        deltas += [abs(x - y) for x, y in zip(a["logprobs"][:agree], b["logprobs"][:agree])]
    return {"positions": len(deltas), "requests_diverged": diverged,
            "mean_abs_dlogprob": statistics.fmean(deltas) if deltas else None}


def judge_group(runs: dict[str, dict], model: str, tags: tuple[str, ...]) -> dict:
    """Every run of ``model`` whose tags include ``tags`` (the dtype tag, e.g. ``("fp16",)``) against the reference
    ``{model}_TRITON_ATTN_auto[_{tags}]``; the floor from the ``FLOOR_RUNS`` among them."""
    suffix = "_" + "+".join(tags) if tags else ""
    ref_name = f"{model}_{REFERENCE}{suffix}"
    if ref_name not in runs:
        raise ValueError(f"no reference run {ref_name!r} among {sorted(runs)}")
    ref = runs[ref_name]
    members = {}
    for name, record in sorted(runs.items()):
        if not name.startswith(model + "_") or name == ref_name:
            continue
        engine, run_tags = split_name(name, model)
        if {t for t in run_tags if t in DTYPE_TAGS} == set(tags):
            members[name] = (engine, tuple(t for t in run_tags if t not in tags), record)
    distances = {name: {"teacher_forced": teacher_forced_distance(ref, record), "greedy": greedy_distance(ref, record)}
                 for name, (_, _, record) in members.items()}
    floor_names = [name for name, (engine, extra, _) in members.items()
                   if "_".join((engine,) + extra) in FLOOR_RUNS]
    floors = {kind: max((distances[n][kind]["mean_abs_dlogprob"] or 0.0 for n in floor_names), default=None)
              for kind in ("teacher_forced", "greedy")}
    rows = []
    for name, (engine, extra, _) in members.items():
        kv = engine.rsplit("_", 1)[1]
        kind = "drift" if kv in DRIFT_KV else "floor" if name in floor_names else "parity"
        d = distances[name]
        ratio = {k: (d[k]["mean_abs_dlogprob"] / floors[k] if floors[k] and d[k]["mean_abs_dlogprob"] is not None
                     else None) for k in floors}
        if kind != "parity":
            verdict = kind
        elif not floors["teacher_forced"]:
            verdict = "NO FLOOR"  # none of FLOOR_RUNS ran (or all equal the reference): nothing to judge against
        else:
            verdict = "pass" if ratio["teacher_forced"] <= FACTOR and (ratio["greedy"] is None
                                                                     or ratio["greedy"] <= FACTOR) else "FAIL"
        rows.append({"model": model, "run": name, "judged_as": kind, "verdict": verdict,
                     "tf_positions": d["teacher_forced"]["positions"],
                     "tf_mean_abs_dlogprob": d["teacher_forced"]["mean_abs_dlogprob"],
                     "tf_over_floor": ratio["teacher_forced"],
                     "greedy_positions": d["greedy"]["positions"],
                     "greedy_mean_abs_dlogprob": d["greedy"]["mean_abs_dlogprob"],
                     "greedy_over_floor": ratio["greedy"], "requests_diverged": d["greedy"]["requests_diverged"]})
    return {"reference": ref_name, "floor_runs": floor_names, "floor": floors, "factor": FACTOR, "rows": rows}


def judge_all(runs: dict[str, dict]) -> list[dict]:
    """One group per model and dtype tag that has its reference run."""
    groups = []
    for model in sorted({name.split("_")[0] for name in runs}):
        for tags in ((),) + tuple((t,) for t in DTYPE_TAGS):
            suffix = "_" + "+".join(tags) if tags else ""
            if f"{model}_{REFERENCE}{suffix}" in runs:
                groups.append(judge_group(runs, model, tags))
    return groups


def markdown(rows: list[dict]) -> str:
    keys = ["run", "judged_as", "verdict", "tf_positions", "tf_mean_abs_dlogprob", "tf_over_floor",
            "greedy_positions", "greedy_mean_abs_dlogprob", "greedy_over_floor", "requests_diverged"]
    return markdown_table([{k: r[k] for k in keys} for r in rows])


def report(groups: list[dict]) -> str:
    out = []
    for g in groups:
        out.append(f"### {g['reference']} (floor: {g['floor_runs'] or 'none ran'}, teacher-forced "
                   f"{g['floor']['teacher_forced']}, greedy {g['floor']['greedy']}; pass at <= {g['factor']}x)\n")
        out.append(markdown(g["rows"]))
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="the call's runs/ folder (engine_check.py records)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    groups = judge_all(load_runs(args.runs))  # speed_* runs have no reference: not judged
    print(report(groups))
    if args.json:
        args.json.write_text(json.dumps({"model_args": list(MODEL_ARGS), "groups": groups}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
