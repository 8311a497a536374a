"""The prompts every integration server answers, and how their answers are compared.

Each server configuration (model, attention backend, KV dtype, tp size) runs the whole workload once: sequential
greedy prompts (one longer than Gemma-3's 512-token sliding window), 4 concurrent requests, a repeated prefix (a
prefix-cache hit) and a short timing probe. Tests then compare the recorded runs, so each server lives only as
long as its workload.
"""
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# Greedy tokens for "The capital of France is" from HF transformers 5.24 on the converted checkpoints:
# SmolLM2 " Paris.\n\nThe answer is:", Gemma " the capital of the country of France."; the torch_native runs
# must reproduce them, which validates the conversion.
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
TIMING_REPEATS = 1  # reported, never asserted; integration/measure_times.py measures best-of-N for the record


# A long real text (public domain: the first 1,100-1,200 tokens of the US Declaration of Independence, past
# Gemma-3's 512-token window) scored teacher-forced: the server returns each token's log-probability after the ones
# before it, so all runs of one model are compared at the same contexts, position by position. It is scored by a
# server of its own with chunked prefill of TEACHER_FORCED_CHUNK tokens: an extend reads its own new keys from the
# forward (unrounded, as SGLang's backends do) and only older keys from the cache, so scored in one extend the text
# would never read the quantized cache (MXFP8 and fp8 both 0.0 nats from bf16 on Gemma-3, measured). In chunks of
# 128 a query reads at least 3/4 of a 512-token window, and nearly all of a full layer's keys, from the cache.
TEACHER_FORCED_TEXT = (Path(__file__).resolve().parent / "data" / "declaration_of_independence.txt").read_text()
TEACHER_FORCED_CHUNK = 128


@dataclass
class Answer:
    output_ids: list[int]
    logprobs: list[float]
    top2: list[list[tuple[int, float]]]  # per position: the two most likely (token, logprob)
    cached_tokens: int
    prompt_tokens: int
    prompt_ids: list[int] = field(default_factory=list)
    spec_verify_ct: int = 0  # speculative verify steps SGLang ran for it (0 without speculation)


@dataclass
class WorkloadRun:
    config: dict
    startup_s: float
    answers: dict[str, Answer] = field(default_factory=dict)
    per_token_ms: float | None = None
    prefill_ms: float | None = None


@dataclass
class TeacherForcedRun:
    config: dict
    text_ids: list[int]  # TEACHER_FORCED_TEXT as the server tokenizes it
    text_logprobs: list[float]  # log p(text_ids[i] | text_ids[:i]) for i >= 1
    text_score_s: float


def score_teacher_forced(server, config: dict) -> TeacherForcedRun:
    """TEACHER_FORCED_TEXT scored by ``server`` (started with ``--chunked-prefill-size TEACHER_FORCED_CHUNK``):
    a prefill with a log-softmax over the vocabulary at every position."""
    started = time.perf_counter()
    ids = server.tokenize(TEACHER_FORCED_TEXT)
    logprobs = server.generate(input_ids=ids, max_new_tokens=1, input_logprobs_from=0)["input_logprobs"]
    return TeacherForcedRun(config, ids, logprobs, time.perf_counter() - started)


def _answer(server, prompt: str, max_new_tokens: int = NEW_TOKENS) -> Answer:
    # The prompt goes in as the server's own token ids, so the float32 oracle can be fed exactly what it saw.
    ids = server.tokenize(prompt)
    out = server.generate(input_ids=ids, max_new_tokens=max_new_tokens, return_logprob=True, top_logprobs_num=2)
    meta = out["meta"]
    return Answer(output_ids=list(out["output_ids"]), logprobs=out["logprobs"],
                  top2=[[tuple(pair) for pair in position] for position in out["top_logprobs"]],
                  cached_tokens=int(meta.get("cached_tokens", 0)), prompt_tokens=int(meta.get("prompt_tokens", 0)),
                  prompt_ids=ids, spec_verify_ct=int(meta.get("spec_verify_ct") or 0))


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


