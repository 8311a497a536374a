"""Greedy parity decided on the model's own margins, measured by a float32 oracle (``oracle.py``).

Two bf16 servers can pick different greedy tokens without either being wrong: where the model itself barely
prefers one token over another, bf16 rounding decides. A fixed tie threshold cannot tell that apart from a real
difference (one bf16 step of a logit is 0.25 nats for logits in [32, 64), and rounding differences grow through
the layers), so a candidate run is judged against a reference run (SGLang's own backend, or our tp 1 run) on
numbers the float32 oracle measures, teacher-forced on the exact token ids each run saw:

1. **Error level.** At every generated position of a run, its *margin error* is how far its top-2 margin
   ``log p(t1) - log p(t2)`` is from the oracle's margin for the same two tokens after the same context. A
   correct bf16 backend errs about as much as the reference does (seen on Gemma-3-270M: mean |error| 0.057 nats
   for inkling, 0.058 for torch_native, 0.66 for a backend with a 25% softmax-scale error; 160 positions each,
   ``integration/results/README.md``). The candidate fails if its mean |margin error| exceeds the reference's by
   more than ``SIGNIFICANT_Z`` standard errors.
2. **Each divergence.** At the first position where the two greedy sequences differ (tokens ``a`` and ``b``),
   the oracle's margin ``|log p(a) - log p(b)|`` says how decisive the model is there. Two runs can order ``a``
   and ``b`` differently only where one of them errs by at least that margin, so a divergence is excused (a
   near-tie, counted in the report) only where the margin is within ``noise_bound = 2 * reference_noise``,
   ``reference_noise`` being the largest margin error the reference makes over the model's workload (the factor 2:
   the largest of a few hundred errors is itself a noisy number). Every other divergence is a mismatch.

Both bounds come from the reference alone, so a broken candidate cannot widen them; ``test_bf16_agreement.py``
shows a backend with a wrong softmax scale failing the check.
"""
from __future__ import annotations

import math
import statistics

from oracle import oracle_logprobs
from workloads import Answer, WorkloadRun, common_prefix

SIGNIFICANT_Z = 4.0  # one-sided; P(z > 4) < 1e-4 when the two error levels differ only by noise


def first_divergence(a: Answer, b: Answer) -> int | None:
    """First generated position where the two greedy sequences differ (None when identical)."""
    n = common_prefix(a, b)
    return None if n == len(a.output_ids) == len(b.output_ids) else n


class _Queries:
    """Oracle queries keyed by token sequence: runs that generated the same tokens share one forward pass."""

    def __init__(self):
        self.by_ids: dict[tuple[int, ...], dict] = {}

    def add(self, answer: Answer, extra: dict[int, set[int]] | None = None) -> tuple[int, ...]:
        if not answer.prompt_ids:
            raise ValueError("an answer has no prompt_ids: the workload must send token ids")
        ids = tuple(answer.prompt_ids + answer.output_ids)
        start = len(answer.prompt_ids)
        query = self.by_ids.setdefault(ids, {"ids": list(ids), "start": start,
                                             "tokens": [set() for _ in answer.output_ids]})
        for j, position in enumerate(answer.top2):
            query["tokens"][j] |= {t for t, _ in position}
        for j, tokens in (extra or {}).items():
            query["tokens"][j] |= tokens
        return ids

    def run(self, model_dir) -> dict[tuple[int, ...], list[dict[int, float]]]:
        keys = list(self.by_ids)
        queries = [{"ids": q["ids"], "positions": [q["start"] + j for j in range(len(q["tokens"]))],
                    "tokens": [sorted(t) for t in q["tokens"]]} for q in self.by_ids.values()]
        return dict(zip(keys, oracle_logprobs(model_dir, queries)))


def margin_errors(run: WorkloadRun, oracle_of: dict[str, list[dict[int, float]]]) -> list[float]:
    """The run's top-2 margin error against the oracle at every generated position (``oracle_of[prompt]``)."""
    errors = []
    for name, answer in run.answers.items():
        for position, top in enumerate(answer.top2):
            if len(top) < 2:
                continue
            (t1, l1), (t2, l2) = top[0], top[1]
            exact = oracle_of[name][position]
            errors.append((l1 - l2) - (exact[t1] - exact[t2]))
    return errors


def error_level(candidate: list[float], reference: list[float]) -> dict:
    """Mean |margin error| of each run and ``z``, the candidate's excess over the reference in standard errors."""
    def mean_and_se(errors):
        magnitudes = [abs(e) for e in errors]
        return statistics.fmean(magnitudes), statistics.stdev(magnitudes) / math.sqrt(len(magnitudes))
    (mc, sc), (mr, sr) = mean_and_se(candidate), mean_and_se(reference)
    z = (mc - mr) / math.hypot(sc, sr) if sc or sr else 0.0
    return {"candidate_mean_abs_error": round(mc, 4), "reference_mean_abs_error": round(mr, 4),
            "positions": [len(candidate), len(reference)], "z": round(z, 2), "significant_z": SIGNIFICANT_Z,
            "exceeds_reference": z > SIGNIFICANT_Z}


def judge(reference: WorkloadRun, candidate: WorkloadRun, oracle_of: dict[str, list[dict[int, float]]],
          noise_bound: float) -> dict:
    """Per prompt: identical, a divergence within the noise bound (excused), or a mismatch. ``oracle_of`` is the
    oracle over the reference's sequences (the candidate's context up to its first divergence)."""
    identical, excused, mismatches = [], [], []
    for name, ref in reference.answers.items():
        other = candidate.answers[name]
        i = first_divergence(ref, other)
        if i is None:
            identical.append(name)
            continue
        if i >= min(len(ref.output_ids), len(other.output_ids)):
            mismatches.append({"prompt": name, "position": i, "reason": "different lengths"})
            continue
        a, b = ref.output_ids[i], other.output_ids[i]
        margin = abs(oracle_of[name][i][a] - oracle_of[name][i][b])
        entry = {"prompt": name, "position": i, "tokens": [a, b], "oracle_margin": round(margin, 4)}
        (excused if margin <= noise_bound else mismatches).append(entry)
    return {"prompts": len(reference.answers), "identical": len(identical), "excused_near_ties": excused,
            "mismatches": mismatches}


def compare_on_margins(model_dir, reference: WorkloadRun, candidates: dict[str, WorkloadRun]) -> dict:
    """Judge each candidate against the reference with one float32 oracle pass. Returns ``{"reference_noise",
    "noise_bound", "candidates": {name: judge(...) | {"error_level": error_level(...), "passed": bool}}}``."""
    queries = _Queries()
    ref_keys = {}
    for name, ref in reference.answers.items():
        extra: dict[int, set[int]] = {}
        for run in candidates.values():
            i = first_divergence(ref, run.answers[name])
            if i is not None and i < min(len(ref.output_ids), len(run.answers[name].output_ids)):
                extra.setdefault(i, set()).update({ref.output_ids[i], run.answers[name].output_ids[i]})
        ref_keys[name] = queries.add(ref, extra)
    cand_keys = {key: {name: queries.add(answer) for name, answer in run.answers.items()}
                 for key, run in candidates.items()}
    oracle = queries.run(model_dir)
    ref_oracle = {name: oracle[k] for name, k in ref_keys.items()}
    ref_errors = margin_errors(reference, ref_oracle)
    noise = max(abs(e) for e in ref_errors)
    bound = 2 * noise
    judged = {}
    for key, run in candidates.items():
        verdict = judge(reference, run, ref_oracle, bound)
        level = error_level(margin_errors(run, {n: oracle[k] for n, k in cand_keys[key].items()}), ref_errors)
        judged[key] = verdict | {"error_level": level,
                                 "passed": not verdict["mismatches"] and not level["exceeds_reference"]}
    return {"reference_noise": round(noise, 4), "noise_bound": round(bound, 4), "candidates": judged}


def verdict_summary(result: dict, candidate: str) -> str:
    """What decided ``candidate``'s verdict in a ``compare_on_margins`` result (an assertion's message): its
    divergences beyond the noise bound, its error level and the near-ties it was excused."""
    judged = result["candidates"][candidate]
    return (f"divergences beyond the noise bound {result['noise_bound']} nats {judged['mismatches']}, error level "
            f"{judged['error_level']} (excused near-ties: {judged['excused_near_ties']})")
