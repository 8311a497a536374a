"""Served throughput (issue #62): the real SGLang server per configuration, driven by SGLang's own client
``python -m sglang.benchmark.serving``; then a table, JSON and a plot. Test-only.

``run`` (GPU machine): per ``BACKEND:KV[:TAG]`` config, in order, one server (``serve_check.Server``) with
``--mem-fraction-static`` = ``--static-gib`` / the card's memory (the same bytes on an H100 and an H200), then each
workload through the client. One line per (config, workload) in OUT/runs.jsonl: the client's result line (numbers
only, and ``token_capacity`` from its ``server_info``), and what the server logged during that workload (the log's
byte offsets before and after the client): the peak ``#running-req`` of its ``Decode batch`` lines, and how many
``Decode batch`` / ``Prefill batch`` lines say ``cuda graph: True`` / ``False`` (SGLang logs one decode line per 40
decode steps, so False / (True + False) is the eager share of decode steps). A config is skipped when fewer than
``MIN_CONFIG_S`` seconds of ``--budget-s`` are left; each client may run for what is left.

``summarize`` (anywhere): one table per run folder (one device call, device named), each row's output tokens/s
against FlashInfer bf16 and fp8_e4m3 of the same folder and workload; table.md, summary.json, served.png.

    python gpu_tests/sglang/serve_bench.py run --model DIR --tokenizer DIR --configs flashinfer:auto,inkling:mxfp8 \
        --workloads short,long,rate16 --out DIR [--static-gib 6.4] [--budget-s 540] [-- extra server args]
    python gpu_tests/sglang/serve_bench.py summarize RUN_DIR [RUN_DIR ...] --out DIR
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_check import Server, split_server_argv  # noqa: E402

# Folder put first on the client's PYTHONPATH (not the server's): a ``datasets`` stand-in for the GPU image, which has
# no Hugging Face datasets; sglang.benchmark.datasets.mmmu imports its load_dataset at module level.
CLIENT_STUBS = Path(__file__).resolve().parent / "client_stubs"
CLIENT_SEED = 7
# A server took 33-62 s to start on the warm 2026-12-07 H100 (up to 200 s cold, run_parity.sh): 90 s leaves a short
# workload after a warm start.
MIN_CONFIG_S = 90
GIB = 2 ** 30


def random_ids(input_len: int, output_len: int, prompts: int, rate: str = "inf") -> list[str]:
    """random-ids prompts; SGLang draws each input (output) length from [0.5 x len, len] (range ratio 0.5)."""
    return ["--dataset-name", "random-ids", "--random-input-len", str(input_len), "--random-output-len",
            str(output_len), "--random-range-ratio", "0.5", "--num-prompts", str(prompts), "--request-rate", rate]


WORKLOADS = {
    "short": random_ids(1024, 256, 600),  # 512-1024 in / 128-256 out, all at once
    "long": random_ids(8192, 1024, 400),  # 4096-8192 in / 512-1024 out
    "capacity": random_ids(32768, 512, 96),  # 16k-32k in: the pool binds
    "prefix": ["--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "16", "--gsp-prompts-per-group", "32",
               "--gsp-system-prompt-len", "4096", "--gsp-question-len", "256", "--gsp-output-len", "256",
               "--request-rate", "inf"],  # 16 shared 4096-token prefixes x 32 questions: the radix cache
}
RATE_WORKLOAD = re.compile(r"rate(\d+(?:\.\d+)?)")  # rate<R>: the short workload at R requests/s, 300 prompts
RATE_PROMPTS = 300
# Config tags (combine with "+"). bcg: nothing (names a run with the prefill graphs on, SGLang's default).
CONFIG_TAGS = {"nobcg": ["--disable-prefill-cuda-graph"], "bcg": [],
               # "--cuda-graph-max-bs" is ambiguous in SGLang 0.5.23's parser (-decode and -prefill): the decode one
               "graph512": ["--cuda-graph-max-bs-decode", "512"]}
FI_BF16_KV = {"auto", "bf16", "bfloat16"}  # the test model's weights are bf16: auto is a bf16 pool
DECODE_LINE = re.compile(r"Decode batch, #running-req: (\d+),.*cuda graph: (True|False)")
PREFILL_LINE = re.compile(r"Prefill batch, .*cuda graph: (True|False)")


def workload_args(name: str) -> list[str]:
    if name in WORKLOADS:
        return list(WORKLOADS[name])
    match = RATE_WORKLOAD.fullmatch(name)
    if match and float(match.group(1)) > 0:
        return random_ids(1024, 256, RATE_PROMPTS, rate=match.group(1))
    raise ValueError(f"--workloads: unknown workload {name!r} (one of {', '.join(WORKLOADS)} or rate<R>, R > 0)")


def workload_rate(name: str) -> float | None:
    """The request rate a plot puts a workload at: rate<R> at R, short at inf, the others at none."""
    match = RATE_WORKLOAD.fullmatch(name or "")
    return float(match.group(1)) if match else (math.inf if name == "short" else None)


def parse_config(spec: str) -> dict:
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise ValueError(f"--configs: {spec!r} is not BACKEND:KV[:TAG]")
    backend, kv, tag = parts[0], parts[1], parts[2] if len(parts) == 3 else ""
    tag_args = []
    for t in tag.split("+") if tag else []:
        if t not in CONFIG_TAGS:
            raise ValueError(f"--configs: {spec!r} has unknown tag {t!r} (tags: {', '.join(CONFIG_TAGS)})")
        tag_args += CONFIG_TAGS[t]
    name = f"{backend}_{kv}" + (f"_{tag.replace('+', '-')}" if tag else "")
    return {"name": name, "backend": backend, "kv": kv, "tag": tag, "tag_args": tag_args}


def mem_fraction(static_gib: float, total_bytes: int) -> float:
    fraction = round(static_gib * GIB / total_bytes, 4)
    if not 0 < fraction < 1:
        raise ValueError(f"--static-gib: {static_gib} GiB of a {total_bytes / GIB:.1f} GiB card is fraction {fraction}")
    return fraction


def server_args(config: dict, model, fraction: float, extra: list[str]) -> list[str]:
    return ["--model-path", str(model), "--attention-backend", config["backend"], "--kv-cache-dtype", config["kv"],
            "--dtype", "bfloat16", "--mem-fraction-static", str(fraction), *config["tag_args"], *extra]


def client_args(workload: str, port: int, tokenizer, output_file) -> list[str]:
    """The client's arguments after ``python -m sglang.benchmark.serving``."""
    return ["--backend", "sglang", "--host", "127.0.0.1", "--port", str(port), "--tokenizer", str(tokenizer),
            "--seed", str(CLIENT_SEED), "--output-file", str(output_file), "--warmup-requests", "1", "--flush-cache",
            "--disable-tqdm", *workload_args(workload)]


def client_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(CLIENT_STUBS) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def log_window_stats(text: str) -> dict:
    decode = [(int(running), graph == "True") for running, graph in DECODE_LINE.findall(text)]
    prefill = [graph == "True" for graph in PREFILL_LINE.findall(text)]
    eager = sum(not graph for _, graph in decode)
    return {"peak_running_req": max((running for running, _ in decode), default=None),
            "decode_lines_graph": len(decode) - eager, "decode_lines_eager": eager,
            "eager_decode_share": eager / len(decode) if decode else None,
            "prefill_lines_graph": sum(prefill), "prefill_lines_eager": len(prefill) - sum(prefill)}


def read_window(path: Path, start: int, end: int) -> str:
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start).decode("utf-8", errors="replace")


def reduce_result(line: dict) -> dict:
    """The client's result line, numbers only, with the pool's token capacity (SGLang 0.5.23's /server_info has
    ``memory_usage`` inside ``internal_states[0]``; None where the client got no server_info)."""
    kept = {k: v for k, v in line.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    states = (line.get("server_info") or {}).get("internal_states") or [{}]
    kept["token_capacity"] = (states[0].get("memory_usage") or {}).get("token_capacity")
    return kept


def last_json_line(path: Path) -> dict | None:
    lines = path.read_text().splitlines() if path.exists() else []
    lines = [line for line in lines if line.strip()]
    return json.loads(lines[-1]) if lines else None


def tail(path: Path, n: int = 20) -> list[str]:
    return path.read_text(errors="replace").splitlines()[-n:] if path.exists() else []


def gpu_properties() -> tuple[int, str]:
    """The card's total memory (bytes) and name from torch, in a child process: a CUDA context in this process
    would hold GPU memory while the servers run."""
    code = "import torch; print(torch.cuda.get_device_properties(0).total_memory); print(torch.cuda.get_device_name(0))"
    total, name = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                 text=True).stdout.strip().splitlines()[-2:]
    return int(total), name


def run_client(cmd: list[str], env: dict | None, server: Server, client_log: Path, timeout_s: float,
               window_stats) -> dict:
    """One client command against ``server`` (in /tmp, its output in ``client_log``): its return code (None past
    ``timeout_s``), its time, and ``window_stats`` of what the server logged while it ran (the log's byte offsets
    before and after)."""
    log_start, started = server.log_path.stat().st_size, time.monotonic()
    with open(client_log, "wb") as log:
        try:
            rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd="/tmp", timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = None
    return {"client_rc": rc, "client_s": time.monotonic() - started,
            "server_log": window_stats(read_window(server.log_path, log_start, server.log_path.stat().st_size))}


def with_result(record: dict, result: dict | None, missing: str, client_log: Path, timeout_s: float) -> dict:
    """``record`` (``run_client``'s) with the client's reduced ``result``, or the error that explains its absence
    (``missing``: what rc 0 should have left) and the client log's end."""
    rc = record["client_rc"]
    error = (f"client timed out after {timeout_s:.0f} s" if rc is None else f"client rc {rc}" if rc
             else f"client rc 0 without {missing}" if result is None else None)
    if error:
        record.update(error=error, client_log_tail=tail(client_log))
    if result is not None:
        record["result"] = result
    return record


def run_workload(server: Server, head: dict, facts: dict, workload: str, args, tokenizer: Path, out: Path,
                 timeout_s: float) -> dict:
    name = head["config"]
    output_file, client_log = out / f"bench_{name}_{workload}.jsonl", out / f"bench_{name}_{workload}.log"
    cargs = client_args(workload, server.port, tokenizer, output_file)
    record = {"workload": workload, "client_args": cargs,
              **run_client([sys.executable, "-m", "sglang.benchmark.serving", *cargs], client_env(), server,
                           client_log, timeout_s, log_window_stats)}
    line = last_json_line(output_file)
    return with_result(record, None if line is None else reduce_result(line), "a result line", client_log, timeout_s)


class Harness:
    """What one host's served-throughput run needs besides ``run``'s loop: configs and workloads as that host spells
    them, its memory rule (fields every record carries), its server, what its server says once started, and a
    workload through its client. SGLang's here; vLLM's in gpu_tests/vllm/serve_bench.py."""
    min_config_s = MIN_CONFIG_S
    default_configs = "flashinfer:auto,flashinfer:fp8_e4m3,inkling:mxfp8,inkling:auto"
    static_help = "the server's static memory (weights + KV pool); 6.4 GiB is 0.08 of an H100"

    parse_config = staticmethod(parse_config)
    workload_args = staticmethod(workload_args)
    run_workload = staticmethod(run_workload)

    @staticmethod
    def memory(args, total_bytes: int) -> dict:
        return {"static_gib": args.static_gib, "mem_fraction_static": mem_fraction(args.static_gib, total_bytes)}

    @staticmethod
    def server(config: dict, args, memory: dict, extra: list[str], log: Path, timeout_s: float) -> Server:
        return Server(server_args(config, args.model, memory["mem_fraction_static"], extra), log, dict(os.environ),
                      timeout_s)

    @staticmethod
    def after_start(log: Path) -> dict:
        return {}


def run(args, extra: list[str], properties=gpu_properties, harness=Harness) -> None:
    configs = [harness.parse_config(spec) for spec in args.configs.split(",")]
    workloads = args.workloads.split(",")
    for workload in workloads:
        harness.workload_args(workload)  # raises on an unknown name before any server starts
    for flag in ("static_gib", "budget_s", "startup_timeout"):
        if getattr(args, flag) <= 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    out = args.out.resolve()  # absolute: the client runs in /tmp
    runs = out / "runs.jsonl"
    if runs.exists():
        raise ValueError(f"--out: {out} already holds runs.jsonl (one folder per run)")
    started = time.monotonic()
    total_bytes, device = properties()
    memory = harness.memory(args, total_bytes)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Path(args.tokenizer).resolve()

    def record(line: dict) -> None:
        with open(runs, "a") as f:
            f.write(json.dumps(line) + "\n")

    for config in configs:
        head = {"label": args.label, "device": device, **memory,
                "config": config["name"], "backend": config["backend"], "kv": config["kv"], "tag": config["tag"]}
        left = args.budget_s - (time.monotonic() - started)
        if left < harness.min_config_s:
            record({**head, "skipped": f"{left:.0f} s of the {args.budget_s:.0f} s budget left, a config needs "
                                       f"{harness.min_config_s} s"})
            continue
        log = out / f"server_{config['name']}.log"
        server = harness.server(config, args, memory, extra, log, min(args.startup_timeout, left))
        try:
            try:
                head["startup_s"] = server.start()
            except RuntimeError as exc:  # exited or not healthy in time: recorded with the log's end
                record({**head, "error": str(exc), "server_log_tail": tail(log)})
                continue
            facts = harness.after_start(log)
            for workload in workloads:
                left = args.budget_s - (time.monotonic() - started)
                if left <= 0:
                    record({**head, "workload": workload, "skipped": "the budget is spent"})
                    continue
                line = harness.run_workload(server, head, facts, workload, args, tokenizer, out, left)
                record({**head, **line})
                print(f"{config['name']} {workload}: {line.get('error') or 'ok'}, "
                      f"{(line.get('result') or {}).get('output_throughput', 0):.0f} output tok/s", flush=True)
        finally:
            server.stop()


# --- summarize -------------------------------------------------------------------------------------------------------
COLUMNS = [("config", "config", None), ("KV", "kv", None), ("pool tokens", "pool_tokens", "{:,}"),
           ("workload", "workload", None), ("output tok/s", "output_tok_s", "{:,.0f}"),
           ("x FlashInfer bf16", "x_fi_bf16", "{:.2f}"), ("x FlashInfer fp8", "x_fi_fp8", "{:.2f}"),
           ("total tok/s", "total_tok_s", "{:,.0f}"), ("TTFT p50 ms", "ttft_p50_ms", "{:.0f}"),
           ("ITL p50 ms", "itl_p50_ms", "{:.2f}"), ("ITL p99 ms", "itl_p99_ms", "{:.1f}"),
           ("peak running", "peak_running", "{}"), ("eager decode share", "eager_decode_share", "{:.1%}"),
           ("duration s", "duration_s", "{:.1f}")]


def summary_row(record: dict) -> dict:
    result, log = record.get("result") or {}, record.get("server_log") or {}
    note = f"skipped: {record['skipped']}" if "skipped" in record else record.get("error")
    return {"config": record["backend"] + (f":{record['tag']}" if record.get("tag") else ""),
            "name": record["config"], "backend": record["backend"], "kv": record["kv"], "tag": record.get("tag", ""),
            "workload": record.get("workload"), "pool_tokens": result.get("token_capacity"),
            "output_tok_s": result.get("output_throughput"), "x_fi_bf16": None, "x_fi_fp8": None,
            "total_tok_s": result.get("total_throughput"), "ttft_p50_ms": result.get("median_ttft_ms"),
            "itl_p50_ms": result.get("median_itl_ms"), "itl_p99_ms": result.get("p99_itl_ms"),
            "peak_running": log.get("peak_running_req"), "eager_decode_share": log.get("eager_decode_share"),
            "duration_s": result.get("duration"), "startup_s": record.get("startup_s"), "note": note}


def flashinfer_peer(row: dict) -> str | None:
    """Which FlashInfer peer a row is (SGLang's ``flashinfer`` or vLLM's ``FLASHINFER``), untagged only."""
    if row["backend"].lower() != "flashinfer" or row["tag"]:
        return None
    return "bf16" if row["kv"] in FI_BF16_KV else "fp8" if row["kv"] in ("fp8_e4m3", "fp8") else None


def summarize_run_dir(run_dir: Path) -> dict:
    records = [json.loads(line) for line in (run_dir / "runs.jsonl").read_text().splitlines() if line.strip()]
    if not records:
        raise ValueError(f"RUN_DIR: {run_dir / 'runs.jsonl'} has no lines")
    rows = [summary_row(r) for r in records]
    peers = {(row["workload"], flashinfer_peer(row)): row["output_tok_s"] for row in rows
             if flashinfer_peer(row) and row["output_tok_s"]}
    for row in rows:
        for peer in ("bf16", "fp8"):
            base = peers.get((row["workload"], peer))
            row[f"x_fi_{peer}"] = row["output_tok_s"] / base if base and row["output_tok_s"] is not None else None
    order = list(dict.fromkeys(row["workload"] for row in rows))  # workloads in run order, configs within each
    rows.sort(key=lambda row: (row["workload"] is None, order.index(row["workload"])))  # skipped configs last
    head = records[0]
    memory = head.get("memory") or (f"`--mem-fraction-static {head['mem_fraction_static']}` "
                                     f"({head['static_gib']} GiB of the card)")
    return {"run_dir": str(run_dir), "device": head["device"], "label": head.get("label"),
            "static_gib": head.get("static_gib"), "mem_fraction_static": head.get("mem_fraction_static"),
            "memory": memory, "rows": rows}


def table_markdown(table: dict) -> str:
    label = f", {table['label']}" if table["label"] else ""
    lines = [f"### {Path(table['run_dir']).name}: {table['device']}{label}",
             "", table["memory"], "",
             "| " + " | ".join(c[0] for c in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    notes = []
    for row in table["rows"]:
        cells = [("-" if row[key] is None else fmt.format(row[key]) if fmt else str(row[key]))
                 for _, key, fmt in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
        if row["note"]:
            notes.append(f"- {row['config']} {row['kv']}, {row['workload'] or 'all workloads'}: {row['note']}")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def plot(tables: list[dict], path: Path) -> bool:
    try:
        import matplotlib
    except ImportError:
        print(f"{path.name} not written: matplotlib is not importable here")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, dict[float, dict]] = {}
    for table in tables:
        for row in table["rows"]:
            rate = workload_rate(row["workload"])
            if rate is not None and row["output_tok_s"] is not None:
                label = f"{row['config']} {row['kv']}" + (f" ({Path(table['run_dir']).name})" if len(tables) > 1
                                                          else "")
                series.setdefault(label, {})[rate] = row
    rates = sorted({rate for by_rate in series.values() for rate in by_rate})  # inf (short) sorts last
    if not rates:
        print(f"{path.name} not written: no rate<R> or short workload with a result")
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, by_rate in series.items():
        xs = sorted(by_rate)
        axes[0].plot([rates.index(x) for x in xs], [by_rate[x]["output_tok_s"] for x in xs], marker="o", label=label)
        axes[1].plot([rates.index(x) for x in xs], [by_rate[x]["itl_p99_ms"] for x in xs], marker="o", label=label)
    for ax, ylabel in zip(axes, ("output tokens/s", "ITL p99 (ms)")):
        ax.set_xticks(range(len(rates)), ["inf" if math.isinf(r) else f"{r:g}" for r in rates])
        ax.set_xlabel("request rate (requests/s)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Served throughput against request rate (" + ", ".join(sorted({t["device"] for t in tables})) + ")")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def summarize(run_dirs: list[Path], out: Path) -> list[dict]:
    tables = [summarize_run_dir(run_dir) for run_dir in run_dirs]
    out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(table_markdown(table) for table in tables)
    (out / "table.md").write_text(text)
    (out / "summary.json").write_text(json.dumps(tables, indent=1) + "\n")
    plot(tables, out / "served.png")
    print(text, end="")
    return tables


def main(argv=None, harness=Harness, description: str = __doc__) -> int:
    argv, extra = split_server_argv(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="servers and the client, on the GPU machine")
    run_parser.add_argument("--model", required=True)
    run_parser.add_argument("--tokenizer", required=True)
    run_parser.add_argument("--configs", default=harness.default_configs)
    run_parser.add_argument("--workloads", default="short,long")
    run_parser.add_argument("--out", type=Path, required=True)
    run_parser.add_argument("--static-gib", type=float, default=6.4, help=harness.static_help)
    run_parser.add_argument("--budget-s", type=float, default=540.0)
    run_parser.add_argument("--startup-timeout", type=float, default=300.0)
    run_parser.add_argument("--label", default=None)
    sum_parser = sub.add_parser("summarize", help="table.md, summary.json, served.png from runs.jsonl folders")
    sum_parser.add_argument("run_dirs", type=Path, nargs="+")
    sum_parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args, extra, harness=harness)
    else:
        if extra:
            raise ValueError(f"summarize: takes no server arguments after --, got {extra}")
        summarize(args.run_dirs, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
