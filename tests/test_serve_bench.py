"""CPU checks of the served-throughput harness (gpu_tests/sglang/serve_bench.py, issue #62): no GPU, no server.

The server-log window, the client's result line, the ratios (within one run folder only), skipped configs, the run
loop with a stand-in server and client, and the workloads' arguments against sglang.benchmark.serving's own parser.
Fixture numbers are the 2026-12-07 H100 run's (bench.jsonl and server_inkling_mxfp8.log of
../shared/notes/served-h100-2026-12-07/; the short workload, 600 requests)."""
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "gpu_tests" / "sglang"
spec = importlib.util.spec_from_file_location("harness_serve_bench", HARNESS / "serve_bench.py")
sb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sb)

H100 = "NVIDIA H100 80GB HBM3"
# Before the window: the long workload's last lines; after it: a later workload's (peak 700 must not count).
LOG_BEFORE = """\
[2026-12-07 12:36:10] Decode batch, #running-req: 99, #token: 635136, token usage: 0.89, cuda graph: True, gen throughput (token/s): 7.71, #queue-req: 76
[2026-12-07 12:36:12] Prefill batch, #new-seq: 1, #new-token: 5527, #cached-token: 0, token usage: 0.01, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: True, input throughput (token/s): 243.43
"""
LOG_WINDOW = """\
[2026-12-07 12:37:02] Prefill batch, #new-seq: 10, #new-token: 7455, #cached-token: 0, token usage: 0.73, #running-req: 580, #queue-req: 0, #pending-token: 8128, cuda graph: False, input throughput (token/s): 146641.96
[2026-12-07 12:37:02] Prefill batch, #new-seq: 11, #new-token: 7550, #cached-token: 0, token usage: 0.73, #running-req: 589, #queue-req: 0, #pending-token: 578, cuda graph: False, input throughput (token/s): 127797.33
[2026-12-07 12:37:03] Triton kernel 'decode_blocks_kernel' took 1.11 s to compile after serving started. Serving-time compilation can stall the engine; pre-compile it during engine init.
[2026-12-07 12:37:03] Prefill batch, #new-seq: 1, #new-token: 578, #cached-token: 0, token usage: 0.73, #running-req: 599, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 368.54
[2026-12-07 12:37:04] Decode batch, #running-req: 600, #token: 537216, token usage: 0.75, cuda graph: False, gen throughput (token/s): 1878.79, #queue-req: 0
[2026-12-07 12:37:05] Decode batch, #running-req: 600, #token: 560128, token usage: 0.78, cuda graph: False, gen throughput (token/s): 19425.64, #queue-req: 0
[2026-12-07 12:37:07] Decode batch, #running-req: 600, #token: 586752, token usage: 0.82, cuda graph: False, gen throughput (token/s): 19463.48, #queue-req: 0
[2026-12-07 12:37:08] Decode batch, #running-req: 534, #token: 534528, token usage: 0.75, cuda graph: False, gen throughput (token/s): 18279.34, #queue-req: 0
[2026-12-07 12:37:09] Decode batch, #running-req: 337, #token: 351744, token usage: 0.49, cuda graph: False, gen throughput (token/s): 11682.15, #queue-req: 0
[2026-12-07 12:37:10] Decode batch, #running-req: 134, #token: 143744, token usage: 0.20, cuda graph: True, gen throughput (token/s): 11577.66, #queue-req: 0
[2026-12-07 12:37:10] INFO:     127.0.0.1:44610 - "GET /server_info HTTP/1.1" 200 OK
"""
LOG_AFTER = """\
[2026-12-07 12:40:00] Decode batch, #running-req: 700, #token: 1000, token usage: 0.01, cuda graph: False, gen throughput (token/s): 1.00, #queue-req: 0
"""
# The client's result line for inkling mxfp8 / short (numbers as written; server_info trimmed to where SGLang 0.5.23
# puts the pool's capacity).
RESULT_LINE = {"tag": None, "backend": "sglang", "dataset_name": "random-ids", "request_rate": math.inf,
               "max_concurrency": None, "random_input_len": 1024, "duration": 12.571374768999931, "completed": 600,
               "output_throughput": 9111.254902880593, "total_throughput": 45892.83277296617,
               "median_ttft_ms": 2421.177795999995, "median_itl_ms": 30.868287500027236,
               "p99_itl_ms": 175.51549807001152, "accept_length": None,
               "server_info": {"attention_backend": "inkling", "max_total_num_tokens": 717440, "internal_states": [
                   {"memory_usage": {"weight": 0.57, "kvcache": 5.645, "token_capacity": 717440}}]}}
# (backend, kv, workload): output tok/s, total tok/s, TTFT p50, ITL p50, ITL p99, duration, pool tokens
MEASURED = {
    ("flashinfer", "auto", "short"): (9234.240544364053, 46512.30391478352, 3628.35, 21.06, 67.74, 12.40, 369957),
    ("flashinfer", "fp8_e4m3", "short"): (15507.28226312846, 78109.23075370636, 2273.49, 21.91, 48.48, 7.39, 739915),
    ("inkling", "mxfp8", "short"): (9111.254902880593, 45892.83277296617, 2421.18, 30.87, 175.52, 12.57, 717440),
    ("inkling", "mxfp8", "long"): (9454.503961025079, 85541.06622655904, 16330.34, 5.50, 46.99, 32.39, 717440),
    ("flashinfer", "fp8_e4m3", "long"): (9682.714625836517, 87605.83701439905, 15912.17, 5.67, 36.52, 31.63, 739915),
}


def _record(backend, kv, workload, tag="", device=H100, numbers=None, server_log=None):
    out, total, ttft, itl50, itl99, duration, pool = numbers or MEASURED[(backend, kv, workload)]
    return {"label": None, "device": device, "static_gib": 6.4, "mem_fraction_static": 0.0808,
            "config": f"{backend}_{kv}" + (f"_{tag}" if tag else ""), "backend": backend, "kv": kv, "tag": tag,
            "workload": workload, "startup_s": 60.0, "server_log": server_log or sb.log_window_stats(LOG_WINDOW),
            "result": {"output_throughput": out, "total_throughput": total, "median_ttft_ms": ttft,
                       "median_itl_ms": itl50, "p99_itl_ms": itl99, "duration": duration, "token_capacity": pool}}


def _write_run(folder: Path, records) -> Path:
    folder.mkdir(parents=True)
    (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def _row(table, config, kv, workload):
    (row,) = [r for r in table["rows"] if (r["config"], r["kv"], r["workload"]) == (config, kv, workload)]
    return row


# --- the server log's window --------------------------------------------------------------------------------------
def test_log_window_counts_only_the_lines_written_during_the_workload(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(LOG_BEFORE)
    start = log.stat().st_size
    with open(log, "a") as f:
        f.write(LOG_WINDOW)
    end = log.stat().st_size
    with open(log, "a") as f:
        f.write(LOG_AFTER)
    stats = sb.log_window_stats(sb.read_window(log, start, end))
    assert stats == {"peak_running_req": 600, "decode_lines_graph": 1, "decode_lines_eager": 5,
                     "eager_decode_share": 5 / 6, "prefill_lines_graph": 0, "prefill_lines_eager": 3}
    whole = sb.log_window_stats(log.read_text())  # the control: the whole log counts other workloads' lines
    assert whole["peak_running_req"] == 700 and whole["decode_lines_graph"] == 2 and whole["prefill_lines_graph"] == 1


def test_log_window_without_decode_lines_has_no_peak_and_no_share():
    stats = sb.log_window_stats(LOG_BEFORE.splitlines()[1])
    assert stats["peak_running_req"] is None and stats["eager_decode_share"] is None
    assert (stats["decode_lines_graph"], stats["prefill_lines_graph"]) == (0, 1)


# --- the client's result line -------------------------------------------------------------------------------------
def test_result_line_keeps_numbers_and_the_pool_capacity_only():
    reduced = sb.reduce_result(json.loads(json.dumps(RESULT_LINE)))  # through JSON, as read from the file
    assert reduced["output_throughput"] == pytest.approx(9111.254902880593)
    assert reduced["p99_itl_ms"] == pytest.approx(175.51549807001152)
    assert reduced["completed"] == 600 and reduced["request_rate"] == math.inf
    assert reduced["token_capacity"] == 717440
    for dropped in ("server_info", "backend", "dataset_name", "tag", "max_concurrency", "accept_length"):
        assert dropped not in reduced
    assert sb.reduce_result({"output_throughput": 1.0, "server_info": None})["token_capacity"] is None


def test_last_json_line_reads_the_last_appended_result(tmp_path):
    path = tmp_path / "bench.jsonl"
    assert sb.last_json_line(path) is None
    path.write_text(json.dumps({"completed": 1}) + "\n" + json.dumps({"completed": 2}) + "\n\n")
    assert sb.last_json_line(path) == {"completed": 2}


# --- summarize ----------------------------------------------------------------------------------------------------
def test_ratios_are_taken_within_one_run_folder_and_a_missing_peer_is_a_dash(tmp_path, capsys):
    first = _write_run(tmp_path / "call1", [_record("flashinfer", "auto", "short"),
                                            _record("flashinfer", "fp8_e4m3", "short"),
                                            _record("inkling", "mxfp8", "short"), _record("inkling", "mxfp8", "long"),
                                            _record("flashinfer", "fp8_e4m3", "long")])
    # A second call with no FlashInfer fp8 and another FlashInfer bf16 number: its ratios must not use call1's.
    second = _write_run(tmp_path / "call2", [_record("flashinfer", "auto", "short", device="NVIDIA H200",
                                                     numbers=(4555.6, 1, 1, 1, 1, 1, 1)),
                                             _record("inkling", "mxfp8", "short", device="NVIDIA H200")])
    tables = sb.summarize([first, second], tmp_path / "out")
    ink = _row(tables[0], "inkling", "mxfp8", "short")
    assert ink["x_fi_bf16"] == pytest.approx(9111.254902880593 / 9234.240544364053)  # 0.99
    assert ink["x_fi_fp8"] == pytest.approx(9111.254902880593 / 15507.28226312846)  # 0.59
    assert _row(tables[0], "inkling", "mxfp8", "long")["x_fi_fp8"] == pytest.approx(0.97643, abs=1e-5)
    assert _row(tables[0], "inkling", "mxfp8", "long")["x_fi_bf16"] is None  # no FlashInfer bf16 long in call1
    ink2 = _row(tables[1], "inkling", "mxfp8", "short")
    assert ink2["x_fi_bf16"] == pytest.approx(9111.254902880593 / 4555.6) and ink2["x_fi_fp8"] is None
    text = (tmp_path / "out" / "table.md").read_text()
    assert "### call1: NVIDIA H100 80GB HBM3" in text and "### call2: NVIDIA H200" in text
    assert ("| inkling | mxfp8 | 717,440 | short | 9,111 | 0.99 | 0.59 | 45,893 | 2421 | 30.87 | 175.5 | 600 "
            "| 83.3% | 12.6 |") in text
    assert "| inkling | mxfp8 | 717,440 | short | 9,111 | 2.00 | - | 45,893 |" in text
    assert "| inkling | mxfp8 | 717,440 | long | 9,455 | - | 0.98 |" in text
    assert text in capsys.readouterr().out  # printed as well
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [t["device"] for t in summary] == [H100, "NVIDIA H200"]
    assert [r["workload"] for r in summary[0]["rows"]] == ["short"] * 3 + ["long"] * 2  # grouped by workload


def test_a_skipped_config_and_a_failed_client_show_dashes_and_a_note(tmp_path):
    failed = _record("inkling", "mxfp8", "short")
    del failed["result"]
    failed["error"] = "client rc 1"
    skipped = {k: v for k, v in _record("inkling", "auto", "short", numbers=MEASURED[("inkling", "mxfp8", "short")])
               .items() if k not in ("workload", "result", "server_log", "startup_s")}
    skipped["skipped"] = "62 s of the 540 s budget left, a config needs 90 s"
    run = _write_run(tmp_path / "call", [skipped, _record("flashinfer", "fp8_e4m3", "short"), failed])
    (table,) = sb.summarize([run], tmp_path / "out")
    assert [r["config"] + ":" + r["kv"] for r in table["rows"]] == ["flashinfer:fp8_e4m3", "inkling:mxfp8",
                                                                    "inkling:auto"]  # skipped last
    assert table["rows"][1]["x_fi_fp8"] is None and table["rows"][2]["output_tok_s"] is None
    text = (tmp_path / "out" / "table.md").read_text()
    assert "| inkling | auto | - | - | - | - | - | - | - | - | - | - | - | - |" in text
    assert "- inkling auto, all workloads: skipped: 62 s of the 540 s budget left, a config needs 90 s" in text
    assert "- inkling mxfp8, short: client rc 1" in text


def test_summarize_plots_rate_workloads_or_says_why_not(tmp_path, capsys):
    records = [_record("inkling", "mxfp8", "short")]
    for rate, out in ((8, 2100.0), (32, 7000.0)):
        records.append(_record("inkling", "mxfp8", f"rate{rate}", numbers=(out, 1, 1, 1, 20.0, 1, 717440)))
    run = _write_run(tmp_path / "call", records)
    sb.summarize([run], tmp_path / "out")
    if importlib.util.find_spec("matplotlib") is None:
        assert "served.png not written: matplotlib is not importable here" in capsys.readouterr().out
        assert not (tmp_path / "out" / "served.png").exists()
    else:
        assert (tmp_path / "out" / "served.png").stat().st_size > 1000
    assert [sb.workload_rate(w) for w in ("rate8", "rate0.5", "short", "long")] == [8.0, 0.5, math.inf, None]


def test_an_empty_run_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="RUN_DIR"):
        sb.summarize([_write_run(tmp_path / "call", [])], tmp_path / "out")


# --- configs, memory, the run loop --------------------------------------------------------------------------------
def test_configs_and_their_tags():
    config = sb.parse_config("inkling:auto:nobcg+graph512")
    assert config["name"] == "inkling_auto_nobcg-graph512"
    assert config["tag_args"] == ["--disable-prefill-cuda-graph", "--cuda-graph-max-bs-decode", "512"]
    assert sb.parse_config("flashinfer:fp8_e4m3")["tag_args"] == [] and sb.parse_config("inkling:mxfp8:bcg")["tag"]
    for bad in ("inkling", "inkling:", ":auto", "inkling:auto:fast", "inkling:auto:nobcg+", "a:b:c:d"):
        with pytest.raises(ValueError, match="--configs"):
            sb.parse_config(bad)


def test_memory_fraction_gives_an_h100_and_an_h200_the_same_bytes():
    h100, h200 = 81559 * 2 ** 20, 143771 * 2 ** 20  # nvidia-smi's memory.total of each card, MiB
    assert (sb.mem_fraction(6.4, h100), sb.mem_fraction(6.4, h200)) == (0.0804, 0.0456)
    for total in (h100, h200):
        assert abs(sb.mem_fraction(6.4, total) * total - 6.4 * 2 ** 30) <= 0.00005 * total  # 4-decimal rounding
    with pytest.raises(ValueError, match="--static-gib"):
        sb.mem_fraction(90, h100)


def _run_args(tmp_path, **over):
    args = {"model": "/tmp/models/llama-gqa4-l16", "tokenizer": str(tmp_path), "out": tmp_path / "serve",
            "configs": "flashinfer:fp8_e4m3,inkling:mxfp8:graph512", "workloads": "short,rate16", "static_gib": 6.4,
            "budget_s": 540.0, "startup_timeout": 300.0, "label": "test"}
    return Namespace(**{**args, **over})


def test_configs_are_skipped_without_a_server_when_the_budget_is_short(tmp_path, monkeypatch):
    def no_server(*args, **kwargs):
        raise AssertionError("a server was started")

    monkeypatch.setattr(sb, "Server", no_server)
    sb.run(_run_args(tmp_path, budget_s=89.0), [], properties=lambda: (81559 * 2 ** 20, H100))
    lines = [json.loads(line) for line in (tmp_path / "serve" / "runs.jsonl").read_text().splitlines()]
    assert [line["config"] for line in lines] == ["flashinfer_fp8_e4m3", "inkling_mxfp8_graph512"]
    assert all(line["skipped"].endswith("a config needs 90 s") and line["device"] == H100 for line in lines)
    assert lines[0]["mem_fraction_static"] == 0.0804


class FakeServer:
    started: list = []

    def __init__(self, args_list, log_path, env, timeout_s):
        self.args, self.log_path, self.env, self.port, self.stopped = args_list, log_path, env, 31002, False
        FakeServer.started.append(self)

    def start(self):
        self.log_path.write_text(LOG_BEFORE)  # start-up lines: outside every workload's window
        return 42.0

    def stop(self):
        self.stopped = True


def test_run_loop_with_a_stand_in_server_and_client(tmp_path, monkeypatch):
    servers = FakeServer.started = []

    def fake_client(cmd, env, stdout, stderr, stdin, cwd, timeout):
        assert cmd[1:3] == ["-m", "sglang.benchmark.serving"] and cwd == "/tmp" and timeout <= 540
        assert env["PYTHONPATH"].split(os.pathsep)[0] == str(sb.CLIENT_STUBS)
        Path(cmd[cmd.index("--output-file") + 1]).write_text(json.dumps(RESULT_LINE) + "\n")
        with open(servers[-1].log_path, "a") as log:
            log.write(LOG_WINDOW)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(sb, "Server", FakeServer)
    monkeypatch.setattr(sb.subprocess, "run", fake_client)
    sb.run(_run_args(tmp_path), ["--chunked-prefill-size", "4096"], properties=lambda: (143771 * 2 ** 20, "H200"))
    assert all(s.stopped for s in servers) and len(servers) == 2
    assert servers[1].args == ["--model-path", "/tmp/models/llama-gqa4-l16", "--attention-backend", "inkling",
                               "--kv-cache-dtype", "mxfp8", "--dtype", "bfloat16", "--mem-fraction-static", "0.0456",
                               "--cuda-graph-max-bs-decode", "512", "--chunked-prefill-size", "4096"]
    assert str(sb.CLIENT_STUBS) not in servers[0].env.get("PYTHONPATH", "")  # the stand-in is the client's only
    lines = [json.loads(line) for line in (tmp_path / "serve" / "runs.jsonl").read_text().splitlines()]
    assert [(line["config"], line["workload"]) for line in lines] == [
        ("flashinfer_fp8_e4m3", "short"), ("flashinfer_fp8_e4m3", "rate16"),
        ("inkling_mxfp8_graph512", "short"), ("inkling_mxfp8_graph512", "rate16")]
    # the second workload's window holds only its own lines, though the first one's are in the same log before it
    assert [line["server_log"]["decode_lines_eager"] for line in lines] == [5, 5, 5, 5]
    assert lines[3]["client_args"][lines[3]["client_args"].index("--request-rate") + 1] == "16"
    assert lines[0]["result"]["token_capacity"] == 717440 and lines[0]["startup_s"] == 42.0
    assert lines[0]["client_rc"] == 0 and "error" not in lines[0] and lines[0]["tag"] == ""
    with pytest.raises(ValueError, match="--out"):  # one folder per run
        sb.run(_run_args(tmp_path), [], properties=lambda: (143771 * 2 ** 20, "H200"))


def test_a_client_that_fails_or_times_out_is_recorded_and_the_server_stopped(tmp_path, monkeypatch):
    servers = FakeServer.started = []

    def failing_client(cmd, env, stdout, stderr, stdin, cwd, timeout):
        stdout.write(b"Traceback ...\nConnectionRefusedError\n")
        if cmd[cmd.index("--request-rate") + 1] == "inf":  # short: past its timeout; rate16: rc 1
            raise subprocess.TimeoutExpired(cmd, timeout)
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(sb, "Server", FakeServer)
    monkeypatch.setattr(sb.subprocess, "run", failing_client)
    sb.run(_run_args(tmp_path, configs="inkling:mxfp8"), [], properties=lambda: (81559 * 2 ** 20, H100))
    short, rate16 = [json.loads(line) for line in (tmp_path / "serve" / "runs.jsonl").read_text().splitlines()]
    assert re.fullmatch(r"client timed out after \d+ s", short["error"]) and short["client_rc"] is None
    assert rate16["error"] == "client rc 1" and rate16["client_log_tail"][-1] == "ConnectionRefusedError"
    assert "result" not in short and "result" not in rate16 and servers[0].stopped


def test_bad_run_arguments_name_the_argument(tmp_path):
    for over, name in (({"workloads": "short,huge"}, "--workloads"), ({"workloads": "rate0"}, "--workloads"),
                       ({"budget_s": 0.0}, "--budget-s"), ({"static_gib": -1.0}, "--static-gib"),
                       ({"configs": "inkling"}, "--configs")):
        with pytest.raises(ValueError, match=name):
            sb.run(_run_args(tmp_path, **over), [], properties=lambda: (81559 * 2 ** 20, H100))


def test_the_datasets_stand_in_raises_on_use():
    stub_spec = importlib.util.spec_from_file_location("stub_datasets", sb.CLIENT_STUBS / "datasets" / "__init__.py")
    stub = importlib.util.module_from_spec(stub_spec)
    stub_spec.loader.exec_module(stub)
    with pytest.raises(NotImplementedError, match="stand-in"):
        stub.load_dataset("lmms-lab/MMMU")


# --- the workloads against sglang.benchmark.serving's parser ------------------------------------------------------
def _serving_flags() -> set[str]:
    """Every option string sglang.benchmark.serving's parser defines, read from its source (no import)."""
    found = importlib.util.find_spec("sglang")
    if found is None:
        pytest.skip("sglang is not installed in this environment")
    source = (Path(found.origin).parent / "benchmark" / "serving.py").read_text()
    return set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", source))


def _unknown_flags(args: list[str], known: set[str]) -> list[str]:
    return [a for a in args if a.startswith("--") and a not in known]


ALL_WORKLOADS = [*sb.WORKLOADS, "rate8", "rate16", "rate0.5"]


def test_every_workload_names_only_flags_the_client_defines():
    known = _serving_flags()
    assert len(known) > 50 and "--random-input-len" in known
    for workload in ALL_WORKLOADS:
        args = sb.client_args(workload, 30000, "tok", "/tmp/out.jsonl")
        assert _unknown_flags(args, known) == [], workload
    # The check fails on a flag the parser lacks, an abbreviation included (argparse would take "--random-input").
    assert _unknown_flags(["--random-input", "8", "--gsp-output-length", "4"], known) == [
        "--random-input", "--gsp-output-length"]


PARSE_FOR_REAL = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import serve_bench as sb
import sglang  # noqa: F401  (a failure here is an environment without SGLang: the test skips)
print("SGLANG-IMPORTED", flush=True)
import sglang.benchmark.serving as serving  # imports sglang.benchmark.datasets: the datasets stand-in must serve
parsed = {}
serving.run_benchmark = lambda args: parsed.update(vars(args))
out = {}
for workload in sys.argv[2:]:
    parsed.clear()
    sys.argv = ["serving", *sb.client_args(workload, 30000, "tok", "/tmp/out.jsonl")]
    serving.cli_main()
    out[workload] = {k: parsed[k] for k in ("dataset_name", "num_prompts", "random_input_len", "random_output_len",
        "random_range_ratio", "request_rate", "seed", "flush_cache", "warmup_requests", "disable_tqdm",
        "gsp_num_groups", "gsp_prompts_per_group", "gsp_system_prompt_len", "gsp_question_len", "gsp_output_len")}
sys.argv = ["serving", "--backend", "sglang", "--random-input-length", "8"]
try:
    serving.cli_main()
    out["bogus"] = "accepted"
except SystemExit as exc:
    out["bogus"] = exc.code
import argparse
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import ServerArgs
load_plugins()  # registers the inkling attention backend, as the server does at start-up
server_parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(server_parser)
config = sb.parse_config("inkling:mxfp8:nobcg+graph512")
server = server_parser.parse_args(sb.server_args(config, "/tmp/m", 0.0456, []))
out["server"] = {k: getattr(server, k) for k in ("attention_backend", "kv_cache_dtype", "mem_fraction_static",
    "disable_prefill_cuda_graph", "cuda_graph_max_bs_decode", "dtype")}
print("RESULT " + json.dumps(out))
"""


def test_every_workload_parses_with_the_real_client_parser():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed in this environment")
    from sglang_inkling_backend.hosts.sglang.cpu_testing import shims_dir

    env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", PYTHONPATH=os.pathsep.join(
        [str(sb.CLIENT_STUBS), str(shims_dir() / "pythonpath")]))  # the stand-in first, as on the GPU machine
    proc = subprocess.run([sys.executable, "-c", PARSE_FOR_REAL, str(HARNESS), *ALL_WORKLOADS], env=env,
                          capture_output=True, text=True, timeout=300, cwd="/tmp")
    if "SGLANG-IMPORTED" not in proc.stdout:
        pytest.skip(f"sglang does not import here: {proc.stderr.strip().splitlines()[-1:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    short = out["short"]
    assert (short["dataset_name"], short["num_prompts"], short["random_input_len"], short["random_output_len"]) == (
        "random-ids", 600, 1024, 256)
    assert short["random_range_ratio"] == 0.5 and short["request_rate"] == math.inf and short["seed"] == 7
    assert short["flush_cache"] is True and short["warmup_requests"] == 1 and short["disable_tqdm"] is True
    assert (out["long"]["random_input_len"], out["long"]["random_output_len"], out["long"]["num_prompts"]) == (
        8192, 1024, 400)
    assert (out["capacity"]["random_input_len"], out["capacity"]["num_prompts"]) == (32768, 96)
    prefix = out["prefix"]
    assert prefix["dataset_name"] == "generated-shared-prefix"
    assert [prefix[k] for k in ("gsp_num_groups", "gsp_prompts_per_group", "gsp_system_prompt_len",
                                "gsp_question_len", "gsp_output_len")] == [16, 32, 4096, 256, 256]
    assert (out["rate16"]["request_rate"], out["rate16"]["num_prompts"]) == (16.0, 300)
    assert out["rate0.5"]["request_rate"] == 0.5
    assert out["bogus"] == 2  # the parser refuses a flag it does not define: the check above can fail
    assert out["server"] == {"attention_backend": "inkling", "kv_cache_dtype": "mxfp8", "mem_fraction_static": 0.0456,
                             "disable_prefill_cuda_graph": True, "cuda_graph_max_bs_decode": 512,
                             "dtype": "bfloat16"}
