"""Load and faults against the real SGLang server on a CPU: gemma-3-270m (sliding window 512) on the inkling
backend with an MXFP8 KV cache, one server for the module, loopback only, bounded everywhere.

- 16 concurrent greedy requests of mixed lengths, 4 of them past the 512-token window, give the same tokens as the
  same requests sent one by one. Batching may change bf16 rounding (the MLP's matmuls see another batch), so the
  two runs are compared as the bf16 parity tests compare backends (``margins.py``): the one-by-one run is the
  reference, and a divergence passes only where the float32 oracle's margin at that position is within the
  noise the reference itself shows against the oracle; the concurrent run's error level must not exceed the
  one-by-one run's beyond noise. Each excused divergence is reported.
- A streaming request closed by the client after a few chunks, and a long request stopped by ``/abort_request``:
  afterwards the server answers and its KV usage (SGLang's ``/v1/loads``: ``num_used_tokens``, the pool's tokens
  held by requests) is back to its idle level, with no request running or waiting.
- A request longer than the KV pool holds gets a clear error and the server stays healthy.
- At the end the server is healthy and answers a request with the tokens it gave the first time.

p50/p95 request latency of the concurrent run and the KV figures are printed (and reported in the session's
summary, ``integration/conftest.py``), not asserted. The radix cache is off so that a repeated
prompt is computed again (the one-by-one run must not read the concurrent run's cache) and idle KV usage is 0.
"""
import http.client
import json
import statistics
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness import REPORT
from margins import compare_on_margins
from demo.server import SGLangServer
from workloads import Answer, WorkloadRun

MODEL = "gemma-3-270m"
WINDOW = 512
NEW_TOKENS = 8
MAX_TOTAL_TOKENS = 8192
REQUEST_TIMEOUT_S = 300.0
SETTLE_TIMEOUT_S = 60.0

FIRST_ANSWERS: dict = {}  # prompt -> its one-by-one tokens, from the first test, for the last one

_SENTENCE = ("The river wound through the valley, past the old mill and the stone bridge, where the farmers met "
             "on market days to trade grain, wool and news from the distant towns. ")


def _prompts() -> list[str]:
    """16 distinct prompts (distinct from their first words) of about 10 to 700 tokens; 4 exceed the window."""
    topics = ["astronomy", "bread", "chess", "dolphins", "engines", "forests", "glaciers", "honey", "islands",
              "jazz", "kites", "lighthouses", "maps", "nests", "orchards", "pottery"]
    repeats = [0, 1, 0, 2, 1, 3, 0, 5, 1, 2, 0, 4, 15, 16, 17, 18]  # the last four: ~540-640 tokens
    prompts = []
    for topic, n in zip(topics, repeats):
        prompts.append(f"A note about {topic}. " + _SENTENCE * n + f"In one sentence, {topic} are")
    return prompts


# --- HTTP helpers (bounded) -----------------------------------------------------------------------------------

def _post(server, path: str, body: dict, timeout_s: float = REQUEST_TIMEOUT_S) -> tuple[int, dict]:
    request = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        text = err.read().decode(errors="replace")
        try:
            return err.code, json.loads(text)
        except json.JSONDecodeError:
            return err.code, {"raw": text}


def _get(server, path: str, timeout_s: float = 10.0) -> dict:
    with urllib.request.urlopen(server.url + path, timeout=timeout_s) as response:
        return json.loads(response.read())


def _generate(server, prompt=None, input_ids=None, max_new_tokens=NEW_TOKENS, rid=None) -> tuple[int, dict]:
    body = {"sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens},
            "return_logprob": True, "top_logprobs_num": 2}
    if input_ids is not None:
        body["input_ids"] = input_ids
    else:
        body["text"] = prompt
    if rid is not None:
        body["rid"] = rid
    return _post(server, "/generate", body)


def _answer(status: int, out: dict) -> dict:
    assert status == 200, out
    meta = out["meta_info"]
    return {"ids": [entry[1] for entry in meta["output_token_logprobs"]],
            "logprobs": [entry[0] for entry in meta["output_token_logprobs"]],
            "top2": [[(entry[1], entry[0]) for entry in pos] for pos in meta["output_top_logprobs"]],
            "prompt_tokens": int(meta["prompt_tokens"])}


def _load(server) -> dict:
    loads = _get(server, "/v1/loads?include=core")["loads"]
    assert len(loads) == 1, loads
    return loads[0]


def _settled(server, idle_used: int, timeout_s: float = SETTLE_TIMEOUT_S) -> dict:
    """Poll /v1/loads until no request runs or waits and the KV usage is back at ``idle_used`` (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        load = _load(server)
        if (load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0
                and load["num_used_tokens"] == idle_used):
            return load
        if time.monotonic() > deadline:
            pytest.fail(f"server did not settle within {timeout_s:.0f} s: {load} (idle num_used_tokens "
                        f"{idle_used})")
        time.sleep(0.25)


def _healthy(server) -> bool:
    try:
        with urllib.request.urlopen(server.url + "/health", timeout=10) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


# --- the server ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("load-and-faults") / "server.log"
    srv = SGLangServer(model_dir(MODEL), "inkling", "mxfp8", max_total_tokens=MAX_TOTAL_TOKENS,
                       extra_args=("--disable-radix-cache",), log_path=log)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def idle(server) -> dict:
    _generate(server, "Warm-up.", max_new_tokens=2)  # first-request costs out of the measurements
    return _settled(server, _load(server)["num_used_tokens"])


# --- the tests ----------------------------------------------------------------------------------------------

def _as_run(answers: list[dict], prompt_ids: list[list[int]]) -> WorkloadRun:
    run = WorkloadRun(config={}, startup_s=0.0)
    for i, (a, ids) in enumerate(zip(answers, prompt_ids)):
        run.answers[f"request{i}"] = Answer(output_ids=a["ids"], logprobs=a["logprobs"], top2=a["top2"],
                                            cached_tokens=0, prompt_tokens=a["prompt_tokens"], prompt_ids=ids)
    return run


def test_concurrent_requests_match_one_by_one(server, idle, model_dir):
    prompts = _prompts()
    prompt_ids = [server.tokenize(p) for p in prompts]  # the oracle is fed exactly what the server saw
    latencies = [0.0] * len(prompts)

    def timed(i):
        start = time.monotonic()
        result = _generate(server, input_ids=prompt_ids[i])
        latencies[i] = time.monotonic() - start
        return result

    wall = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        concurrent = [_answer(*r) for r in pool.map(timed, range(len(prompts)))]
    wall = time.monotonic() - wall
    sequential = [_answer(*_generate(server, input_ids=ids)) for ids in prompt_ids]
    FIRST_ANSWERS[prompts[0]] = sequential[0]["ids"]

    lengths = [a["prompt_tokens"] for a in sequential]
    assert len(prompts) >= 16 and sum(n > WINDOW for n in lengths) >= 4, lengths
    q = statistics.quantiles(latencies, n=20, method="inclusive")  # within the measured range
    figures = {"requests": len(prompts), "prompt_tokens": [min(lengths), max(lengths)],
               "past_window": sum(n > WINDOW for n in lengths), "new_tokens": NEW_TOKENS, "wall_s": round(wall, 1),
               "latency_p50_s": round(statistics.median(latencies), 2), "latency_p95_s": round(q[18], 2),
               "latency_max_s": round(max(latencies), 2)}
    REPORT["load_concurrent"] = figures
    print(f"\n[load] {figures}")

    result = compare_on_margins(model_dir(MODEL), _as_run(sequential, prompt_ids),
                                {"concurrent": _as_run(concurrent, prompt_ids)})
    judged = result["candidates"]["concurrent"]
    figures.update(identical=judged["identical"], near_ties=judged["excused_near_ties"],
                   mismatched=judged["mismatches"], error_level=judged["error_level"],
                   noise_bound=result["noise_bound"])
    print(f"[load] greedy tokens: {judged['identical']}/{len(prompts)} identical to one by one; near ties "
          f"(float32 margin <= {result['noise_bound']} nats): {judged['excused_near_ties']}")
    assert judged["passed"], json.dumps(judged)


def _stream_and_close(server, prompt: str, chunks: int) -> int:
    """POST a streaming /generate, read ``chunks`` data chunks, then close the connection. Returns chunks read."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=REQUEST_TIMEOUT_S)
    body = {"text": prompt, "stream": True, "sampling_params": {"temperature": 0.0, "max_new_tokens": 400}}
    conn.request("POST", "/generate", body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200, response.read()[:500]
    seen = 0
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    while seen < chunks and time.monotonic() < deadline:
        line = response.readline()
        if not line:
            break
        if line.startswith(b"data:") and b"[DONE]" not in line:
            seen += 1
    conn.close()
    return seen


def test_a_closed_stream_and_an_abort_free_the_kv(server, idle):
    idle_used = idle["num_used_tokens"]
    prompt = "A note about rivers. " + _SENTENCE * 2 + "Tell a long story about the river:"

    assert _stream_and_close(server, prompt, chunks=3) == 3
    after_close = _settled(server, idle_used)

    rid = "inkling-abort-me"
    result = {}
    worker = threading.Thread(target=lambda: result.update(r=_generate(server, prompt, max_new_tokens=400, rid=rid)))
    worker.start()
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    busy = _load(server)
    while busy["num_running_reqs"] == 0 and time.monotonic() < deadline:  # wait until it decodes
        time.sleep(0.1)
        busy = _load(server)
    assert busy["num_running_reqs"] == 1 and busy["num_used_tokens"] > idle_used, busy
    status, _ = _post(server, "/abort_request", {"rid": rid}, timeout_s=30)
    assert status == 200
    worker.join(timeout=REQUEST_TIMEOUT_S)
    assert not worker.is_alive()
    status, out = result["r"]
    finish = out.get("meta_info", {}).get("finish_reason") or {}
    completion = out.get("meta_info", {}).get("completion_tokens")
    after_abort = _settled(server, idle_used)
    REPORT["faults_abort"] = {"kv_tokens_idle": idle_used, "kv_tokens_decoding": busy["num_used_tokens"],
                              "kv_tokens_after_closed_stream": after_close["num_used_tokens"],
                              "kv_tokens_after_abort": after_abort["num_used_tokens"],
                              "token_usage_after_abort": after_abort["token_usage"], "aborted_http": status,
                              "aborted_finish": finish.get("type"), "aborted_tokens": completion}
    print(f"\n[faults] {REPORT['faults_abort']}")
    assert finish.get("type") == "abort" and (completion or 0) < 400, out
    assert _answer(*_generate(server, "After the abort, say hello:"))["ids"]


def test_a_request_larger_than_the_pool_is_refused(server, idle):
    info = _get(server, "/server_info")
    limit = info["max_req_input_len"]  # SGLang: min(context length, KV pool tokens) - 6
    assert limit < MAX_TOTAL_TOKENS, limit  # the pool, not the model's 32k context, is the bound here
    too_long = [2] + [1000] * (limit + 10)  # <bos> and a repeated token: never prefilled
    status, out = _generate(server, input_ids=too_long)
    message = json.dumps(out)
    REPORT["faults_too_long"] = {"tokens": len(too_long), "limit": limit, "http": status, "message": message[:300]}
    print(f"\n[faults] {REPORT['faults_too_long']}")
    assert status == 400 or out.get("meta_info", {}).get("finish_reason", {}).get("type") == "abort", out
    assert "exceeds the maximum allowed length" in message or "longer than" in message, out
    _settled(server, idle["num_used_tokens"])
    assert _healthy(server)


def test_healthy_at_the_end(server, idle):
    prompt = _prompts()[0]
    first = FIRST_ANSWERS.get(prompt) or _answer(*_generate(server, prompt))["ids"]
    assert _healthy(server)
    assert _answer(*_generate(server, prompt))["ids"] == first  # the same tokens as before the faults
    _settled(server, idle["num_used_tokens"])
