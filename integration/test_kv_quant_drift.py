"""Quantized KV on the real models: MXFP8 (UE8M0 scale per 32 channels) against per-tensor fp8 e4m3 (scale 1.0).

Both are compared with the bf16-KV inkling run on the same prompts: token agreement, and the mean |difference| of
the chosen tokens' log-probabilities. The log-probability comparison is paired: over the positions where the bf16,
MXFP8 and fp8 runs all chose the same tokens so far (same context in all three), so the two formats are measured on
the same positions. Per-tensor fp8 KV is this backend's own mode (SGLang's CPU path needs AMX for it).
"""
import statistics

import pytest

from harness import REPORT
from workloads import common_prefix, logprob_deltas, token_agreement

MODELS = ["gemma-3-270m", "smollm2-135m-instruct"]


def _compare(bf16, mxfp8, fp8) -> dict:
    same = {"mxfp8": 0, "fp8_e4m3": 0}
    total = 0
    deltas = {"mxfp8": [], "fp8_e4m3": []}
    for name, reference in bf16.answers.items():
        for kv, run in (("mxfp8", mxfp8), ("fp8_e4m3", fp8)):
            agree, compared = token_agreement(reference, run.answers[name])
            same[kv] += agree
        total += len(reference.output_ids)
        paired = common_prefix(reference, mxfp8.answers[name], fp8.answers[name])
        deltas["mxfp8"] += logprob_deltas(reference, mxfp8.answers[name], paired)
        deltas["fp8_e4m3"] += logprob_deltas(reference, fp8.answers[name], paired)
    return {
        "tokens": total,
        "token_agreement": {kv: round(n / total, 4) for kv, n in same.items()},
        "paired_positions": len(deltas["mxfp8"]),
        "mean_abs_dlogprob": {kv: statistics.fmean(d) if d else None for kv, d in deltas.items()},
        "max_abs_dlogprob": {kv: max(d) if d else None for kv, d in deltas.items()},
    }


@pytest.mark.parametrize("model", MODELS)
def test_mxfp8_drifts_less_than_per_tensor_fp8(workload, model):
    bf16 = workload(model, "inkling", "auto")
    mxfp8 = workload(model, "inkling", "mxfp8")
    fp8 = workload(model, "inkling", "fp8_e4m3")
    numbers = _compare(bf16, mxfp8, fp8)
    numbers["per_token_ms"] = {"bf16": round(bf16.per_token_ms, 1), "mxfp8": round(mxfp8.per_token_ms, 1),
                               "fp8_e4m3": round(fp8.per_token_ms, 1)}
    REPORT.setdefault("kv_quant_vs_bf16", {})[model] = numbers
    print(model, numbers)
    assert numbers["paired_positions"] >= 10, numbers  # enough shared context to compare on
    drift = numbers["mean_abs_dlogprob"]
    assert drift["mxfp8"] < drift["fp8_e4m3"], numbers
