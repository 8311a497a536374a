"""Quantized KV on the real models: MXFP8 (UE8M0 scale per 32 channels) against per-tensor fp8 e4m3 (scale 1.0).

What is asserted is what holds beyond noise:

1. **End to end, teacher-forced** (``test_mxfp8_is_not_worse_than_per_tensor_fp8_beyond_noise``): each format's
   server scores the same long real text (``workloads.TEACHER_FORCED_TEXT``, 1,100-1,200 tokens, past Gemma-3's
   window) in chunked prefill of ``workloads.TEACHER_FORCED_CHUNK`` tokens, so each position reads most of its keys
   back from the quantized pool (an extend reads only its own chunk's keys from the forward). The bf16, MXFP8 and
   fp8 runs give log-probabilities at identical contexts.
   Both quantized runs must differ from bf16 at most positions: scored in one extend (no chunks) they read no
   quantized key and drifted exactly 0.0 (``integration/results/last_run.json`` of 2026-12-03), which this catches.
   Per position, the drift of each format is ``|log p_format - log p_bf16|``; the paired difference
   ``drift_mxfp8 - drift_fp8`` is averaged in blocks of ``BLOCK`` consecutive positions (neighbouring positions
   share context, so single positions are not independent) and its mean is judged by ``z = mean / standard error``
   over the blocks. MXFP8 drifting more than fp8 with ``z > SIGNIFICANT_Z`` fails; anything else is recorded with
   its verdict ("within noise" or which format drifts less). On these two models the two formats store 98-99% of
   the K/V values identically (measured below), so the order between them is expected to be noise, and is not
   asserted. The long-context table on the same models with rescaled K/V is
   ``bench/results/current/accuracy/`` (``long_context_accuracy.py``).
2. **Format error on the model's own K/V** (``test_mxfp8_keeps_the_models_kv_precision_where_per_tensor_fp8_loses_it``,
   ``kv_format_error.py``): SmolLM2's real K/V, and the same K/V under two function-preserving rescalings (outlier
   K channels above 448, V below e4m3's normal range). These are deterministic numbers, not samples: MXFP8's error
   stays at its error on the unscaled data, per-tensor fp8 at scale 1.0 loses 2-5x more (measured 0.0259 against
   0.0547 for K, 0.0266 against 0.1467 for V).

With ``INKLING_FULL_INTEGRATION=1``, greedy token agreement with the bf16 run and the mean |Δ logprob| over shared
greedy prefixes are recorded too (not asserted; CI leaves their two servers, MXFP8 and fp8 greedy workloads, out for
time: MXFP8 decode through the real server is served in CI by ``test_load_and_faults.py``).
"""
import json
import math
import os
import statistics
import subprocess
import sys

import pytest

from harness import HERE, REPORT
from demo.cpu_host import cpu_env
from workloads import common_prefix, logprob_deltas, token_agreement

# CI serves the drift runs on Gemma-3 (the hybrid model); SmolLM2's extra servers (about 3 minutes on the 2-core
# CI machine) and the greedy workloads run with INKLING_FULL_INTEGRATION=1. Its numbers are in
# integration/results/README.md.
FULL = os.environ.get("INKLING_FULL_INTEGRATION") == "1"
MODELS = ["gemma-3-270m"] + (["smollm2-135m-instruct"] if FULL else [])
BLOCK = 64
SIGNIFICANT_Z = 4.0  # one-sided; P(z > 4) < 1e-4 for a difference that is only noise


MOVED_FRACTION = 0.5  # both quantized runs must move at least this share of positions off bf16


def teacher_forced_drift(bf16, mxfp8, fp8) -> dict:
    for run in (mxfp8, fp8):
        if run.text_ids != bf16.text_ids or len(run.text_logprobs) != len(bf16.text_logprobs):
            raise AssertionError(f"{run.config}: the teacher-forced text was not scored on the same tokens")
    drift = {kv: [abs(x - y) for x, y in zip(run.text_logprobs, bf16.text_logprobs)]
             for kv, run in (("mxfp8", mxfp8), ("fp8_e4m3", fp8))}
    diff = [a - b for a, b in zip(drift["mxfp8"], drift["fp8_e4m3"])]
    blocks = [statistics.fmean(diff[i:i + BLOCK]) for i in range(0, len(diff) - BLOCK + 1, BLOCK)]
    mean = statistics.fmean(blocks)
    stderr = statistics.stdev(blocks) / math.sqrt(len(blocks))
    z = mean / stderr if stderr > 0 else (0.0 if mean == 0 else math.copysign(math.inf, mean))
    verdict = ("within noise" if abs(z) <= SIGNIFICANT_Z else
               "mxfp8 drifts less beyond noise" if z < 0 else "mxfp8 drifts more beyond noise")
    return {"positions": len(diff), "blocks": len(blocks),
            "mean_abs_dlogprob": {kv: statistics.fmean(d) for kv, d in drift.items()},
            "moved_fraction": {kv: sum(x > 0 for x in d) / len(d) for kv, d in drift.items()},
            "mean_paired_difference": mean, "stderr": stderr, "z": z, "verdict": verdict}


def greedy_drift(bf16, mxfp8, fp8) -> dict:
    same = {"mxfp8": 0, "fp8_e4m3": 0}
    total = 0
    deltas = {"mxfp8": [], "fp8_e4m3": []}
    for name, reference in bf16.answers.items():
        for kv, run in (("mxfp8", mxfp8), ("fp8_e4m3", fp8)):
            same[kv] += token_agreement(reference, run.answers[name])[0]
        total += len(reference.output_ids)
        paired = common_prefix(reference, mxfp8.answers[name], fp8.answers[name])
        deltas["mxfp8"] += logprob_deltas(reference, mxfp8.answers[name], paired)
        deltas["fp8_e4m3"] += logprob_deltas(reference, fp8.answers[name], paired)
    return {"tokens": total, "token_agreement": {kv: round(n / total, 4) for kv, n in same.items()},
            "paired_positions": len(deltas["mxfp8"]),
            "mean_abs_dlogprob": {kv: statistics.fmean(d) if d else None for kv, d in deltas.items()}}


@pytest.mark.parametrize("model", MODELS)
def test_mxfp8_is_not_worse_than_per_tensor_fp8_beyond_noise(workload, teacher_forced, model):
    text = [teacher_forced(model, kv) for kv in ("auto", "mxfp8", "fp8_e4m3")]
    assert len(text[0].text_ids) > 1024 and len(text[0].text_logprobs) == len(text[0].text_ids) - 1
    numbers = {"teacher_forced": teacher_forced_drift(*text)}
    if FULL:
        bf16, mxfp8, fp8 = (workload(model, "inkling", kv) for kv in ("auto", "mxfp8", "fp8_e4m3"))
        numbers["greedy"] = greedy_drift(bf16, mxfp8, fp8)
        numbers["per_token_ms"] = {"bf16": round(bf16.per_token_ms, 1), "mxfp8": round(mxfp8.per_token_ms, 1),
                                   "fp8_e4m3": round(fp8.per_token_ms, 1)}
    REPORT.setdefault("kv_quant_vs_bf16", {})[model] = numbers
    print(model, json.dumps(numbers))
    tf = numbers["teacher_forced"]
    assert tf["blocks"] >= 16, tf  # enough blocks for the standard error to mean something
    # the quantized cache was read: a format that moved no logprob compared nothing
    assert min(tf["moved_fraction"].values()) >= MOVED_FRACTION, tf
    assert tf["z"] <= SIGNIFICANT_Z, f"MXFP8 drifts more than per-tensor fp8 beyond noise on {model}: {tf}"


def test_mxfp8_keeps_the_models_kv_precision_where_per_tensor_fp8_loses_it(model_dir, tmp_path):
    model = "smollm2-135m-instruct"
    model_dir(model)  # prepared once for the session
    out = tmp_path / "format_error.json"
    proc = subprocess.run([sys.executable, str(HERE / "kv_format_error.py"), model, "--json", str(out)],
                          env=cpu_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    numbers = json.loads(out.read_text())
    REPORT.setdefault("kv_format_error", {})[model] = numbers
    own = numbers["model"]
    # The model's own K/V fit e4m3's normal range: both formats store nearly the same values (recorded, no order).
    assert own["above_448_fraction"] == 0.0 and own["same_value_fraction"] > 0.9, own
    for data, unscaled in (("k_outlier_channels", "model_k"), ("v_scaled_down", "model_v")):
        rescaled, base = numbers[data], numbers[unscaled]
        # Power-of-two block scales absorb a power-of-two rescale (errors in the model's units, so the same function):
        # MXFP8 keeps its error on the unscaled data, per-tensor fp8 at scale 1.0 saturates or goes subnormal.
        assert rescaled["mxfp8"] < 1.1 * base["mxfp8"], (data, rescaled, base)
        assert rescaled["fp8_scale_1"] > 1.5 * rescaled["mxfp8"], (data, rescaled)
