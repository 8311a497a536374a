"""bf16 KV: greedy tokens from ``inkling`` identical to SGLang's ``torch_native`` on the real models.

Covers a prompt longer than Gemma-3's 512-token sliding window, 4 concurrent requests (one batch of different
lengths) and a repeated long prefix (a radix-cache hit, so extend runs over a cached prefix).
"""
import pytest

from harness import REPORT
from workloads import REFERENCE_TOKENS

MODELS = ["gemma-3-270m", "smollm2-135m-instruct"]


@pytest.mark.parametrize("model", MODELS)
def test_torch_native_reproduces_the_hf_reference(workload, model):
    # Validates the GGUF -> safetensors conversion and the server set-up independently of our backend.
    reference = REFERENCE_TOKENS[model]
    assert workload(model, "torch_native").answers["reference"].output_ids[:len(reference)] == reference


@pytest.mark.parametrize("model", MODELS)
def test_inkling_greedy_tokens_identical_to_torch_native(workload, model):
    expected = workload(model, "torch_native")
    got = workload(model, "inkling")
    mismatches = {name: (got.answers[name].output_ids, answer.output_ids)
                  for name, answer in expected.answers.items() if got.answers[name].output_ids != answer.output_ids}
    REPORT.setdefault("bf16_inkling_vs_torch_native", {})[model] = {
        "prompts": len(expected.answers), "identical": len(expected.answers) - len(mismatches),
        "startup_s": [round(got.startup_s, 1), round(expected.startup_s, 1)],
        "per_token_ms": [round(got.per_token_ms, 1), round(expected.per_token_ms, 1)]}
    assert not mismatches, f"inkling vs torch_native token mismatches (inkling, torch_native): {mismatches}"


@pytest.mark.parametrize("model", MODELS)
def test_workload_covers_long_prompt_and_prefix_hit(workload, model):
    run = workload(model, "inkling")
    assert run.answers["long"].prompt_tokens > 512  # past Gemma-3's sliding window
    # The second request over the same long prefix reuses it from the radix cache.
    assert run.answers["prefix1"].cached_tokens > 512, run.answers["prefix1"]
