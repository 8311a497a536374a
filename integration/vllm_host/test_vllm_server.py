"""The real vLLM OpenAI server on the CPU with ``--attention-backend CUSTOM`` (this backend, found through its entry
points), next to vLLM's own CPU_ATTN on the same model and prompts (``workloads.py``: a prompt past Gemma-3's
512-token window, 4 concurrent requests of mixed lengths, a repeated long prefix that hits vLLM's prefix cache;
prompts over 512 tokens are prefilled in chunks, ``vllm_server.MAX_NUM_BATCHED_TOKENS``).

- bf16 KV: greedy tokens against CPU_ATTN, each divergence decided on the model's own margin (``margins.py``);
- MXFP8 KV (``--kv-cache-dtype fp8_per_token_head`` with this backend) and per-tensor fp8 against bf16: greedy
  agreement and |Δ logprob| over shared prefixes, MXFP8 not worse than fp8 beyond noise;
- KV tokens that fit in the same memory, per format, from vLLM's own log;
- refusals at start-up that name the flag, and ``fp8_per_token_head`` keeping vLLM's meaning without this backend.
"""
import math
import re
import statistics

import pytest

from harness import REPORT
from margins import compare_on_margins
from demo.server import ServerStartError
from demo.vllm_server import MAX_NUM_BATCHED_TOKENS, VllmServer
from workloads import REFERENCE_TOKENS, common_prefix, logprob_deltas, token_agreement

MODEL = "gemma-3-270m"  # 5 sliding-window (512) : 1 full layers, head_dim 256: vLLM makes 6 KV-cache groups
MXFP8 = "fp8_per_token_head"
SIGNIFICANT_Z = 4.0
USING_CUSTOM = "inkling: using --attention-backend CUSTOM on CPU"


def kv_tokens(log: str) -> int:
    found = re.findall(r"CPU KV cache size: ([\d,]+) tokens", log)
    assert found, "vLLM did not log its KV cache size"
    return int(found[-1].replace(",", ""))


def test_the_plugin_is_found_and_serves_every_layer(vllm_workload):
    _, ours = vllm_workload(MODEL, "CUSTOM", "auto")
    _, theirs = vllm_workload(MODEL, "default", "auto")
    assert USING_CUSTOM in ours and "attention route: torch reference (device cpu)" in ours
    assert "Cannot use AttentionBackendEnum.CUSTOM backend on CPU" not in ours
    assert USING_CUSTOM not in theirs
    # 18 layers in 6 groups of 128-token blocks, one block pool: the hybrid manager ran with this backend.
    assert "kv cache group sizes (128, 128, 128, 128, 128, 128)" in ours


def test_cpu_attn_reproduces_the_hf_reference(vllm_workload):
    # Validates the converted checkpoint, its <bos>, and the server set-up independently of this backend.
    run, _ = vllm_workload(MODEL, "default", "auto")
    assert run.answers["reference"].prompt_ids[0] == 2  # <bos>
    assert run.answers["reference"].output_ids[:8] == REFERENCE_TOKENS[MODEL]


def test_bf16_greedy_tokens_match_cpu_attn_within_the_models_margin(vllm_workload, model_dir):
    ours, _ = vllm_workload(MODEL, "CUSTOM", "auto")
    reference, _ = vllm_workload(MODEL, "default", "auto")
    result = compare_on_margins(model_dir(MODEL), reference, {"CUSTOM": ours})
    REPORT.setdefault("vllm_bf16_cpu_attn_vs_custom", {})[MODEL] = result
    verdict = result["candidates"]["CUSTOM"]
    assert verdict["passed"], (f"CUSTOM against CPU_ATTN: divergences beyond the noise bound {result['noise_bound']} "
                               f"{verdict['mismatches']}, error level {verdict['error_level']} (near-ties excused: "
                               f"{verdict['excused_near_ties']})")


def test_workload_covers_the_window_concurrency_and_a_prefix_cache_hit(vllm_workload):
    run, _ = vllm_workload(MODEL, "CUSTOM", "auto")
    assert run.answers["long"].prompt_tokens > 512  # past the sliding window
    assert len({len(run.answers[f"concurrent{i}"].prompt_ids) for i in range(4)}) == 4  # mixed lengths
    assert run.answers["prefix1"].cached_tokens >= 512, run.answers["prefix1"]  # whole blocks from the cache
    assert run.answers["long"].prompt_tokens > MAX_NUM_BATCHED_TOKENS  # prefilled in two chunks


def paired_z(a: list[float], b: list[float]) -> float:
    diff = [x - y for x, y in zip(a, b)]
    stderr = statistics.stdev(diff) / math.sqrt(len(diff))
    mean = statistics.fmean(diff)
    return mean / stderr if stderr > 0 else (0.0 if mean == 0 else math.copysign(math.inf, mean))


def test_mxfp8_against_bf16_next_to_per_tensor_fp8(vllm_workload):
    bf16, _ = vllm_workload(MODEL, "CUSTOM", "auto")
    mxfp8, _ = vllm_workload(MODEL, "CUSTOM", MXFP8)
    fp8, _ = vllm_workload(MODEL, "CUSTOM", "fp8_e4m3")
    same = {"mxfp8": 0, "fp8_e4m3": 0}
    deltas = {"mxfp8": [], "fp8_e4m3": []}
    total = 0
    for name, reference in bf16.answers.items():
        total += len(reference.output_ids)
        for kv, run in (("mxfp8", mxfp8), ("fp8_e4m3", fp8)):
            same[kv] += token_agreement(reference, run.answers[name])[0]
        shared = common_prefix(reference, mxfp8.answers[name], fp8.answers[name])
        deltas["mxfp8"] += logprob_deltas(reference, mxfp8.answers[name], shared)
        deltas["fp8_e4m3"] += logprob_deltas(reference, fp8.answers[name], shared)
    z = paired_z(deltas["mxfp8"], deltas["fp8_e4m3"])
    result = {"tokens": total, "token_agreement": {kv: round(n / total, 4) for kv, n in same.items()},
              "paired_positions": len(deltas["mxfp8"]),
              "mean_abs_dlogprob": {kv: round(statistics.fmean(d), 4) for kv, d in deltas.items()},
              "paired_z_mxfp8_minus_fp8": round(z, 2)}
    REPORT.setdefault("vllm_kv_quant_drift", {})[MODEL] = result
    assert len(deltas["mxfp8"]) >= 50, result
    assert z <= SIGNIFICANT_Z, f"MXFP8 drifts from bf16 more than per-tensor fp8 beyond noise: {result}"


def test_kv_tokens_per_format_in_the_same_memory(vllm_workload):
    tokens = {kv: kv_tokens(vllm_workload(MODEL, "CUSTOM", kv)[1]) for kv in ("auto", MXFP8, "fp8_e4m3")}
    REPORT.setdefault("vllm_kv_tokens_1gib", {})[MODEL] = tokens
    # Pages of 128 tokens, 1 KV head, head_dim 256: bf16 1,024 B per token and layer, fp8 512, MXFP8 528.
    assert tokens[MXFP8] / tokens["auto"] == pytest.approx(1024 / 528, rel=0.01)
    assert tokens["fp8_e4m3"] / tokens["auto"] == pytest.approx(2.0, rel=0.01)


def test_a_bad_configuration_is_refused_at_startup_naming_the_flag(vllm_failed_startup):
    # One refusal through the real server; the others (head size, KV dtype, KV connector) are checked through the
    # same platform call in tests/hosts/vllm/test_vllm_plugin.py, without a start-up each.
    log = vllm_failed_startup(MODEL, "CUSTOM", MXFP8, ("--block-size", "64"))
    assert "MXFP8 KV needs --block-size 128, got 64" in log, log[-3000:]


def test_fp8_per_token_head_keeps_vllms_meaning_without_this_backend(model_dir, vllm_logs, vllm_workload):
    """Without ``--attention-backend CUSTOM`` the flag is vLLM's per-token-head fp8: CPU_ATTN serves it where the
    CPU can, or refuses it (x86 without AVX-512 or AMX: ``cpu_attn.py`` ``_get_attn_isa``). Served, its pages are
    vLLM's own size: CPU_ATTN has no ``customize_spec``, so a token and layer take (256 + 256) x 1 B = 512 B
    (``AttentionSpec.state_content_size_bytes``), the same as per-tensor fp8 and not MXFP8's 528. Either way this
    backend never reads that cache."""
    server = VllmServer(model_dir(MODEL), "default", MXFP8, log_path=vllm_logs / "default-fp8-per-token-head.log")
    try:
        server.start()
        log = server.log_text()
        server.stop()
        started = True
    except ServerStartError as err:
        log, started = err.log, False
    assert USING_CUSTOM not in log
    if started:
        bf16_tokens = kv_tokens(vllm_workload(MODEL, "CUSTOM", "auto")[1])
        assert kv_tokens(log) / bf16_tokens == pytest.approx(1024 / 512, rel=0.004)  # MXFP8 would be 1024 / 528
    else:
        assert "FP8 KV cache on CPU requires" in log, log[-3000:]
