"""Speculative decoding (NGRAM) through the real SGLang server on a CPU: the target's verify steps (several draft
tokens per request over the cached prefix, SGLang's tree or chain mask) on this backend's torch route, against the
same backend without speculation, each divergence decided on the model's own margin (``margins.py``).

SGLang's CPU speculative ops come from the CPU ``sgl_kernel``; the test set-up's stand-in
(``third_party/sglang_cpu/pythonpath/sgl_kernel``) implements NGRAM's in torch after SGLang's own Triton kernels.
Gemma-3 (5 sliding-window layers to 1 full) over a bf16 pool and, with ``INKLING_FULL_INTEGRATION=1`` (CI leaves its
server out for time), a per-tensor fp8 pool; NGRAM's draft trees (10 wide).
An MXFP8 pool (page 128) is refused at start-up with speculation on a CPU: SGLang places a paged pool's draft tokens
with a Triton kernel (``hooks._validate_speculative``). The check is shown failing on a backend whose verify
steps let a draft see no earlier draft (``fault_plugin/``, ``INKLING_FAULT=verify_sees_no_drafts``).
"""
import os

import pytest

from harness import REPORT
from margins import compare_on_margins, verdict_summary

MODEL = "gemma-3-270m"
FULL = os.environ.get("INKLING_FULL_INTEGRATION") == "1"
SPECULATION_OF = {"auto": "ngram", **({"fp8_e4m3": "ngram"} if FULL else {})}  # kv dtype -> harness.SPECULATION
BROKEN = "verify_sees_no_drafts"

_judged: dict[str, dict] = {}


def judged(workload, model_dir, kv: str) -> dict:
    """The same backend without speculation is the reference; NGRAM (and, over bf16, NGRAM on the broken verify)
    the candidates."""
    if kv not in _judged:
        spec = SPECULATION_OF[kv]
        candidates = {"ngram": workload(MODEL, "inkling", kv, spec=spec)}
        if kv == "auto":
            candidates[f"ngram_{BROKEN}"] = workload(MODEL, "inkling", kv, fault=BROKEN, spec=spec)
        result = compare_on_margins(model_dir(MODEL), workload(MODEL, "inkling", kv), candidates)
        for name, run in candidates.items():
            result["candidates"][name]["drafts"] = accepted_drafts(run)
        REPORT.setdefault("speculative_cpu", {})[kv] = result
        _judged[kv] = result
    return _judged[kv]


def accepted_drafts(run) -> dict:
    """Tokens, verify steps and the drafts they accepted over the workload (each verify step gives one token of its
    own plus every draft it accepted)."""
    tokens = sum(len(a.output_ids) for a in run.answers.values())
    steps = sum(a.spec_verify_ct for a in run.answers.values())
    return {"tokens": tokens, "verify_steps": steps, "accepted": tokens - steps - len(run.answers)}


@pytest.mark.parametrize("kv", list(SPECULATION_OF))
def test_ngram_greedy_tokens_match_the_backend_without_speculation_within_the_models_margin(workload, model_dir, kv):
    result = judged(workload, model_dir, kv)
    assert result["candidates"]["ngram"]["passed"], (
        f"NGRAM over {kv} against no speculation: {verdict_summary(result, 'ngram')}")


@pytest.mark.parametrize("kv", list(SPECULATION_OF))
def test_ngram_verify_steps_accepted_drafts(workload, model_dir, kv):
    """The comparison above covers accepted drafts only if some were accepted: the workload's repeats give them."""
    drafts = judged(workload, model_dir, kv)["candidates"]["ngram"]["drafts"]
    assert drafts["verify_steps"] > 0 and drafts["accepted"] >= 10, drafts


def test_the_margin_check_fails_on_verify_steps_whose_drafts_see_no_earlier_draft(workload, model_dir):
    result = judged(workload, model_dir, "auto")
    broken = result["candidates"][f"ngram_{BROKEN}"]
    assert broken["drafts"]["accepted"] >= 10, broken["drafts"]
    assert not broken["passed"], f"verify steps whose drafts see no earlier draft passed the parity check: {broken}"
