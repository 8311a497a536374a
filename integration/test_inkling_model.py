"""SGLang's in-tree Inkling model (``InklingForConditionalGeneration``: short-conv K/V, q/k RMSNorm, learned relative
bias, softmax scale 1/D, 5 local : 1 full layers) served by the real SGLang server on this CPU with
``--attention-backend inkling``, inside SGLang's hybrid SWA pool.

The model is ``gpu_tests/sglang/make_models.py``'s ``inkling-swa`` (tiny widths), served with ``--load-format dummy``
and the harness's seeded initializer. The harness's test-only patches (``gpu_tests/sglang/patches/sitecustomize.py``)
let it start on a CPU:
- the FA4 package gets an empty ``__init__`` (nvidia-cutlass-dsl is absent);
- there is no chat adapter (tml-renderers is absent);
- the mamba extra-buffer platform check, the autotuner's benchmark and pinned memory are stubbed: the model needs
  all three;
- ``TRITON_INTERPRET=1`` runs SGLang's own short-conv Triton kernels.

SGLang's triton attention backend is no peer here: on the same inputs its interpreted kernels return values near
1e9. Our output is instead checked against a float64 oracle on the model's own q/k/v and relative bias, which the
server dumps for the first attention calls of a 24-token prefill (``INKLING_TEST_DUMP_ATTENTION``)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from harness import HERE, REPORT, STARTUP_TIMEOUT_S
from sglang_inkling_backend.attention_inputs import AttentionParams
from sglang_inkling_backend.reference.attention import attend

GPU_HARNESS = HERE.parent / "gpu_tests" / "sglang"
PROMPT_LEN = 24
# bf16 output rounding, the GPU checks' decode bound (gpu_tests/check_triton_gpu.py DECODE_TOL)
TOL = 4e-3
PATCHES = {"INKLING_TEST_NO_CUTE_INIT": "1", "INKLING_TEST_SEEDED_INIT": "1", "INKLING_TEST_NO_INKLING_CHAT": "1",
           "INKLING_TEST_CPU_MAMBA_EXTRA_BUFFER": "1", "TRITON_INTERPRET": "1"}
KV_FORMATS = ["auto"] + (["mxfp8"] if os.environ.get("INKLING_FULL_INTEGRATION") == "1" else [])


@pytest.fixture(scope="module")
def inkling_model(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("inkling-model")
    subprocess.run([sys.executable, str(GPU_HARNESS / "make_models.py"), "--tokenizer",
                    str(model_dir("smollm2-135m-instruct")), "--out", str(out), "--models", "inkling-swa", "--tiny"],
                   check=True, capture_output=True, text=True, timeout=300)
    return out / "inkling-swa"


@pytest.fixture(scope="module", params=KV_FORMATS)
def served(request, inkling_model, tmp_path_factory):
    kv = request.param
    work = tmp_path_factory.mktemp(f"inkling-{kv}")
    dump = work / "attention"
    dump.mkdir()
    env = {**os.environ, **PATCHES, "INKLING_TEST_DUMP_ATTENTION": str(dump), "INKLING_TEST_DUMP_CALLS": "6"}
    log = work / "server.log"
    cmd = [sys.executable, str(GPU_HARNESS / "serve_check.py"), "--cpu", "--model", str(inkling_model),
           "--backend", "inkling", "--kv-cache-dtype", kv, "--out", str(work / "run.json"), "--log", str(log),
           "--lens", str(PROMPT_LEN), "--new-tokens", "4", "--startup-timeout", str(STARTUP_TIMEOUT_S), "--",
           "--load-format", "dummy", "--swa-full-tokens-ratio", "1.0", "--max-total-tokens", "4096",
           "--watchdog-timeout", "1500"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
    server_log = log.read_text(errors="replace") if log.exists() else ""
    return kv, proc, server_log, dump, work / "run.json"


def test_the_inkling_model_serves_on_our_backend_in_sglangs_hybrid_swa_pool(served):
    kv, proc, server_log, _, run = served
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{server_log[-4000:]}"
    record = json.loads(run.read_text())
    assert record["errors"] == []
    requests = record["concurrent"] + [record["text"], record["prefix_hit"]]
    assert all(len(r["output_ids"]) >= 4 for r in requests), [len(r["output_ids"]) for r in requests]
    assert f"backend ready: {'bf16' if kv == 'auto' else 'mxfp8'} KV" in server_log
    assert "SWAKVPool pool" in server_log and "Inkling model seam installed" in server_log


def oracle(call, with_bias=True):
    """float64 causal attention of one sequence (positions 0..T-1) on the dumped q/k/v, with the layer's scale, its
    window (SGLang's sliding_window_size W keeps distances <= W) and the relative bias rel[t, h, t - j]."""
    T, D = call["q"].shape[0], 128
    q, k, v = (call[n].double().view(T, -1, D) for n in ("q", "k", "v"))
    window = call["window"] + 1 if call["window"] >= 0 else None
    params = AttentionParams(softmax_scale=call["scaling"], window=window)
    return attend(q, torch.arange(T), k, v, params, call["rel"].double() if with_bias else None)


def test_every_layers_prefill_attention_matches_the_float64_oracle_on_the_models_inputs(served):
    kv, proc, _, dump, _ = served
    if kv != "auto":
        pytest.skip("the oracle runs on the bf16 K/V the model produced; MXFP8 reads them quantized")
    assert proc.returncode == 0
    calls = [torch.load(dump / f"call{i}.pt", weights_only=False) for i in range(6)]
    assert [c["layer"] for c in calls] == list(range(6))
    assert sorted({c["window"] for c in calls}) == [-1, 255]  # local (window 256 keys) and full layers
    assert "rel_bias" in calls[0]["kwargs"]  # the FA4 contract the seam answers with
    errors = REPORT.setdefault("inkling_model_prefill_attention_rel_err_by_layer", {})
    without_bias = REPORT.setdefault("inkling_model_prefill_attention_rel_err_without_bias_by_layer", {})
    for call in calls:
        T = call["q"].shape[0]
        assert T == PROMPT_LEN and torch.equal(call["positions"].cpu(), torch.arange(T)), "one fresh prefill"
        want = oracle(call)
        got = call["out"].double().view(want.shape)
        err = ((got - want).norm() / want.norm()).item()
        errors[call["layer"]] = round(err, 6)
        assert err <= TOL, f"layer {call['layer']}: relative error {err:.2e} > {TOL}"
        # the check can fail: without the relative bias the oracle is far from our output at these weights
        no_bias = oracle(call, with_bias=False)
        without_bias[call["layer"]] = round(((got - no_bias).norm() / no_bias.norm()).item(), 4)
        assert without_bias[call["layer"]] > 10 * TOL
