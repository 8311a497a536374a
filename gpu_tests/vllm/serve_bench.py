"""Served throughput on vLLM (issue #64 item 1): the real ``vllm serve`` per configuration, driven by vLLM's own client
``vllm bench serve``; the table, JSON and plot of the SGLang harness (``gpu_tests/sglang/serve_bench.py summarize``).
Test-only.

The same workloads as the SGLang harness, spelled for vLLM's client: SGLang draws each length from [0.5 L, L],
vLLM's ``random`` dataset from [M (1 - r), M (1 + r)], so M = 0.75 L and r = 1/3 give the same range. The same memory
rule: every config gets the same static memory (``--static-gib``, 6.4 GiB), here the KV pool is what is left of it
after the weights (``--kv-cache-memory-bytes``: the same bytes for every config, so MXFP8 holds 1.94x bf16's tokens).

``run`` (GPU machine): per ``BACKEND:KV`` config, in order, one server (``serve_check.Server`` with vLLM's launcher),
then each workload through the client. One line per (config, workload) in OUT/runs.jsonl, in the SGLang harness's
record format: the client's result numbers (renamed where vLLM's names differ), the pool's token capacity from the
server's ``KV cache size: N tokens`` line, the peak ``Running: N reqs`` the server logged during the workload.

    python gpu_tests/vllm/serve_bench.py run --model DIR --tokenizer DIR --configs FLASHINFER:auto,CUSTOM:mxfp8 \\
        --workloads short,long --out DIR [--static-gib 6.4] [--budget-s 540] [-- extra server args]
    python gpu_tests/vllm/serve_bench.py summarize RUN_DIR [RUN_DIR ...] --out DIR
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sglang"))
from serve_check import Server, split_server_argv  # noqa: E402


def _sglang_serve_bench():
    """The SGLang harness's module (loaded by path: this module has its name)."""
    path = Path(__file__).resolve().parents[1] / "sglang" / "serve_bench.py"
    spec = importlib.util.spec_from_file_location("sglang_serve_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sglang_bench = _sglang_serve_bench()
VLLM_LAUNCHER = ["-m", "vllm.entrypoints.cli.main", "serve"]
CLIENT = ["-m", "vllm.entrypoints.cli.main", "bench", "serve"]
KV_DTYPES = ("auto", "fp8", "fp8_e4m3", "mxfp8")
RANGE_RATIO = 1 / 3  # vLLM's [M (1 - r), M (1 + r)] with M = 0.75 L is SGLang's [0.5 L, L]
# A vLLM start with its default compilation and graph capture; the first one also builds FlashInfer's JIT modules.
MIN_CONFIG_S = 120
KV_CACHE_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")
RUNNING_LINE = re.compile(r"Running: (\d+) reqs")
RESULT_NAMES = {"total_token_throughput": "total_throughput"}  # vLLM's name -> the SGLang harness's


def random_lengths(input_len: int, output_len: int, prompts: int, rate: str = "inf") -> list[str]:
    """vLLM's ``random`` dataset over SGLang's [0.5 L, L] ranges (the module docstring)."""
    return ["--dataset-name", "random", "--random-input-len", str(round(0.75 * input_len)),
            "--random-output-len", str(round(0.75 * output_len)), "--random-range-ratio", f"{RANGE_RATIO:.6f}",
            "--num-prompts", str(prompts), "--request-rate", rate]


WORKLOADS = {
    "short": random_lengths(1024, 256, 600),  # 512-1024 in / 128-256 out, all at once
    "long": random_lengths(8192, 1024, 400),  # 4096-8192 in / 512-1024 out
    "capacity": random_lengths(32768, 512, 96),  # 16k-32k in: the pool binds
    # 16 shared 4096-token prefixes x 32 questions of 256 tokens, 256 out: the prefix cache
    "prefix": ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "4096",
               "--prefix-repetition-suffix-len", "256", "--prefix-repetition-num-prefixes", "16",
               "--prefix-repetition-output-len", "256", "--num-prompts", "512", "--request-rate", "inf"],
}


def workload_args(name: str) -> list[str]:
    if name in WORKLOADS:
        return list(WORKLOADS[name])
    match = sglang_bench.RATE_WORKLOAD.fullmatch(name)
    if match and float(match.group(1)) > 0:
        return random_lengths(1024, 256, sglang_bench.RATE_PROMPTS, rate=match.group(1))
    raise ValueError(f"--workloads: unknown workload {name!r} (one of {', '.join(WORKLOADS)} or rate<R>, R > 0)")


def parse_config(spec: str) -> dict:
    parts = spec.split(":")
    if len(parts) != 2 or not parts[0] or parts[1] not in KV_DTYPES:
        raise ValueError(f"--configs: {spec!r} is not BACKEND:KV with KV one of {', '.join(KV_DTYPES)}")
    return {"name": f"{parts[0]}_{parts[1]}", "backend": parts[0], "kv": parts[1], "tag": ""}


def weight_bytes(model: Path) -> int:
    files = list(Path(model).glob("*.safetensors"))
    if not files:
        raise ValueError(f"--model: no *.safetensors in {model}")
    return sum(f.stat().st_size for f in files)


def kv_pool_bytes(static_gib: float, weights: int) -> int:
    pool = int(static_gib * 2**30) - weights
    if pool <= 0:
        raise ValueError(f"--static-gib: {static_gib} GiB does not hold the weights ({weights / 2**30:.2f} GiB)")
    return pool


def server_args(config: dict, model, pool_bytes: int, extra: list[str]) -> list[str]:
    return [str(model), "--attention-backend", config["backend"], "--kv-cache-dtype", config["kv"],
            "--dtype", "bfloat16", "--kv-cache-memory-bytes", str(pool_bytes), "--seed", "0", *extra]


def client_args(workload: str, url: str, model, tokenizer, out: Path, filename: str) -> list[str]:
    """The client's arguments after ``vllm bench serve``: every request runs to its drawn length (ignore EOS: the
    random-weight model could stop early), percentiles 50 and 99."""
    return ["--backend", "vllm", "--base-url", url, "--model", str(model), "--tokenizer", str(tokenizer),
            "--seed", str(sglang_bench.CLIENT_SEED), "--ignore-eos", "--num-warmups", "1", "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99", "--save-result",
            "--result-dir", str(out), "--result-filename", filename, *workload_args(workload)]


def token_capacity(log_text: str) -> int | None:
    match = KV_CACHE_LINE.search(log_text)
    return int(match.group(1).replace(",", "")) if match else None


def log_window_stats(text: str) -> dict:
    running = [int(n) for n in RUNNING_LINE.findall(text)]
    return {"peak_running_req": max(running, default=None)}


def reduce_result(result: dict, capacity: int | None) -> dict:
    kept = {RESULT_NAMES.get(k, k): v for k, v in result.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}
    kept["token_capacity"] = capacity
    return kept


def run_workload(server: Server, name: str, workload: str, model, tokenizer: Path, out: Path, timeout_s: float,
                 capacity: int | None) -> dict:
    filename, client_log = f"bench_{name}_{workload}.json", out / f"bench_{name}_{workload}.log"
    args = client_args(workload, server.url, model, tokenizer, out, filename)
    log_start, started = server.log_path.stat().st_size, time.monotonic()
    with open(client_log, "wb") as log:
        try:
            rc = subprocess.run([sys.executable, *CLIENT, *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd="/tmp", timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = None
    window = sglang_bench.read_window(server.log_path, log_start, server.log_path.stat().st_size)
    record = {"workload": workload, "client_args": args, "client_rc": rc, "client_s": time.monotonic() - started,
              "server_log": log_window_stats(window)}
    result_file = out / filename
    result = json.loads(result_file.read_text()) if result_file.exists() else None
    error = (f"client timed out after {timeout_s:.0f} s" if rc is None else f"client rc {rc}" if rc
             else "client rc 0 without a result file" if result is None else None)
    if error:
        record.update(error=error, client_log_tail=sglang_bench.tail(client_log))
    if result is not None:
        record["result"] = reduce_result(result, capacity)
    return record


def run(args, extra: list[str], properties=None) -> None:
    configs = [parse_config(spec) for spec in args.configs.split(",")]
    workloads = args.workloads.split(",")
    for workload in workloads:
        workload_args(workload)  # raises on an unknown name before any server starts
    for flag in ("static_gib", "budget_s", "startup_timeout"):
        if getattr(args, flag) <= 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    out = args.out.resolve()  # absolute: the client runs in /tmp
    runs = out / "runs.jsonl"
    if runs.exists():
        raise ValueError(f"--out: {out} already holds runs.jsonl (one folder per run)")
    pool = kv_pool_bytes(args.static_gib, weight_bytes(args.model))
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    _, device = (properties or sglang_bench.gpu_properties)()
    tokenizer = Path(args.tokenizer).resolve()
    memory = (f"`--kv-cache-memory-bytes {pool}` for every config ({args.static_gib} GiB static less the weights: "
              f"{pool / 2**30:.2f} GiB of KV pool)")

    def record(line: dict) -> None:
        with open(runs, "a") as f:
            f.write(json.dumps(line) + "\n")

    for config in configs:
        head = {"label": args.label, "device": device, "host": "vllm", "static_gib": args.static_gib,
                "kv_cache_memory_bytes": pool, "memory": memory, "config": config["name"],
                "backend": config["backend"], "kv": config["kv"], "tag": config["tag"]}
        left = args.budget_s - (time.monotonic() - started)
        if left < MIN_CONFIG_S:
            record({**head, "skipped": f"{left:.0f} s of the {args.budget_s:.0f} s budget left, a config needs "
                                       f"{MIN_CONFIG_S} s"})
            continue
        log = out / f"server_{config['name']}.log"
        server = Server(server_args(config, args.model, pool, extra), log, dict(os.environ),
                        min(args.startup_timeout, left), launcher=VLLM_LAUNCHER)
        try:
            try:
                head["startup_s"] = server.start()
            except RuntimeError as exc:  # exited or not healthy in time: recorded with the log's end
                record({**head, "error": str(exc), "server_log_tail": sglang_bench.tail(log)})
                continue
            capacity = token_capacity(log.read_text(errors="replace"))
            for workload in workloads:
                left = args.budget_s - (time.monotonic() - started)
                if left <= 0:
                    record({**head, "workload": workload, "skipped": "the budget is spent"})
                    continue
                line = run_workload(server, config["name"], workload, args.model, tokenizer, out, left, capacity)
                record({**head, **line})
                print(f"{config['name']} {workload}: {line.get('error') or 'ok'}, "
                      f"{(line.get('result') or {}).get('output_throughput', 0):.0f} output tok/s", flush=True)
        finally:
            server.stop()


def main(argv=None) -> int:
    argv, extra = split_server_argv(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="servers and the client, on the GPU machine")
    run_parser.add_argument("--model", type=Path, required=True)
    run_parser.add_argument("--tokenizer", required=True)
    run_parser.add_argument("--configs", default="FLASHINFER:auto,FLASHINFER:fp8,CUSTOM:mxfp8,CUSTOM:auto")
    run_parser.add_argument("--workloads", default="short,long")
    run_parser.add_argument("--out", type=Path, required=True)
    run_parser.add_argument("--static-gib", type=float, default=6.4,
                            help="static memory per config (weights + KV pool), as the SGLang harness's")
    run_parser.add_argument("--budget-s", type=float, default=540.0)
    run_parser.add_argument("--startup-timeout", type=float, default=300.0)
    run_parser.add_argument("--label", default=None)
    sum_parser = sub.add_parser("summarize", help="table.md, summary.json, served.png from runs.jsonl folders")
    sum_parser.add_argument("run_dirs", type=Path, nargs="+")
    sum_parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args, extra)
    else:
        if extra:
            raise ValueError(f"summarize: takes no server arguments after --, got {extra}")
        sglang_bench.summarize(args.run_dirs, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
