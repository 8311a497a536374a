"""CPU checks of the vLLM served-throughput harness (gpu_tests/vllm/serve_bench.py, issue #64 item 1): no GPU, no
server. Its workloads draw from the SGLang harness's length ranges, one KV pool size for every config, the run loop
with a stand-in server and client (records in the SGLang harness's format, ratios against vLLM's FLASHINFER), and the
client's arguments against vLLM's own parser where vLLM is installed (the server's: gpu_tests/vllm/check_bundle_cpu.sh)."""
import importlib.util
import json
import math
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "gpu_tests"
spec = importlib.util.spec_from_file_location("vllm_harness_serve_bench", HARNESS / "vllm" / "serve_bench.py")
vb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vb)
sglang_bench = vb.sglang_bench

H100 = "NVIDIA H100 80GB HBM3"
# vLLM 0.33's start-up line (vllm/v1/core/kv_cache_utils.py: "%s KV cache size: %s tokens, ...") and its periodic
# stats line (vllm/v1/metrics/loggers.py), as they print
KV_LINE = ("(EngineCore pid=812) INFO 12-08 02:10:11 [kv_cache_utils.py:1148] GPU KV cache size: 1,473,024 tokens, "
           "Maximum concurrency for 40,960 tokens per request: 35.96x\n")
STATS = ("(APIServer pid=790) INFO 12-08 02:11:{:02d} [loggers.py:285] Engine 000: Avg prompt throughput: 9120.4 "
         "tokens/s, Avg generation throughput: 18702.1 tokens/s, Running: {} reqs, Waiting: 0 reqs, GPU KV cache "
         "usage: 41.2%, Prefix cache hit rate: 0.0%\n")
# vllm bench serve's saved result (names as vLLM 0.33 writes them; fewer keys)
RESULT = {"date": "20261208-021130", "backend": "vllm", "duration": 14.2, "completed": 600, "num_prompts": 600,
          "request_rate": "inf", "output_throughput": 8123.5, "total_token_throughput": 41750.0,
          "median_ttft_ms": 2600.0, "median_itl_ms": 28.5, "p99_itl_ms": 120.0, "ignore_eos": True}


def sglang_range(args: list[str], which: str) -> tuple[int, int]:
    """SGLang's random-ids draw: [ratio x L, L]."""
    length = int(args[args.index(f"--random-{which}-len") + 1])
    return math.floor(float(args[args.index("--random-range-ratio") + 1]) * length), length


def vllm_range(args: list[str], which: str) -> tuple[int, int]:
    """vLLM 0.33's draw (vllm/benchmarks/datasets/utils.py get_sampling_params, no special tokens)."""
    mean, ratio = int(args[args.index(f"--random-{which}-len") + 1]), float(args[args.index("--random-range-ratio") + 1])
    return math.floor(mean * (1 - ratio)), math.ceil(mean * (1 + ratio))


@pytest.mark.parametrize("workload", ["short", "long", "capacity", "rate16"])
def test_every_random_workload_draws_from_the_sglang_harness_range(workload):
    ours, theirs = vb.workload_args(workload), sglang_bench.workload_args(workload)
    for which in ("input", "output"):
        assert vllm_range(ours, which) == sglang_range(theirs, which), which
    for flag in ("--num-prompts", "--request-rate"):
        assert ours[ours.index(flag) + 1] == theirs[theirs.index(flag) + 1]


def test_the_range_check_fails_on_a_wrong_ratio():
    wrong = [a if a != f"{vb.RANGE_RATIO:.6f}" else "0.5" for a in vb.workload_args("short")]
    assert vllm_range(wrong, "input") != sglang_range(sglang_bench.workload_args("short"), "input")


def test_one_pool_size_for_every_config(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    assert vb.kv_pool_bytes(6.4, vb.weight_bytes(tmp_path)) == int(6.4 * 2**30) - 1000
    with pytest.raises(ValueError, match="--static-gib"):
        vb.kv_pool_bytes(0.5, 2**30)
    with pytest.raises(ValueError, match="--model"):
        vb.weight_bytes(tmp_path / "none")


def test_bad_configs_and_workloads_name_the_argument():
    for spec_ in ("CUSTOM", "CUSTOM:bf16", ":mxfp8", "CUSTOM:mxfp8:x"):
        with pytest.raises(ValueError, match="--configs"):
            vb.parse_config(spec_)
    with pytest.raises(ValueError, match="--workloads"):
        vb.workload_args("rate0")
    assert vb.parse_config("FLASHINFER:fp8") == {"name": "FLASHINFER_fp8", "backend": "FLASHINFER", "kv": "fp8",
                                                  "tag": ""}


def test_server_log_lines():
    assert vb.token_capacity("before\n" + KV_LINE) == 1473024 and vb.token_capacity("nothing") is None
    text = "".join(STATS.format(s, n) for s, n in ((1, 12), (11, 600), (21, 341)))
    assert vb.log_window_stats(text) == {"peak_running_req": 600}
    assert vb.log_window_stats("") == {"peak_running_req": None}


class FakeServer:
    started: list = []

    def __init__(self, args_list, log_path, env, timeout_s, launcher):
        self.args, self.log_path, self.launcher, self.stopped = args_list, log_path, launcher, False
        self.url = "http://127.0.0.1:31002"
        FakeServer.started.append(self)

    def start(self):
        self.log_path.write_text(KV_LINE + STATS.format(0, 900))  # start-up: outside every workload's window
        return 61.0

    def stop(self):
        self.stopped = True


def run_args(tmp_path, **over):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "model.safetensors").write_bytes(b"\0" * 2**20)
    args = dict(model=model, tokenizer=str(tmp_path), configs="FLASHINFER:auto,FLASHINFER:fp8,CUSTOM:mxfp8",
                workloads="short", out=tmp_path / "serve", static_gib=6.4, budget_s=540.0, startup_timeout=300.0,
                label=None)
    args.update(over)
    return Namespace(**args)


def test_run_loop_with_a_stand_in_server_and_client_and_its_table(tmp_path, monkeypatch):
    servers = FakeServer.started = []
    throughput = {"FLASHINFER_auto": 6000.0, "FLASHINFER_fp8": 8000.0, "CUSTOM_mxfp8": 8400.0}

    def fake_client(cmd, env, stdout, stderr, stdin, cwd, timeout):
        assert cmd[1:] [:len(vb.CLIENT)] == vb.CLIENT and cwd == "/tmp" and timeout <= 540
        name = servers[-1].log_path.stem.removeprefix("server_")
        result = dict(RESULT, output_throughput=throughput[name])
        out = Path(cmd[cmd.index("--result-dir") + 1]) / cmd[cmd.index("--result-filename") + 1]
        out.write_text(json.dumps(result))
        with open(servers[-1].log_path, "a") as log:
            log.write(STATS.format(30, 600))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(vb, "Server", FakeServer)
    monkeypatch.setattr(sglang_bench.subprocess, "run", fake_client)
    vb.run(run_args(tmp_path), ["--max-num-seqs", "1024"], properties=lambda: (81559 * 2**20, H100))
    pool = int(6.4 * 2**30) - 2**20
    assert all(s.stopped and s.launcher == vb.VLLM_LAUNCHER for s in servers) and len(servers) == 3
    assert servers[2].args == [str(tmp_path / "model"), "--attention-backend", "CUSTOM", "--kv-cache-dtype", "mxfp8",
                               "--dtype", "bfloat16", "--kv-cache-memory-bytes", str(pool), "--seed", "0",
                               "--max-num-seqs", "1024"]
    lines = [json.loads(line) for line in (tmp_path / "serve" / "runs.jsonl").read_text().splitlines()]
    assert {line["kv_cache_memory_bytes"] for line in lines} == {pool}
    # the start-up stats line (900 running) is outside the window; vLLM's total_token_throughput is renamed
    assert [line["server_log"]["peak_running_req"] for line in lines] == [600, 600, 600]
    assert lines[2]["result"]["total_throughput"] == 41750.0 and lines[2]["result"]["token_capacity"] == 1473024
    table = sglang_bench.summarize([tmp_path / "serve"], tmp_path / "sum")[0]
    custom = [row for row in table["rows"] if row["backend"] == "CUSTOM"][0]
    assert custom["x_fi_bf16"] == pytest.approx(1.4) and custom["x_fi_fp8"] == pytest.approx(1.05)
    text = (tmp_path / "sum" / "table.md").read_text()
    assert f"`--kv-cache-memory-bytes {pool}` for every config" in text and "| 1.40 | 1.05 |" in text


def test_a_failed_client_is_recorded_and_the_server_stopped(tmp_path, monkeypatch):
    servers = FakeServer.started = []

    def failing_client(cmd, env, stdout, stderr, stdin, cwd, timeout):
        stdout.write(b"Traceback ...\naiohttp.ClientConnectorError\n")
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(vb, "Server", FakeServer)
    monkeypatch.setattr(sglang_bench.subprocess, "run", failing_client)
    vb.run(run_args(tmp_path, configs="CUSTOM:mxfp8"), [], properties=lambda: (81559 * 2**20, H100))
    (line,) = [json.loads(line) for line in (tmp_path / "serve" / "runs.jsonl").read_text().splitlines()]
    assert line["error"] == "client rc 1" and line["client_log_tail"][-1] == "aiohttp.ClientConnectorError"
    assert "result" not in line and servers[0].stopped


PARSE_FOR_REAL = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, sys.argv[1])
import serve_bench as vb
import argparse
from vllm.benchmarks.serve import add_cli_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
print("VLLM-IMPORTED")
client = FlexibleArgumentParser()
add_cli_args(client)
out = {}
for w in sys.argv[2:]:
    a = vars(client.parse_args(vb.client_args(w, "http://127.0.0.1:1", "/m", "/t", "/tmp", "r.json")))
    out[w] = {k: a[k] for k in ("dataset_name", "num_prompts", "request_rate", "random_input_len",
                                "random_output_len", "random_range_ratio", "ignore_eos", "seed", "save_result",
                                "percentile_metrics", "metric_percentiles", "prefix_repetition_prefix_len")}
try:
    client.parse_args(vb.client_args("short", "http://127.0.0.1:1", "/m", "/t", "/tmp", "r.json") + ["--bogus-x"])
    out["bogus"] = 0
except SystemExit as e:
    out["bogus"] = e.code
print("RESULT " + json.dumps(out, default=str))
"""


def test_every_workload_parses_with_vllms_own_client_parser():
    """The server's arguments need vLLM 0.33's CUDA platform and the plugin's mxfp8: check_bundle_cpu.sh parses them."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed in this environment")
    workloads = ["short", "long", "capacity", "prefix", "rate16"]
    proc = subprocess.run([sys.executable, "-c", PARSE_FOR_REAL, str(HARNESS / "vllm"), *workloads],
                          capture_output=True, text=True, timeout=600, cwd="/tmp")
    if "VLLM-IMPORTED" not in proc.stdout:
        pytest.skip(f"vllm's parsers do not import here: {proc.stderr.strip().splitlines()[-1:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    short = out["short"]
    assert (short["dataset_name"], short["num_prompts"], short["random_input_len"], short["random_output_len"]) == (
        "random", 600, 768, 192)
    assert short["ignore_eos"] is True and short["seed"] == 7 and short["save_result"] is True
    assert short["metric_percentiles"] == "50,99" and short["percentile_metrics"] == "ttft,tpot,itl"
    assert (out["prefix"]["dataset_name"], out["prefix"]["prefix_repetition_prefix_len"]) == ("prefix_repetition", 4096)
    assert float(out["rate16"]["request_rate"]) == 16.0 and out["rate16"]["num_prompts"] == 300
    assert out["bogus"] == 2  # the parser refuses a flag it does not define: the checks above can fail
