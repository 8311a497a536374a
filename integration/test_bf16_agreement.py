"""bf16 KV: greedy tokens from ``inkling`` identical to SGLang's ``torch_native`` on the real models.

Covers a prompt longer than Gemma-3's 512-token sliding window, 4 concurrent requests (one batch of different
lengths) and a repeated long prefix (a radix-cache hit, so extend runs over a cached prefix).
"""
import pytest

from harness import REPORT
from workloads import REFERENCE_TOKENS, TIE_GAP_NATS, compare_greedy

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
    comparison = compare_greedy(expected, got)
    REPORT.setdefault("bf16_torch_native_vs_inkling", {})[model] = comparison | {
        "startup_s": [round(expected.startup_s, 1), round(got.startup_s, 1)],
        "per_token_ms": [round(expected.per_token_ms, 1), round(got.per_token_ms, 1)]}
    # A divergence is only excused where both runs put the two tokens at most TIE_GAP_NATS apart.
    assert not comparison["mismatches"], (
        f"torch_native vs inkling greedy mismatches (not near-ties <= {TIE_GAP_NATS} nats): {comparison['mismatches']}")


@pytest.mark.parametrize("model", MODELS)
def test_workload_covers_long_prompt_and_prefix_hit(workload, model):
    run = workload(model, "inkling")
    assert run.answers["long"].prompt_tokens > 512  # past Gemma-3's sliding window
    # The second request over the same long prefix reuses it from the radix cache.
    assert run.answers["prefix1"].cached_tokens > 512, run.answers["prefix1"]
