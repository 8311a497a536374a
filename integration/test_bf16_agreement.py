"""bf16 KV: greedy tokens from ``inkling`` against SGLang's ``torch_native`` on the real models, each divergence
decided on the model's own margin (``margins.py``: a float32 oracle, teacher-forced, and the noise the reference
backend itself shows against it).

Covers a prompt longer than Gemma-3's 512-token sliding window, 4 concurrent requests (one batch of different
lengths) and a repeated long prefix (a radix-cache hit, so extend runs over a cached prefix). The same check is
shown failing on a backend with a wrong softmax scale (``fault_plugin/``).
"""
import os

import pytest

from harness import REPORT
from margins import compare_on_margins, verdict_summary
from workloads import REFERENCE_TOKENS

# SmolLM2 (Llama-style, no window) adds two servers, about 3.5 minutes of a 2-core machine: CI leaves it out for its
# time, INKLING_FULL_INTEGRATION=1 runs it (its numbers: integration/results/README.md).
MODELS = ["gemma-3-270m"] + (["smollm2-135m-instruct"] if os.environ.get("INKLING_FULL_INTEGRATION") == "1" else [])
FAULT_MODEL = "gemma-3-270m"  # the broken backend is served once, on the model with sliding-window layers

_judged: dict[str, dict] = {}


def judged(workload, model_dir, model: str) -> dict:
    """torch_native is the reference; inkling (and, on FAULT_MODEL, the broken inkling) are the candidates."""
    if model not in _judged:
        candidates = {"inkling": workload(model, "inkling")}
        if model == FAULT_MODEL:
            candidates["inkling_wrong_softmax_scale"] = workload(model, "inkling", fault=True)
        result = compare_on_margins(model_dir(model), workload(model, "torch_native"), candidates)
        REPORT.setdefault("bf16_torch_native_vs_inkling", {})[model] = result
        _judged[model] = result
    return _judged[model]


@pytest.mark.parametrize("model", MODELS)
def test_torch_native_reproduces_the_hf_reference(workload, model):
    # Validates the GGUF -> safetensors conversion and the server set-up independently of our backend.
    reference = REFERENCE_TOKENS[model]
    assert workload(model, "torch_native").answers["reference"].output_ids[:len(reference)] == reference


@pytest.mark.parametrize("model", MODELS)
def test_inkling_greedy_tokens_match_torch_native_within_the_models_margin(workload, model_dir, model):
    result = judged(workload, model_dir, model)
    assert result["candidates"]["inkling"]["passed"], (
        f"inkling against torch_native on {model}: {verdict_summary(result, 'inkling')}")


def test_the_margin_check_fails_on_a_backend_with_a_wrong_softmax_scale(workload, model_dir):
    result = judged(workload, model_dir, FAULT_MODEL)
    broken = result["candidates"]["inkling_wrong_softmax_scale"]
    assert not broken["passed"], f"a softmax scale off by 25% passed the parity check: {broken}"
    # It is the error level that gives it away: its greedy divergences come early, where margins are small.
    assert broken["error_level"]["exceeds_reference"], broken


@pytest.mark.parametrize("model", MODELS)
def test_workload_covers_long_prompt_and_prefix_hit(workload, model):
    run = workload(model, "inkling")
    assert run.answers["long"].prompt_tokens > 512  # past Gemma-3's sliding window
    # The second request over the same long prefix reuses it from the radix cache.
    assert run.answers["prefix1"].cached_tokens > 512, run.answers["prefix1"]
