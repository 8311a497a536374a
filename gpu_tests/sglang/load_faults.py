"""The real SGLang server under load and faults (issue #58): start it, overload its KV pool until it retracts, inject
faults, check that nothing is lost and the pool comes back, compare greedy tokens with the same requests run alone,
send bad requests, write JSON. Test-only; ``--cpu`` runs a small version on this CPU machine.

Phases, in order, against one server (``--mode``: ``plain``; ``ngram``, SGLang's NGRAM speculative decoding;
``hicache``, the hierarchical cache with a host tier four times the device pool, prompts built on shared documents so
their pages are evicted to host memory and loaded back):

1. idle: after a warm-up request and ``/flush_cache``, the pool's used tokens (``/v1/loads``) are the baseline.
2. burst: ``--burst`` greedy requests (random prompts of ``--prompt-lens`` tokens, ``--new-tokens`` each, EOS
   ignored) sent at once, a second wave of half as many once the first retraction is logged or ``--wave-delay``
   seconds have passed; among them streaming clients that read a few chunks and disconnect, streams aborted through
   ``/abort_request`` after their first token (running), and requests aborted as soon as they are sent while the
   server reports waiting requests (queued). ``SGLANG_INIT_NEW_TOKEN_RATIO`` (set by ``--token-ratio``, SGLang's
   default 0.7 decays to 0.1 over 600 decode steps) makes a burst of a minute reach the retraction a sustained load
   reaches once the ratio has decayed.
3. prefill aborts: a long prompt (``--prefill-abort-tokens``, prefilled in chunks of 512) aborted after a fraction of
   its measured prefill time, three times; an abort with no output token landed during prefill.
4. settle: no request running or waiting, ``/flush_cache``, used tokens back at the idle baseline.
5. alone: the burst's completed requests that SGLang retracted (``meta_info.num_retractions``), and others up to
   ``--rerun``, each sent again alone; tokens compared as ``compare.py`` compares runs (a divergence is excused only
   at a near-tie of the alone run).
6. bad requests: ``BAD_REQUESTS``, each must get a 4xx and leave the server healthy.

Every completed burst request must have finished by length with exactly its ``max_new_tokens`` tokens; an abort the
client did not ask for, an HTTP error, or a missing answer is counted and fails the run.

    python gpu_tests/sglang/load_faults.py --model DIR --backend inkling --kv-cache-dtype mxfp8 --out run.json \\
        [--mode plain|ngram|hicache] [--log server.log] [-- extra server args]
    python gpu_tests/sglang/load_faults.py --summarize RUN.json [RUN.json ...] [--json summary.json]
"""
from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import compare  # noqa: E402
from serve_check import (VOCAB_HIGH, VOCAB_LOW, Server, base_server_args, server_env,  # noqa: E402
                         split_server_argv)

SEED = 58
HTTP_TIMEOUT_S = 600.0
RETRACT_RE = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+)")


# --- HTTP ---------------------------------------------------------------------------------------------------------

def request(url: str, path: str, body=None, timeout: float = 30.0, raw: bytes | None = None) -> tuple[int, object]:
    """(status, parsed JSON or text) of a GET (body None) or POST; HTTP errors are returned, not raised."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            status, text = response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read().decode(errors="replace")
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def loads(url: str) -> dict:
    status, out = request(url, "/v1/loads?include=core", timeout=120)  # answered between scheduler steps
    if status != 200:
        raise RuntimeError(f"/v1/loads answered {status}: {str(out)[:300]}")
    return out["loads"][0]


def healthy(url: str) -> bool:
    try:
        return request(url, "/health", timeout=60)[0] == 200
    except (urllib.error.URLError, OSError):
        return False


def flush(url: str) -> None:
    status, out = request(url, "/flush_cache", body={}, timeout=60)
    if status != 200:
        raise RuntimeError(f"/flush_cache answered {status}: {str(out)[:300]}")


def settle(url: str, idle_used: int | None, timeout_s: float) -> dict:
    """Poll until nothing runs or waits (and, given ``idle_used``, the pool's used tokens are back at it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        load = loads(url)
        if load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0 and (
                idle_used is None or load["num_used_tokens"] == idle_used):
            return load
        if time.monotonic() > deadline:
            raise RuntimeError(f"not settled after {timeout_s:.0f} s: {load} (idle used tokens {idle_used})")
        time.sleep(0.25)


def body_of(ids, new_tokens, rid=None, stream=False, logprobs=True) -> dict:
    body = {"input_ids": ids, "stream": stream,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True}}
    if logprobs:
        body.update(return_logprob=True, top_logprobs_num=2)
    if rid:
        body["rid"] = rid
    return body


def generate(url: str, ids, new_tokens, rid=None) -> dict:
    """One greedy request, not streamed: its tokens, top-2, finish and retractions, or its HTTP error."""
    started = time.monotonic()
    status, out = request(url, "/generate", body_of(ids, new_tokens, rid), timeout=HTTP_TIMEOUT_S)
    record = {"rid": rid, "http": status, "prompt_len": len(ids), "max_new_tokens": new_tokens,
              "seconds": round(time.monotonic() - started, 3)}
    if status != 200 or not isinstance(out, dict):
        return record | {"error": str(out)[:500]}
    meta = out["meta_info"]
    return record | {"output_ids": [e[1] for e in meta["output_token_logprobs"]],
                     "logprobs": [e[0] for e in meta["output_token_logprobs"]],
                     "top2": [[[t[1], t[0]] for t in pos] for pos in meta["output_top_logprobs"]],
                     "finish": (meta.get("finish_reason") or {}).get("type"),
                     "completion_tokens": meta.get("completion_tokens"),
                     "num_retractions": meta.get("num_retractions"), "cached_tokens": meta.get("cached_tokens"),
                     "cached_tokens_details": meta.get("cached_tokens_details")}


def stream(url: str, port: int, ids, new_tokens, rid: str, *, close_after: int = 0,
           on_chunk=None) -> dict:
    """A streaming request: ``close_after`` > 0 closes the connection after that many chunks; ``on_chunk(n)`` is
    called after each chunk (an abort is sent from it). Returns chunks seen and the last chunk's finish."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT_S)
    record = {"rid": rid, "prompt_len": len(ids), "max_new_tokens": new_tokens, "chunks": 0, "finish": None}
    try:
        conn.request("POST", "/generate", body=json.dumps(body_of(ids, new_tokens, rid, stream=True, logprobs=False)),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        record["http"] = response.status
        if response.status != 200:
            record["error"] = response.read()[:500].decode(errors="replace")
            return record
        while True:
            line = response.readline()
            if not line:
                break
            if not line.startswith(b"data:") or b"[DONE]" in line:
                continue
            chunk = json.loads(line[5:])
            meta = chunk.get("meta_info") or {}
            record["completion_tokens"] = meta.get("completion_tokens")
            if meta.get("finish_reason"):
                record["finish"] = meta["finish_reason"].get("type")
                break
            record["chunks"] += 1
            if on_chunk is not None:
                on_chunk(record["chunks"])
            if close_after and record["chunks"] >= close_after:
                record["closed_by_client"] = True
                break
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as err:
        record["error"] = repr(err)
    finally:
        conn.close()
    return record


def abort(url: str, rid: str) -> int:
    return request(url, "/abort_request", body={"rid": rid}, timeout=30)[0]


# --- the workload ---------------------------------------------------------------------------------------------------

class Workload:
    def __init__(self, args, rng: random.Random):
        self.args, self.rng = args, rng
        lo, hi = (int(x) for x in args.prompt_lens.split(","))
        self.lens = (lo, hi)
        nlo, nhi = (int(x) for x in args.new_tokens.split(","))
        self.new = (nlo, nhi)
        self.docs = ([[rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(args.doc_tokens)]
                      for _ in range(args.docs)] if args.mode == "hicache" else [])

    def prompt(self) -> list[int]:
        n = self.rng.randint(*self.lens)
        tail = [self.rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)]
        return (self.rng.choice(self.docs) + tail) if self.docs else tail

    def new_tokens(self) -> int:
        return self.rng.randint(*self.new)


def burst(url: str, port: int, work: Workload, log_path: Path) -> dict:
    args = work.args
    plan = []  # (kind, rid, ids, new_tokens, extra)
    for i in range(args.burst):
        plan.append(("complete", f"burst-{i}", work.prompt(), work.new_tokens(), 0))
    for i in range(args.disconnects):
        plan.append(("disconnect", f"disconnect-{i}", work.prompt(), work.new_tokens(), work.rng.randint(1, 8)))
    for i in range(args.aborts):
        plan.append(("abort_running", f"abort-running-{i}", work.prompt(), work.new_tokens(), 0))
    work.rng.shuffle(plan)
    second = [("complete", f"wave2-{i}", work.prompt(), work.new_tokens(), 0) for i in range(args.burst // 2)]
    queued = [("abort_queued", f"abort-queued-{i}", work.prompt(), work.new_tokens(), 0) for i in range(args.aborts)]
    results, aborts_sent, waiting_seen = {}, {}, []

    def one(kind, rid, ids, new_tokens, extra):
        if kind == "complete":
            results[rid] = generate(url, ids, new_tokens, rid) | {"kind": kind, "_ids": ids}
        elif kind == "disconnect":
            results[rid] = stream(url, port, ids, new_tokens, rid, close_after=extra) | {"kind": kind}
        elif kind == "abort_running":
            def on_chunk(n):
                if n == 1:
                    aborts_sent[rid] = abort(url, rid)
            results[rid] = stream(url, port, ids, new_tokens, rid, on_chunk=on_chunk) | {"kind": kind}
        else:  # abort_queued: sent while requests wait, aborted at once
            done = {}
            worker = threading.Thread(target=lambda: done.update(r=stream(url, port, ids, new_tokens, rid)))
            load = loads(url)
            waiting_seen.append(load["num_waiting_reqs"])
            worker.start()
            time.sleep(0.05)
            aborts_sent[rid] = abort(url, rid)
            worker.join(HTTP_TIMEOUT_S)
            results[rid] = done.get("r", {"rid": rid, "error": "no answer"}) | {
                "kind": kind, "waiting_when_sent": load["num_waiting_reqs"]}

    def retractions_logged() -> int:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        return sum(int(n) for n in RETRACT_RE.findall(text))

    started = time.monotonic()
    before = retractions_logged()
    peak = {"num_used_tokens": 0, "num_waiting_reqs": 0, "num_running_reqs": 0}
    pool = ThreadPoolExecutor(max_workers=len(plan) + len(second) + len(queued))
    try:
        futures = [pool.submit(one, *p) for p in plan]
        wave2_at = None
        deadline = started + args.burst_timeout
        while time.monotonic() < deadline and not all(f.done() for f in futures):
            load = loads(url)
            for key in peak:
                peak[key] = max(peak[key], load[key])
            if wave2_at is None and (retractions_logged() > before or time.monotonic() - started > args.wave_delay):
                wave2_at = round(time.monotonic() - started, 2)
                futures += [pool.submit(one, *p) for p in second]
            if wave2_at is not None and queued and load["num_waiting_reqs"] > 0:
                futures.append(pool.submit(one, *queued.pop()))
            time.sleep(0.2)
        unfinished = sum(not f.done() for f in futures)
        if unfinished:
            raise RuntimeError(f"{unfinished} burst requests unanswered after --burst-timeout {args.burst_timeout} s "
                               f"(last load: {load})")
        for f in futures:
            f.result()  # raises a worker's exception
    finally:  # a timed-out burst leaves requests blocked on their sockets: do not wait for them here
        pool.shutdown(wait=False, cancel_futures=True)
    if queued:
        raise RuntimeError(f"{len(queued)} queued aborts never saw a waiting request: no queue formed")
    return {"seconds": round(time.monotonic() - started, 2), "wave2_at_s": wave2_at, "peak": peak,
            "retracted_logged": retractions_logged() - before, "aborts_sent": aborts_sent,
            "requests": list(results.values())}


def prefill_aborts(url: str, port: int, work: Workload) -> list[dict]:
    """A long prompt aborted at a fraction of its measured prefill time: an abort with no output token landed in
    prefill (chunked: ``--chunked-prefill-size`` 512)."""
    n = work.args.prefill_abort_tokens
    timed = [work.rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)]
    ttft = generate(url, timed, 1)["seconds"]
    out = []
    for i, fraction in enumerate((0.2, 0.4, 0.6)):
        ids = [work.rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)]
        rid, done = f"abort-prefill-{i}", {}
        worker = threading.Thread(target=lambda: done.update(r=stream(url, port, ids, 64, rid)))
        worker.start()
        time.sleep(ttft * fraction)
        status = abort(url, rid)
        worker.join(HTTP_TIMEOUT_S)
        r = done.get("r", {"rid": rid, "error": "no answer"})
        out.append(r | {"kind": "abort_prefill", "abort_http": status, "after_s": round(ttft * fraction, 3),
                        "prefill_s": ttft, "in_prefill": r.get("chunks") == 0 and r.get("finish") == "abort"})
    return out


def judge(requests: list[dict], aborts_sent: dict) -> dict:
    """Every request's outcome against what the client did to it."""
    bad = []
    counts = {"complete": 0, "retracted": 0, "disconnect": 0, "abort_running": 0, "abort_queued": 0,
              "abort_prefill": 0, "aborted_without_output": 0}
    for r in requests:
        kind = r["kind"]
        counts[kind] += 1
        if kind == "complete":
            ok = (r.get("http") == 200 and r.get("finish") == "length"
                  and len(r.get("output_ids") or []) == r["max_new_tokens"] == r.get("completion_tokens"))
            counts["retracted"] += bool(r.get("num_retractions"))
        elif kind == "disconnect":
            ok = r.get("http") == 200 and (r.get("closed_by_client") or r.get("finish") == "length")
        else:  # an abort the client asked for: the answer says so (or the stream had ended by length first)
            ok = r.get("http") == 200 and r.get("finish") in ("abort", "length") and aborts_sent.get(r["rid"], 200) == 200
            counts["aborted_without_output"] += r.get("finish") == "abort" and not r.get("chunks")
        if not ok:
            bad.append({k: r.get(k) for k in ("rid", "kind", "http", "finish", "completion_tokens", "max_new_tokens",
                                              "chunks", "error")})
    return {"counts": counts, "bad": bad}


def alone(url: str, completed: list[dict], limit: int) -> dict:
    """The retracted requests and others up to ``limit``, each sent again alone; compare.py's verdict on the pairs
    (the alone run is the reference: a divergence is excused only at its near-tie)."""
    retracted = [r for r in completed if r.get("num_retractions")]
    others = [r for r in completed if not r.get("num_retractions")]
    chosen = retracted[:limit] + others[:max(0, limit - len(retracted))]
    ref = [generate(url, r["_ids"], r["max_new_tokens"]) for r in chosen]
    failed = [a for a in ref if a.get("error")]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed alone: {failed[0]}")
    rows = compare({"concurrent": ref}, {"concurrent": chosen})["rows"][:len(chosen)]  # drop its text/prefix rows
    rows = [row | {"num_retractions": r.get("num_retractions")} for row, r in zip(rows, chosen)]
    diverged = [row for row in rows if row["first_divergence"] is not None]
    verdict = {"requests": len(rows), "requests_identical": len(rows) - len(diverged),
               "requests_diverged": len(diverged),
               "divergences_not_near_tie": sum(not row["divergence_is_near_tie"] for row in diverged),
               "tokens": sum(row["tokens"] for row in rows), "tokens_agreeing": sum(row["agree"] for row in rows),
               "rows": rows}
    return {"retracted_rerun": min(len(retracted), limit), "others_rerun": len(chosen) - min(len(retracted), limit),
            "compare": verdict}


# --- bad requests -----------------------------------------------------------------------------------------------------

def bad_requests(max_input: int) -> list[tuple[str, str, object]]:
    """(name, path, body) of requests SGLang's own checks refuse (its request models, ``SamplingParams.verify``, the
    tokenizer manager's length check); a ``bytes`` body is sent raw. Not here: both ``text`` and ``input_ids`` (SGLang
    answers, reading one of them) and out-of-vocabulary ids (they take SGLang itself down, with any backend)."""
    ok = {"input_ids": [100, 200, 300], "sampling_params": {"temperature": 0.0, "max_new_tokens": 4}}

    def sp(**kw):
        return ok | {"sampling_params": ok["sampling_params"] | kw}
    return [
        ("body is not JSON", "/generate", b"{not json"),
        ("body is a JSON array", "/generate", b"[1, 2, 3]"),
        ("neither text nor input_ids", "/generate", {"sampling_params": {"max_new_tokens": 4}}),
        ("logit_bias key outside the vocabulary", "/generate", sp(logit_bias={"999999": 1.0})),
        ("input_ids empty", "/generate", ok | {"input_ids": []}),
        ("input_ids holds a string", "/generate", ok | {"input_ids": [100, "x", 300]}),
        ("input_ids is a string", "/generate", ok | {"input_ids": "100 200"}),
        ("prompt longer than the context", "/generate", ok | {"input_ids": [100] * (max_input + 16)}),
        ("max_new_tokens negative", "/generate", sp(max_new_tokens=-1)),
        ("max_new_tokens a string", "/generate", sp(max_new_tokens="four")),
        ("temperature negative", "/generate", sp(temperature=-0.5)),
        ("top_p above 1", "/generate", sp(top_p=1.5)),
        ("top_p zero", "/generate", sp(top_p=0.0)),
        ("top_k zero when sampling", "/generate", sp(top_k=0, temperature=0.7)),  # greedy sets top_k 1 first
        ("min_p above 1", "/generate", sp(min_p=1.5)),
        ("repetition_penalty negative", "/generate", sp(repetition_penalty=-1.0)),
        ("frequency_penalty above 2", "/generate", sp(frequency_penalty=3.0)),
        ("presence_penalty below -2", "/generate", sp(presence_penalty=-3.0)),
        ("min_new_tokens above max_new_tokens", "/generate", sp(min_new_tokens=8)),
        ("regex that does not compile", "/generate", sp(regex="(unclosed")),
        ("json_schema that is not JSON", "/generate", sp(json_schema="{not a schema")),
        ("two constraints at once", "/generate", sp(regex="a+", json_schema='{"type": "string"}')),
        ("sampling_params is a string", "/generate", ok | {"sampling_params": "greedy"}),
        ("logprob_start_len past the prompt", "/generate", ok | {"return_logprob": True, "logprob_start_len": 10}),
        ("chat messages not a list", "/v1/chat/completions", {"model": "default", "messages": "hello"}),
        ("completions max_tokens negative", "/v1/completions", {"model": "default", "prompt": "hi", "max_tokens": -5}),
    ]


def send_bad_requests(url: str, max_input: int) -> list[dict]:
    out = []
    for name, path, body in bad_requests(max_input):
        raw = body if isinstance(body, bytes) else None
        status, answer = request(url, path, None if raw else body, timeout=60, raw=raw)
        out.append({"name": name, "path": path, "http": status, "answer": str(answer)[:240],
                    "healthy_after": healthy(url), "clean": 400 <= status < 500})
    return out


# --- main -------------------------------------------------------------------------------------------------------------

def run(server: Server, args, log_path: Path) -> dict:
    url, rng = server.url, random.Random(SEED)
    work = Workload(args, rng)
    record = {}
    generate(url, [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(64)], 4)  # warm-up
    flush(url)
    idle = settle(url, None, 60)
    record["idle"] = idle
    record["server_info"] = {k: v for k, v in request(url, "/server_info")[1].items()
                             if k in ("max_total_num_tokens", "max_req_input_len", "kv_cache_dtype",
                                      "attention_backend", "speculative_algorithm", "chunked_prefill_size")}
    b = burst(url, server.port, work, log_path)
    b["requests"] += prefill_aborts(url, server.port, work)
    record["burst"] = {k: v for k, v in b.items() if k != "requests"}
    record["after_burst"] = settle(url, None, args.settle_timeout)
    flush(url)
    record["after_flush"] = settle(url, idle["num_used_tokens"], 60)
    record["judged"] = judge(b["requests"], b["aborts_sent"])
    completed = [r for r in b["requests"] if r["kind"] == "complete" and r.get("finish") == "length"]
    record["load"] = {"requests": len(b["requests"]), "completed": len(completed),
                      "prompt_tokens": sum(r["prompt_len"] for r in b["requests"]),
                      "output_tokens": sum(len(r.get("output_ids") or []) for r in completed),
                      "minutes": round(b["seconds"] / 60, 2)}
    if args.mode == "hicache":
        details = [r.get("cached_tokens_details") or {} for r in completed]
        record["hicache"] = {"cached_device": sum(d.get("device", 0) or 0 for d in details),
                             "cached_host": sum(d.get("host", 0) or 0 for d in details)}
    record["alone"] = alone(url, completed, args.rerun)
    flush(url)
    record["after_alone"] = settle(url, idle["num_used_tokens"], 60)
    record["bad_requests"] = send_bad_requests(url, record["server_info"].get("max_req_input_len") or 40960)
    record["healthy_at_end"] = healthy(url)
    record["final_load"] = settle(url, None, 60)
    record["requests"] = [{k: v for k, v in r.items() if k not in ("logprobs", "top2", "output_ids", "_ids")}
                          for r in b["requests"]]
    return record


def summary_row(record: dict) -> dict:
    """One run's figures: load held, faults injected, what was lost, the pool, the alone comparison, bad requests."""
    if record.get("error"):
        return {"label": record["label"], "error": record["error"]}
    counts = record["judged"]["counts"]
    alone_cmp = record["alone"]["compare"]
    bad = record["bad_requests"]
    return {
        "label": record["label"], "passed": record["verdict"]["passed"],
        "requests": record["load"]["requests"], "completed": counts["complete"],
        "prompt_tokens": record["load"]["prompt_tokens"], "output_tokens": record["load"]["output_tokens"],
        "minutes": record["load"]["minutes"], "peak_running": record["burst"]["peak"]["num_running_reqs"],
        "peak_waiting": record["burst"]["peak"]["num_waiting_reqs"],
        "peak_used_tokens": record["burst"]["peak"]["num_used_tokens"],
        "pool_tokens": record["server_info"].get("max_total_num_tokens"),
        "retractions_logged": record["burst"]["retracted_logged"], "requests_retracted": counts["retracted"],
        "disconnects": counts["disconnect"], "aborts_running": counts["abort_running"],
        "aborts_queued": counts["abort_queued"], "aborts_prefill": counts["abort_prefill"],
        "aborted_without_output": counts["aborted_without_output"], "lost_or_truncated": len(record["judged"]["bad"]),
        "used_tokens_idle": record["idle"]["num_used_tokens"],
        "used_tokens_after": record["after_flush"]["num_used_tokens"],
        "alone_identical": f"{alone_cmp['requests_identical']}/{alone_cmp['requests']}",
        "alone_divergences_not_near_tie": alone_cmp["divergences_not_near_tie"],
        "bad_requests_4xx": f"{sum(b['clean'] for b in bad)}/{len(bad)}",
        "healthy_after_each": all(b["healthy_after"] for b in bad), "healthy_at_end": record["healthy_at_end"],
        **({"hicache": record["hicache"]} if "hicache" in record else {}),
    }


def summarize(paths: list[Path], json_out: Path | None) -> int:
    rows = [summary_row(json.loads(p.read_text())) for p in paths]
    keys = [k for k in rows[0] if k != "label"] if rows else []
    for key in dict.fromkeys(k for r in rows for k in r):
        if key not in keys and key != "label":
            keys.append(key)
    print("| " + " | ".join(["figure"] + [r["label"] for r in rows]) + " |")
    print("|" + "---|" * (len(rows) + 1))
    for key in keys:
        print("| " + " | ".join([key] + [str(r.get(key, "")) for r in rows]) + " |")
    failed = [r for r in rows if not r.get("passed")]
    for r in failed:
        print(f"\n{r['label']}: not passed" + (f" ({r['error']})" if r.get("error") else ""))
    if json_out:
        json_out.write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--summarize"]:
        parser = argparse.ArgumentParser(description="the tables of load_faults.py runs")
        parser.add_argument("--summarize", nargs="+", type=Path, required=True)
        parser.add_argument("--json", type=Path)
        args = parser.parse_args(argv)
        return summarize(args.summarize, args.json)
    argv, extra = split_server_argv(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--mode", choices=("plain", "ngram", "hicache"), default="plain")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--log", type=Path)
    parser.add_argument("--label")
    parser.add_argument("--cpu", action="store_true", help="the real server on this CPU (the project's CPU shims)")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--pool-tokens", type=int, default=32768, help="--max-total-tokens of the device pool")
    parser.add_argument("--burst", type=int, default=64, help="requests that must complete (a second wave of half)")
    parser.add_argument("--disconnects", type=int, default=8)
    parser.add_argument("--aborts", type=int, default=6, help="aborted while running, and as many while queued")
    parser.add_argument("--prompt-lens", default="1000,4000", help="LOW,HIGH random prompt tokens")
    parser.add_argument("--new-tokens", default="128,512", help="LOW,HIGH max_new_tokens")
    parser.add_argument("--docs", type=int, default=6, help="hicache: shared documents the prompts start with")
    parser.add_argument("--doc-tokens", type=int, default=2048)
    parser.add_argument("--prefill-abort-tokens", type=int, default=16384)
    parser.add_argument("--token-ratio", type=float, default=0.2, help="SGLANG_INIT_NEW_TOKEN_RATIO")
    parser.add_argument("--wave-delay", type=float, default=10.0)
    parser.add_argument("--burst-timeout", type=float, default=300.0)
    parser.add_argument("--settle-timeout", type=float, default=120.0)
    parser.add_argument("--rerun", type=int, default=16, help="completed requests sent again alone")
    args = parser.parse_args(argv)
    log = args.log or args.out.with_suffix(".log")
    server_args = base_server_args(args.model, args.backend, args.kv_cache_dtype) + [
        "--max-total-tokens", str(args.pool_tokens)]
    if args.mode == "ngram":
        server_args += ["--speculative-algorithm", "NGRAM", "--speculative-ngram-max-bfs-breadth", "1"]
    elif args.mode == "hicache":
        server_args += ["--enable-hierarchical-cache", "--hicache-ratio", "4"]
    env = server_env(args.cpu)
    if args.cpu:
        server_args += ["--device", "cpu"]
    else:
        server_args += ["--mem-fraction-static", "0.15", "--cuda-graph-max-bs", "64"]
    env["SGLANG_INIT_NEW_TOKEN_RATIO"] = str(args.token_ratio)
    server_args += extra
    server = Server(server_args, log, env, args.startup_timeout)
    record = {"label": args.label or f"{Path(args.model).name}/{args.backend}/{args.kv_cache_dtype}/{args.mode}",
              "server_args": server_args, "workload": {k: v for k, v in vars(args).items()
                                                       if k not in ("out", "log", "model")}}
    try:
        record["startup_s"] = server.start()
        record.update(run(server, args, log))
        record["verdict"] = verdict(record)
    except Exception as exc:
        record["error"] = repr(exc)
    finally:
        server.stop()
    args.out.write_text(json.dumps(record))
    print(json.dumps({"label": record["label"], "verdict": record.get("verdict"), "error": record.get("error"),
                      "load": record.get("load"), "burst": record.get("burst")}), flush=True)
    return 0 if (record.get("verdict") or {}).get("passed") else 1


def verdict(record: dict) -> dict:
    """What the run shows, each a number; ``passed`` when nothing was lost and every check holds."""
    cmp = record["alone"]["compare"]
    bad = record["bad_requests"]
    checks = {
        "retracted": record["burst"]["retracted_logged"] > 0,
        "lost_or_truncated": len(record["judged"]["bad"]) == 0,
        "pool_back_after_burst": record["after_flush"]["num_used_tokens"] == record["idle"]["num_used_tokens"],
        "alone_matches": cmp["divergences_not_near_tie"] == 0 and cmp["requests"] > 0,
        "bad_requests_4xx": all(b["clean"] for b in bad),
        "healthy_after_each_bad_request": all(b["healthy_after"] for b in bad),
        "healthy_at_end": record["healthy_at_end"],
        "aborted_in_prefill": record["judged"]["counts"]["aborted_without_output"] > 0,
    }
    return {"passed": all(checks.values()), "checks": checks,
            "alone": {k: cmp[k] for k in ("requests", "requests_identical", "requests_diverged",
                                          "divergences_not_near_tie", "tokens", "tokens_agreeing")}}


if __name__ == "__main__":
    sys.exit(main())
