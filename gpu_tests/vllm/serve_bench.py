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

import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sglang"))
import sglang_twin  # noqa: E402
from serve_check import Server  # noqa: E402

sglang_bench = sglang_twin.load("serve_bench")
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


def run_workload(server: Server, head: dict, facts: dict, workload: str, args, tokenizer: Path, out: Path,
                 timeout_s: float) -> dict:
    name = head["config"]
    filename, client_log = f"bench_{name}_{workload}.json", out / f"bench_{name}_{workload}.log"
    cargs = client_args(workload, server.url, args.model, tokenizer, out, filename)
    record = {"workload": workload, "client_args": cargs,
              **sglang_bench.run_client([sys.executable, *CLIENT, *cargs], None, server, client_log, timeout_s,
                                        log_window_stats)}
    result_file = out / filename
    result = (reduce_result(json.loads(result_file.read_text()), facts["token_capacity"]) if result_file.exists()
              else None)
    return sglang_bench.with_result(record, result, "a result file", client_log, timeout_s)


class Harness(sglang_bench.Harness):
    """vLLM's side of the SGLang harness's run loop (``sglang_bench.run``)."""
    min_config_s = MIN_CONFIG_S
    default_configs = "FLASHINFER:auto,FLASHINFER:fp8,CUSTOM:mxfp8,CUSTOM:auto"
    static_help = "static memory per config (weights + KV pool), as the SGLang harness's"

    parse_config = staticmethod(parse_config)
    workload_args = staticmethod(workload_args)
    run_workload = staticmethod(run_workload)

    @staticmethod
    def memory(args, total_bytes: int) -> dict:
        pool = kv_pool_bytes(args.static_gib, weight_bytes(args.model))
        return {"host": "vllm", "static_gib": args.static_gib, "kv_cache_memory_bytes": pool,
                "memory": f"`--kv-cache-memory-bytes {pool}` for every config ({args.static_gib} GiB static less the "
                          f"weights: {pool / 2**30:.2f} GiB of KV pool)"}

    @staticmethod
    def server(config: dict, args, memory: dict, extra: list[str], log: Path, timeout_s: float) -> Server:
        return Server(server_args(config, args.model, memory["kv_cache_memory_bytes"], extra), log,
                      dict(os.environ), timeout_s, launcher=VLLM_LAUNCHER)

    @staticmethod
    def after_start(log: Path) -> dict:
        return {"token_capacity": token_capacity(log.read_text(errors="replace"))}


def run(args, extra: list[str], properties=None) -> None:
    sglang_bench.run(args, extra, properties or sglang_bench.gpu_properties, harness=Harness)


def main(argv=None) -> int:
    return sglang_bench.main(argv, harness=Harness, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
