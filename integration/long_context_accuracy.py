"""Long-context KV-format accuracy on real weights through the real SGLang server (CPU): teacher-forced drift from
bf16 of MXFP8 (ours) and per-tensor fp8 (scale 1.0, as users run it), on the model as released and under
function-preserving rescalings of its V or K (``rescale_checkpoint.py``: the same function, bit for bit, with a
K/V cache of another range).

    .venv/bin/python integration/long_context_accuracy.py --model gemma-3-270m --tokens 32760 \\
        --rescalings none,v+3,v-6 --out bench/results/current/accuracy
    .venv/bin/python integration/long_context_accuracy.py --model smollm2-135m-instruct --tokens 8184 \\
        --rescalings none,k+8,v+7 --out bench/results/current/accuracy
    .venv/bin/python integration/long_context_accuracy.py --summarize bench/results/current/accuracy
    .venv/bin/python integration/long_context_accuracy.py --model gemma-3-270m --tokens 16384 --needle 0.25 \
        --rescalings none --out bench/results/current/accuracy      # the retrieval check, needle.json

Each server (``--attention-backend inkling``, KV bf16 / mxfp8 / fp8_e4m3) scores the first ``--tokens`` tokens of
``data/long_text.txt`` (public domain) with prompt log-probabilities in chunked prefill of ``--chunk`` tokens: a
query at offset j of its chunk reads the chunk's j earlier keys from the forward (unrounded, as SGLang's backends do
in an extend) and every older key from the quantized cache, so most of what each position attends to is the stored
format (at chunk 256 under a 512-token window, at least half of a windowed layer's keys; nearly all of a full
layer's past 2k). A run's token ids and log-probabilities are saved as it finishes (``runs/*.json.gz``); a run
already saved is not redone.

Drift per position: ``|log p_format - log p_bf16|`` against the bf16 run of the same (rescaled) checkpoint. Positions
are binned by context (up to 8k, 8k-16k, 16k-32k). The paired difference ``drift_mxfp8 - drift_fp8`` per bin is
averaged in blocks of ``BLOCK`` consecutive positions (neighbours share context) and judged by
``z = mean / standard error`` over blocks: |z| > ``SIGNIFICANT_Z`` is "beyond noise"; a bin of fewer than
``MIN_BLOCKS`` blocks gets no verdict.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # the checkout (demo/): a script run lacks it

from demo.models import prepare_model  # noqa: E402
from demo.server import SGLangServer, ServerStartError  # noqa: E402

TEXT = HERE / "data" / "long_text.txt"
KV_FORMATS = ("auto", "mxfp8", "fp8_e4m3")  # auto: the model's bf16, the reference
BINS = ((0, 8192), (8192, 16384), (16384, 32768))
BLOCK = 256
SIGNIFICANT_Z = 4.0  # P(|z| > 4) < 1e-4 for a difference that is only noise
MIN_BLOCKS = 16  # fewer blocks give a standard error too rough to judge by: no verdict
RESCALED_ROOT = Path.home() / ".cache" / "sglang-inkling-backend" / "rescaled"


def parse_rescaling(spec: str) -> dict:
    """``none``, ``v+3`` / ``v-6`` (V times 2**3 / 2**-6), ``k+8`` (two rotary pairs of K per head times 2**8)."""
    if spec == "none":
        return {}
    kind, exp = spec[0], spec[1:]
    if kind not in "vk" or not exp or exp[0] not in "+-" or not exp[1:].isdigit():
        raise ValueError(f"rescaling must be none, v+N, v-N or k+N, got {spec!r}")
    return {"v_log2": int(exp)} if kind == "v" else {"k_outlier_log2": int(exp)}


def model_dir(model: str, rescaling: str) -> Path:
    src = prepare_model(model, progress=lambda msg: print(f"[models] {msg}", flush=True))
    if rescaling == "none":
        return src
    dst = RESCALED_ROOT / f"{model}-{rescaling}"
    if not (dst / "rescale.json").exists():
        # imported here: the rescaler needs safetensors, which the analysis (summarize, the tests) does not
        from rescale_checkpoint import rescale

        print(f"[rescale] {model} {rescaling} -> {dst}", flush=True)
        rescale(src, dst, **parse_rescaling(rescaling))
    return dst


def served(path: Path, kv: str, max_total_tokens: int, chunk: int, log: Path, work):
    """``work(server)`` on an inkling server for ``path`` with KV ``kv`` in chunked prefill of ``chunk``, always
    stopped after; started again once if the free port it chose was taken before it bound it."""
    for attempt in (1, 2):
        server = SGLangServer(path, "inkling", kv, max_total_tokens=max_total_tokens, log_path=log,
                              extra_args=("--chunked-prefill-size", str(chunk)))
        try:
            with server:  # starts it, and always stops it
                return work(server)
        except ServerStartError as err:
            if attempt == 2 or "address already in use" not in err.log:
                raise
            print(f"[run] port taken during start-up ({log}); starting again on another", flush=True)


def score(path: Path, kv: str, tokens: int, chunk: int, log: Path) -> dict:
    def work(server) -> dict:
        ids = server.tokenize(TEXT.read_text())
        if len(ids) < tokens:
            raise ValueError(f"{TEXT} has {len(ids)} tokens, fewer than --tokens {tokens}")
        ids = ids[:tokens]
        started = time.perf_counter()
        out = server.generate(input_ids=ids, max_new_tokens=1, input_logprobs_from=0, timeout_s=4 * 3600)
        return {"kv": kv, "tokens": tokens, "chunk": chunk, "ids": ids, "input_logprobs": out["input_logprobs"],
                "score_s": time.perf_counter() - started, "startup_s": server.startup_seconds}
    return served(path, kv, tokens + 1024, chunk, log, work)


NEEDLE = " The secret word is marmalade. "
NEEDLE_QUESTION = "\n\nWhat is the secret word? The secret word is"
NEEDLE_ANSWER = " marmalade"


def needle(model: str, tokens: int, depth: float, chunk: int, out: Path, rescaling: str = "none") -> None:
    """A retrieval check at ``tokens`` of context: NEEDLE inserted at ``depth`` (a fraction) of the text, the question
    at the end; per format, the teacher-forced log-probability of the answer with the needle and without it (the
    same prompt, needle left out), and the greedy continuation with the needle. Saved to ``needle.json`` (the model
    as released) or ``needle-RESCALING.json``."""

    def work(server) -> dict:
        bos = server.tokenize("")
        strip = (lambda ids: ids[len(bos):]) if bos else (lambda ids: ids)
        text = server.tokenize(TEXT.read_text())
        needle_ids, question, answer = (strip(server.tokenize(t)) for t in (NEEDLE, NEEDLE_QUESTION, NEEDLE_ANSWER))
        body = tokens - len(needle_ids) - len(question) - len(answer)
        at = int(depth * body)
        plain = text[:body] + question
        with_needle = text[:at] + needle_ids + text[at:body] + question
        result = {}
        for name, prompt in (("with_needle", with_needle), ("without_needle", plain)):
            scored = server.generate(input_ids=prompt + answer, max_new_tokens=1,
                                     input_logprobs_from=len(prompt) - 1, timeout_s=4 * 3600)
            result[f"answer_logprob_{name}"] = sum(scored["input_logprobs"][-len(answer):])
        greedy = server.generate(input_ids=with_needle, max_new_tokens=4, timeout_s=4 * 3600)
        result.update(greedy_text=greedy["text"], greedy_ids=greedy["output_ids"], answer_ids=answer,
                      retrieved=greedy["output_ids"][:len(answer)] == answer, prompt_tokens=len(with_needle),
                      needle_at_token=at)
        return result

    path = model_dir(model, rescaling)
    results = {}
    for kv in KV_FORMATS:
        results[kv] = served(path, kv, 2 * tokens + 2048, chunk,
                             out / "logs" / f"needle_{model}_{rescaling}_{kv}.log", work)
        print(f"[needle] {model} {rescaling} {kv}: {results[kv]}", flush=True)
    name = "needle.json" if rescaling == "none" else f"needle-{rescaling}.json"
    (out / name).write_text(json.dumps({"model": model, "rescaling": rescaling, "tokens": tokens, "depth": depth,
                                        "chunk": chunk, "needle": NEEDLE, "question": NEEDLE_QUESTION,
                                        "answer": NEEDLE_ANSWER, "formats": results}, indent=1) + "\n")


def run_all(model: str, tokens: int, chunk: int, rescalings: list[str], out: Path) -> None:
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    for rescaling in rescalings:
        path = model_dir(model, rescaling)
        for kv in KV_FORMATS:
            name = f"{model}_{rescaling}_{kv}"
            target = out / "runs" / f"{name}.json.gz"
            if target.exists():
                print(f"[run] {name}: saved, skipped", flush=True)
                continue
            print(f"[run] {name}: scoring {tokens} tokens in chunks of {chunk}", flush=True)
            result = score(path, kv, tokens, chunk, out / "logs" / f"{name}.log")
            result.update(model=model, rescaling=rescaling)
            target.write_bytes(gzip.compress(json.dumps(result).encode()))
            print(f"[run] {name}: {result['score_s']:.0f} s", flush=True)


def paired(a: list[float], b: list[float]) -> dict:
    """Mean of a - b, its standard error over blocks of BLOCK positions, z and the verdict for a (MXFP8)."""
    diff = [x - y for x, y in zip(a, b)]
    blocks = [statistics.fmean(diff[i:i + BLOCK]) for i in range(0, len(diff) - BLOCK + 1, BLOCK)]
    mean = statistics.fmean(diff)
    stderr = statistics.stdev(blocks) / math.sqrt(len(blocks)) if len(blocks) > 1 else math.inf
    z = mean / stderr if stderr > 0 else (0.0 if mean == 0 else math.copysign(math.inf, mean))
    verdict = ("too few blocks" if len(blocks) < MIN_BLOCKS else "not worse" if abs(z) <= SIGNIFICANT_Z
               else "better" if z < 0 else "worse")
    return {"mean": mean, "stderr": stderr, "z": z, "blocks": len(blocks), "verdict": verdict}


def summarize(out: Path) -> dict:
    runs = {}
    for f in sorted((out / "runs").glob("*.json.gz")):
        r = json.loads(gzip.decompress(f.read_bytes()))
        runs[(r["model"], r["rescaling"], r["kv"])] = r
    rows, comparisons = [], []
    for (model, rescaling, kv), ref in sorted(runs.items()):
        if kv != "auto":
            continue
        others = {k: runs.get((model, rescaling, k)) for k in KV_FORMATS[1:]}
        for k, run in others.items():
            if run is not None and run["ids"] != ref["ids"]:
                raise ValueError(f"{model} {rescaling} {k}: not scored on the bf16 run's tokens")
        drift = {k: [abs(x - y) for x, y in zip(run["input_logprobs"], ref["input_logprobs"])]
                 for k, run in others.items() if run is not None}
        # input_logprobs[i] is the log-probability of token i + 1 given tokens 0..i: its context is i + 1 tokens
        for lo, hi in BINS:
            sl = slice(max(lo - 1, 0), hi - 1)
            n = len(ref["input_logprobs"][sl])
            if n == 0:
                continue
            for k, d in drift.items():
                rows.append({"model": model, "context": hi, "context_from": lo, "kv": k, "rescaling": rescaling,
                             "metric": "mean_abs_dlogprob_vs_bf16", "value": statistics.fmean(d[sl]),
                             "positions": n})
            if len(drift) == 2:
                c = paired(drift["mxfp8"][sl], drift["fp8_e4m3"][sl])
                comparisons.append({"model": model, "context": hi, "context_from": lo, "rescaling": rescaling,
                                    "metric": "mxfp8_minus_fp8_e4m3_abs_dlogprob", "positions": n, **c})
    # the rescaled checkpoints compute the model's function: their bf16 runs against the original's
    same_function = {}
    for (model, rescaling, kv), run in sorted(runs.items()):
        base = runs.get((model, "none", "auto"))
        if kv == "auto" and rescaling != "none" and base is not None and base["ids"] == run["ids"]:
            d = [abs(x - y) for x, y in zip(run["input_logprobs"], base["input_logprobs"])]
            same_function[f"{model} {rescaling}"] = {"mean_abs_dlogprob": statistics.fmean(d), "max": max(d),
                                                     "positions": len(d)}
    verdicts = {c["verdict"] for c in comparisons} - {"too few blocks"}
    inkling_verdict = ("worse" if "worse" in verdicts else "better" if "better" in verdicts else "not worse") \
        if verdicts else None
    summary = {"rows": rows, "comparisons": comparisons, "inkling_verdict": inkling_verdict,
               "inkling_verdict_rule": f"worse if MXFP8 drifts more than per-tensor fp8 with z > {SIGNIFICANT_Z} in "
                                       "any (model, context, rescaling); better if it drifts less beyond noise in "
                                       "at least one and more in none; else not worse",
               "bf16_rescaled_vs_bf16_original": same_function, "block": BLOCK, "significant_z": SIGNIFICANT_Z,
               "runs": {f"{m}_{r}_{k}": {"tokens": v["tokens"], "chunk": v["chunk"], "score_s": round(v["score_s"], 1)}
                        for (m, r, k), v in sorted(runs.items())}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def table(summary: dict) -> str:
    by = {}
    for r in summary["rows"]:
        by[(r["model"], r["rescaling"], r["context_from"], r["context"], r["positions"])] = \
            {**by.get((r["model"], r["rescaling"], r["context_from"], r["context"], r["positions"]), {}),
             r["kv"]: r["value"]}
    comp = {(c["model"], c["rescaling"], c["context"]): c for c in summary["comparisons"]}
    lines = ["| model | rescaling | context | positions | MXFP8 | per-tensor fp8 | MXFP8 - fp8 (s.e.) | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for (model, rescaling, lo, hi, n), v in sorted(by.items()):
        c = comp.get((model, rescaling, hi))
        diff = f"{c['mean']:+.4f} ({c['stderr']:.4f})" if c else "-"
        lines.append(f"| {model} | {rescaling} | {lo // 1024}k-{hi // 1024}k | {n} | {v.get('mxfp8', math.nan):.4f} | "
                     f"{v.get('fp8_e4m3', math.nan):.4f} | {diff} | {c['verdict'] if c else '-'} |")
    lines.append(f"\ninkling_verdict: {summary['inkling_verdict']}")
    for name, d in summary["bf16_rescaled_vs_bf16_original"].items():
        lines.append(f"bf16 {name} against bf16 as released: mean |delta| {d['mean_abs_dlogprob']:.2e}, "
                     f"max {d['max']:.2e} over {d['positions']} positions")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--tokens", type=int, default=32760,
                    help="prompt tokens (SGLang admits at most context length - 6 with one new token)")
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--rescalings", help="comma-separated (default none,v+3,v-6); one with --needle (default none)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/current/accuracy"))
    ap.add_argument("--summarize", type=Path, help="only summarize the runs saved in this folder")
    ap.add_argument("--needle", type=float, metavar="DEPTH",
                    help="run only the retrieval check, the needle at this fraction of the text (e.g. 0.25)")
    args = ap.parse_args(argv)
    if args.needle is not None:
        (args.out / "logs").mkdir(parents=True, exist_ok=True)
        rescalings = (args.rescalings or "none").split(",")
        if len(rescalings) != 1:
            ap.error("--needle takes one --rescalings value")
        parse_rescaling(rescalings[0])
        needle(args.model, args.tokens, args.needle, args.chunk, args.out, rescalings[0])
        return
    out = args.summarize or args.out
    if not args.summarize:
        rescalings = (args.rescalings or "none,v+3,v-6").split(",")
        for r in rescalings:
            parse_rescaling(r)
        run_all(args.model, args.tokens, args.chunk, rescalings, out)
    print(table(summarize(out)))


if __name__ == "__main__":
    main()
