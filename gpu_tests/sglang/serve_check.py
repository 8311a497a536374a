"""Start the real SGLang server on the GPU machine (``python -m sglang.launch_server``), send the parity workload,
save every request's tokens and top-2 logprobs as JSON, stop the server. Test-only.

Workload (seeded, the same for every backend): ``len(PROMPT_LENS)`` prompts of random token ids, all sent at once
(concurrent requests of mixed lengths; the longest cross the 256-token window of gemma3-swa and, with
``--chunked-prefill-size 512``, are prefilled in chunks); then a text prompt through the real tokenizer; then a
prompt sharing a cached prefix with an earlier one (SGLang reports ``cached_tokens`` > 0: a prefix-cache hit).
``--evict-tokens N`` adds a phase for the hierarchical cache: two documents (``EVICT_DOC_TOKENS`` tokens each) are
prefilled one request at a time, then distinct prompts of ``N`` tokens in all, one at a time, push them out of a
device pool smaller than N; then each document again with a new tail, one at a time: with HiCache its pages come back
from host memory (``cached_tokens_details`` says how many from the device and from the host), without it they are
computed again. Every request of the phase runs alone, so its tokens do not depend on what it was batched with.
``--decode-rate TOKENS`` adds a last phase: decode speed one request at a time (``decode_rate``), for speculative
decoding against the same server without it.

    python gpu_tests/sglang/serve_check.py --model DIR --backend inkling --kv-cache-dtype mxfp8 --out run.json \
        [--log server.log] [-- extra server args]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

PROMPT_LENS = [40, 130, 300, 600, 900, 1300, 2000, 257, 513, 1025]
NEW_TOKENS = 48
SEED = 1234
VOCAB_LOW, VOCAB_HIGH = 100, 49000
TEXT_PROMPT = "The capital of France is"
EVICT_DOC_TOKENS = 2048  # a multiple of the 512-token prefill chunk and of the 128-token page
EVICT_FLOOD_PROMPT = 2000
DECODE_RATE_REQUESTS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts(lens=PROMPT_LENS) -> list[list[int]]:
    rng = random.Random(SEED)
    return [[rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)] for n in lens]


def post(url: str, body: dict, timeout: float = 600.0) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def generate(url: str, input_ids=None, text=None, new_tokens=NEW_TOKENS) -> dict:
    body = {"sampling_params": {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True},
            "return_logprob": True, "top_logprobs_num": 2}
    body.update({"input_ids": input_ids} if input_ids is not None else {"text": text})
    out = post(url + "/generate", body)
    meta = out["meta_info"]
    return {"output_ids": [e[1] for e in meta["output_token_logprobs"]],
            "logprobs": [e[0] for e in meta["output_token_logprobs"]],
            "top2": [[[t[1], t[0]] for t in pos] for pos in meta["output_top_logprobs"]],
            "cached_tokens": meta.get("cached_tokens"), "prompt_tokens": meta.get("prompt_tokens"),
            "cached_tokens_details": meta.get("cached_tokens_details"), "e2e_s": meta.get("e2e_latency"),
            "spec_accept_length": meta.get("spec_accept_length"), "spec_verify_ct": meta.get("spec_verify_ct"),
            "text": out.get("text")}


def prompt_logprobs(url: str, input_ids: list[int]) -> dict:
    """Teacher-forced: the logprob SGLang gives each prompt token (and the top-2 there), from one extend pass."""
    body = {"input_ids": input_ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2}
    meta = post(url + "/generate", body)["meta_info"]
    return {"logprobs": [e[0] for e in meta["input_token_logprobs"]],
            "top2": [[[t[1], t[0]] for t in (pos or [])] for pos in meta["input_top_logprobs"]]}


SGLANG_LAUNCHER = ["-m", "sglang.launch_server"]


class Server:
    """A server process in its own session, healthy when ``/health`` answers 200. ``launcher``: the interpreter's
    arguments before the server's (SGLang's by default; ``["-m", "vllm.entrypoints.cli.main", "serve"]`` for vLLM)."""

    def __init__(self, args_list: list[str], log_path: Path, env: dict, timeout_s: float,
                 launcher: list[str] = SGLANG_LAUNCHER):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, *launcher, *args_list, "--host", "127.0.0.1", "--port", str(self.port)]
        self.log_path, self.env, self.timeout_s = log_path, env, timeout_s
        self.proc = None

    def start(self) -> float:
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(("$ " + " ".join(self.cmd) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         cwd="/tmp")  # not the checkout: its source tree would shadow the wheel
        while time.monotonic() - started < self.timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with rc {self.proc.returncode} during start-up")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - started
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        raise RuntimeError(f"server not healthy after {self.timeout_s:.0f} s")

    def stop(self) -> None:
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def evict_and_reload(url: str, evict_tokens: int, new_tokens=NEW_TOKENS) -> dict:
    """The hierarchical-cache phase (module docstring): per document, its first request, then (after the flood) its
    second, timed (``ttft_s``: the same prompt with one new token first would cache it on the device, so the time to
    first token is the second request's with ``max_new_tokens`` 1, sent as a third document's reload)."""
    rng = random.Random(SEED + 1)
    docs = [[rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(EVICT_DOC_TOKENS)] for _ in range(3)]
    first = [generate(url, input_ids=d + [111, 222, 333], new_tokens=new_tokens if i < 2 else 1)
             for i, d in enumerate(docs)]
    flood, sent = [], 0
    while sent < evict_tokens:
        prompt = [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(EVICT_FLOOD_PROMPT)]
        flood.append(generate(url, input_ids=prompt, new_tokens=1)["cached_tokens"])
        sent += len(prompt)
    started = time.monotonic()
    ttft = generate(url, input_ids=docs[2] + [444, 555, 666], new_tokens=1)
    ttft_s = time.monotonic() - started
    second = [generate(url, input_ids=d + [444, 555, 666], new_tokens=new_tokens) for d in docs[:2]]
    return {"first": first[:2], "second": second, "ttft_request": ttft, "ttft_s": ttft_s,
            "flood_prompts": len(flood), "flood_tokens": sent, "flood_cached_tokens": flood}


def decode_rate(url: str, new_tokens: int, requests=DECODE_RATE_REQUESTS) -> dict:
    """Decode speed one request at a time (where speculation pays off): ``requests`` greedy requests of
    ``new_tokens`` tokens after a 300-token prompt, each alone, timed on the client; tokens/s of each, and the accept
    length SGLang reports when speculating (completion tokens per verify step)."""
    rng = random.Random(SEED + 2)
    prompt = [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(300)]
    generate(url, input_ids=prompt, new_tokens=8)  # the prompt's pages cached: each timed request prefills 1 token
    runs = []
    for _ in range(requests):
        started = time.monotonic()
        out = generate(url, input_ids=prompt, new_tokens=new_tokens)
        seconds = time.monotonic() - started
        runs.append({"seconds": seconds, "tok_s": len(out["output_ids"]) / seconds,
                     "spec_accept_length": out["spec_accept_length"], "output_ids": out["output_ids"]})
    rates = sorted(r["tok_s"] for r in runs)
    return {"new_tokens": new_tokens, "runs": runs, "tok_s_median": rates[len(rates) // 2]}


def run_workload(url: str, lens=PROMPT_LENS, new_tokens=NEW_TOKENS, with_prompt_logprobs=False,
                 with_rescore=False, evict_tokens=0, decode_rate_tokens=0) -> dict:
    ps = prompts(lens)
    results: list = [None] * len(ps)
    errors: list = []

    def one(i):
        try:
            results[i] = generate(url, input_ids=ps[i], new_tokens=new_tokens)
        except Exception as exc:  # recorded, not swallowed: the JSON says which request failed and why
            errors.append(f"request {i}: {exc!r}")

    started = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ps))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    concurrent_s = time.monotonic() - started
    text = generate(url, text=TEXT_PROMPT, new_tokens=16)
    # prefix hit: a cached prompt's head then a new tail; SGLang reuses the cached pages of the prefix (default
    # workload: prompt 5's first 1024 tokens, as run on the H200; otherwise the longest prompt's first half)
    head = ps[5][:1024] if list(lens) == PROMPT_LENS else max(ps, key=len)[:max(lens) // 2]
    prefix_hit = generate(url, input_ids=head + [101, 202, 303, 404, 505], new_tokens=new_tokens)
    record = {"concurrent": results, "errors": errors, "concurrent_s": concurrent_s, "text": text,
              "prefix_hit": prefix_hit, "prompt_lens": list(lens)}
    if with_prompt_logprobs:  # after the rest, so the greedy requests above see the same cache states as before
        record["prompt_logprobs"] = [prompt_logprobs(url, p) for p in ps]
    if with_rescore:  # each concurrent request's prompt + greedy output again, as one extend (compare.py --self)
        record["rescored"] = [prompt_logprobs(url, p + r["output_ids"]) if r else None for p, r in zip(ps, results)]
    if evict_tokens:
        record["evict_reload"] = evict_and_reload(url, evict_tokens, new_tokens)
    if decode_rate_tokens:
        record["decode_rate"] = decode_rate(url, decode_rate_tokens)
    return record


def split_server_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """This script's arguments, and the extra server arguments after ``--``."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def base_server_args(model, backend: str, kv_cache_dtype: str) -> list[str]:
    """The server flags every harness run shares (bf16 weights, 512-token prefill chunks, no warm-up requests)."""
    return ["--model-path", str(model), "--attention-backend", backend, "--kv-cache-dtype", kv_cache_dtype,
            "--dtype", "bfloat16", "--chunked-prefill-size", "512", "--skip-server-warmup"]


def server_env(cpu: bool) -> dict:
    """The server's environment: this one on the GPU machine; on a CPU, the project's CPU shims (demo/cpu_host.py)
    with this folder's patches first on PYTHONPATH."""
    if not cpu:
        return dict(os.environ)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: demo/
    from demo.cpu_host import cpu_env

    env = cpu_env()
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent / "patches") + os.pathsep + env["PYTHONPATH"]
    return env


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    argv, extra = split_server_argv(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--log", type=Path)
    parser.add_argument("--label", default=None)
    parser.add_argument("--startup-timeout", type=float, default=420.0)
    parser.add_argument("--cpu", action="store_true",
                        help="the real server on this CPU (the project's CPU shims, --device cpu, no CUDA graphs)")
    parser.add_argument("--lens", default=",".join(map(str, PROMPT_LENS)), help="prompt lengths, comma-separated")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument("--prompt-logprobs", action="store_true",
                        help="also every prompt token's logprob and top-2, teacher-forced (compare.py uses them)")
    parser.add_argument("--rescore", action="store_true",
                        help="also score each request's prompt + its own greedy output in one extend pass: the "
                             "decode steps' logprobs against the prefill's on the same tokens (compare.py --self)")
    parser.add_argument("--evict-tokens", type=int, default=0,
                        help="the hierarchical-cache phase: this many flood tokens after two documents, then the "
                             "documents again (more than the device pool holds; module docstring)")
    parser.add_argument("--decode-rate", type=int, default=0, metavar="TOKENS",
                        help="after the rest, decode speed one request at a time: a few greedy requests of TOKENS "
                             "tokens each, timed, with SGLang's accept length when speculating (decode_rate)")
    args = parser.parse_args(argv)
    lens = [int(x) for x in args.lens.split(",")]
    if not lens or min(lens) < 1 or args.new_tokens < 1:
        parser.error(f"--lens and --new-tokens must be positive, got {args.lens!r} and {args.new_tokens}")
    log = args.log or args.out.with_suffix(".log")
    server_args = base_server_args(args.model, args.backend, args.kv_cache_dtype)
    env = server_env(args.cpu)
    if args.cpu:
        server_args += ["--device", "cpu", "--max-total-tokens", str(4 * (sum(lens) + len(lens) * args.new_tokens))]
    else:
        server_args += ["--mem-fraction-static", "0.15", "--cuda-graph-max-bs-decode", "16"]
    server_args += extra
    server = Server(server_args, log, env, args.startup_timeout)
    record = {"label": args.label or f"{Path(args.model).name}/{args.backend}/{args.kv_cache_dtype}",
              "server_args": server_args}
    try:
        record["startup_s"] = server.start()
        record.update(run_workload(server.url, lens, args.new_tokens, args.prompt_logprobs, args.rescore,
                                   args.evict_tokens, args.decode_rate))
        rc = 0 if not record["errors"] else 1
    except Exception as exc:
        record["error"] = repr(exc)
        rc = 1
    finally:
        server.stop()
    args.out.write_text(json.dumps(record))
    print(f"{record['label']}: rc={rc} startup={record.get('startup_s')} error={record.get('error')} "
          f"request_errors={record.get('errors')}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
