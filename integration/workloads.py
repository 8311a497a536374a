"""The prompts every integration server answers, and how their answers are compared.

Each server configuration (model, attention backend, KV dtype, tp size) runs the whole workload once: sequential
greedy prompts (one longer than Gemma-3's 512-token sliding window), 4 concurrent requests, a repeated prefix (a
prefix-cache hit) and a short timing probe. Tests then compare the recorded runs, so each server lives only as
long as its workload.
"""
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

# Greedy tokens for "The capital of France is" from HF transformers on the converted checkpoints
# (shared/notes/sglang_cpu_probe.md); the torch_native runs must reproduce them, which validates the conversion.
REFERENCE_PROMPT = "The capital of France is"
REFERENCE_TOKENS = {
    "smollm2-135m-instruct": [7042, 30, 198, 198, 504, 2988, 314, 42],
    "gemma-3-270m": [506, 5279, 529, 506, 2891, 529, 7001, 236761],
}

NEW_TOKENS = 16


def _long_document() -> str:
    # About 900 tokens with either tokenizer: well past Gemma-3's 512-token window, so windowed layers must mask.
    lines = [f"Entry {i}: the {colour} lighthouse on island {i * 7 % 31} was repainted in {1900 + i * 3}."
             for i, colour in zip(range(1, 49), ["red", "white", "green", "blue"] * 12)]
    return "Harbour records.\n" + "\n".join(lines) + "\n"


LONG_DOCUMENT = _long_document()

SEQUENTIAL_PROMPTS = {
    "reference": REFERENCE_PROMPT,
    "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "story": "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "long": LONG_DOCUMENT + "Question: which colour was the lighthouse on island 14? Answer:",
}
CONCURRENT_PROMPTS = [
    "The three primary colours are",
    "In 1969, the first humans to walk on the Moon were",
    LONG_DOCUMENT[:1200] + "Summary of the records above:",
    "List of prime numbers: 2, 3, 5, 7,",
]
# The same long prefix twice with different questions: the second request reuses the radix cache.
PREFIX_PROMPTS = [
    LONG_DOCUMENT + "Question: in which year was the lighthouse on island 7 repainted? Answer:",
    LONG_DOCUMENT + "Question: how many entries are in the records? Answer:",
]
TIMING_PROMPT = "Write a sentence about the weather:"
TIMING_TOKENS = 32
TIMING_REPEATS = 3


# SGLang on CPU returns bf16 logits: two tokens whose logits are one bf16 step apart (0.0625 nats for logits in
# [8, 16), 0.125 in [16, 32)) can swap places under any change of rounding, e.g. fp32 vs bf16 attention. Where both
# runs rank the two diverging tokens as their top two at most this far apart, tests report a tie instead of failing.
TIE_GAP_NATS = 0.125


@dataclass
class Answer:
    output_ids: list[int]
    logprobs: list[float]
    top2: list[list[tuple[int, float]]]  # per position: the two most likely (token, logprob)
    cached_tokens: int
    prompt_tokens: int


@dataclass
class WorkloadRun:
    config: dict
    startup_s: float
    answers: dict[str, Answer] = field(default_factory=dict)
    per_token_ms: float | None = None
    prefill_ms: float | None = None


def _answer(server, prompt: str, max_new_tokens: int = NEW_TOKENS) -> Answer:
    out = server.generate(prompt, max_new_tokens=max_new_tokens, return_logprob=True, top_logprobs_num=2)
    meta = out["meta"]
    return Answer(output_ids=list(out["output_ids"]), logprobs=out["logprobs"],
                  top2=[[tuple(pair) for pair in position] for position in out["top_logprobs"]],
                  cached_tokens=int(meta.get("cached_tokens", 0)), prompt_tokens=int(meta.get("prompt_tokens", 0)))


def run_workload(server, config: dict) -> WorkloadRun:
    run = WorkloadRun(config=config, startup_s=server.startup_seconds)
    for name, prompt in SEQUENTIAL_PROMPTS.items():
        run.answers[name] = _answer(server, prompt)
    with ThreadPoolExecutor(max_workers=len(CONCURRENT_PROMPTS)) as pool:
        for i, answer in enumerate(pool.map(lambda p: _answer(server, p), CONCURRENT_PROMPTS)):
            run.answers[f"concurrent{i}"] = answer
    for i, prompt in enumerate(PREFIX_PROMPTS):
        run.answers[f"prefix{i}"] = _answer(server, prompt)
    # Decode time per token: a TIMING_TOKENS-token request minus a 1-token one on the same (then cached) prompt,
    # best of TIMING_REPEATS (a shared CPU makes single measurements noisy). Reported, never asserted.
    one = min(_seconds(server, 1) for _ in range(TIMING_REPEATS))
    many = min(_seconds(server, TIMING_TOKENS) for _ in range(TIMING_REPEATS))
    run.prefill_ms = one * 1000
    run.per_token_ms = (many - one) / (TIMING_TOKENS - 1) * 1000
    return run


def _seconds(server, max_new_tokens: int) -> float:
    started = time.perf_counter()
    server.generate(TIMING_PROMPT, max_new_tokens=max_new_tokens)
    return time.perf_counter() - started


def token_agreement(a: Answer, b: Answer) -> tuple[int, int]:
    """(positions with the same token, positions compared)."""
    n = min(len(a.output_ids), len(b.output_ids))
    return sum(x == y for x, y in zip(a.output_ids[:n], b.output_ids[:n])), n


def common_prefix(*answers: Answer) -> int:
    """Number of leading positions where every answer chose the same token (same context up to there)."""
    n = 0
    for tokens in zip(*(a.output_ids for a in answers)):
        if len(set(tokens)) != 1:
            break
        n += 1
    return n


def logprob_deltas(reference: Answer, other: Answer, positions: int) -> list[float]:
    """|logprob difference| of the chosen tokens over the first ``positions`` positions (where both chose the same
    token after the same context)."""
    return [abs(x - y) for x, y in zip(reference.logprobs[:positions], other.logprobs[:positions])]


def first_divergence(a: Answer, b: Answer) -> int | None:
    """First position where the two greedy sequences differ (None when identical)."""
    n = common_prefix(a, b)
    return None if n == len(a.output_ids) == len(b.output_ids) else n


def _gap_between(answer: Answer, position: int, token_a: int, token_b: int) -> float | None:
    top = dict(answer.top2[position]) if position < len(answer.top2) else {}
    if token_a in top and token_b in top:
        return abs(top[token_a] - top[token_b])
    return None


def divergence_is_near_tie(a: Answer, b: Answer) -> tuple[bool, dict]:
    """Whether the first divergence of a and b is at a near-tie: both runs rank the two chosen tokens as their top
    two, at most TIE_GAP_NATS apart. Returns (is_tie, details)."""
    position = first_divergence(a, b)
    if position is None:
        return True, {}
    if position >= min(len(a.output_ids), len(b.output_ids)):
        return False, {"position": position, "reason": "different lengths"}
    token_a, token_b = a.output_ids[position], b.output_ids[position]
    gaps = [_gap_between(a, position, token_a, token_b), _gap_between(b, position, token_a, token_b)]
    details = {"position": position, "tokens": [token_a, token_b], "top2_gaps": gaps}
    return all(g is not None and g <= TIE_GAP_NATS for g in gaps), details


def compare_greedy(expected: "WorkloadRun", got: "WorkloadRun") -> dict:
    """Per-prompt comparison: identical, diverged at a near-tie, or mismatched (a real difference)."""
    identical, ties, mismatches = [], {}, {}
    for name, answer in expected.answers.items():
        other = got.answers[name]
        if other.output_ids == answer.output_ids:
            identical.append(name)
            continue
        is_tie, details = divergence_is_near_tie(answer, other)
        details["sequences"] = [answer.output_ids, other.output_ids]
        (ties if is_tie else mismatches)[name] = details
    return {"prompts": len(expected.answers), "identical": len(identical), "near_ties": ties,
            "mismatches": mismatches}
