"""Shared state of the integration session (imported by conftest.py and the tests; not a test module)."""
import dataclasses
import os
from pathlib import Path

import pytest

from demo.server import ServerStartError

HERE = Path(__file__).resolve().parent
RESULTS_PATH = Path(os.environ.get("INKLING_INTEGRATION_RESULTS") or HERE / "results" / "last_run.json")
STARTUP_TIMEOUT_S = float(os.environ.get("INKLING_STARTUP_TIMEOUT_S", "300"))
MAX_TOTAL_TOKENS = 4096
# A test-only plugin (a dist-info and its module) that breaks the inkling backend; on the server's PYTHONPATH only
# in runs asked for with fault=True.
FAULT_PLUGIN_DIR = HERE / "fault_plugin"

# Numbers the tests measured, printed in the terminal summary and written to RESULTS_PATH.
REPORT: dict = {}


# Faults the test-only plugin can inject (fault=True is the first): its INKLING_FAULT values.
FAULTS = ("softmax_scale", "verify_sees_no_drafts")
# Speculative decoding a run can ask for (spec=...): SGLang's flags. NGRAM draws its drafts from the prompt and the
# output so far, in trees (SGLang's default breadth, 10).
SPECULATION = {"ngram": ("--speculative-algorithm", "NGRAM")}


def fault_name(fault: bool | str) -> str | None:
    """The plugin's fault for a run's ``fault`` argument: None, FAULTS[0] for True, or a name of FAULTS."""
    if fault is False or fault is None:
        return None
    name = FAULTS[0] if fault is True else fault
    if name not in FAULTS:
        raise ValueError(f"fault must be a bool or one of {FAULTS}, got {fault!r}")
    return name


def run_name(model: str, backend: str, kv: str, tp: int, fault: bool | str = False, spec: str | None = None) -> str:
    name = fault_name(fault)
    tag = "" if name is None else "-with-fault" if name == FAULTS[0] else f"-with-fault-{name}"
    return f"{model}/{backend}{tag}/{kv}/tp{tp}" + (f"/{spec}" if spec else "")


def run_log_path(server_logs: Path, model: str, backend: str, kv: str = "auto", tp: int = 1,
                 fault: bool | str = False, spec: str | None = None) -> Path:
    return server_logs / (run_name(model, backend, kv, tp, fault, spec).replace("/", "-") + ".log")


def run_log(server_logs: Path, model: str, backend: str, kv: str = "auto", tp: int = 1) -> str:
    return run_log_path(server_logs, model, backend, kv, tp).read_text(errors="replace")


def serve(server, work):
    """``work(server)`` on the started server, which is stopped after: its result, the ``ServerStartError`` of a
    failed start-up, or a RuntimeError carrying the server's last log lines when a request failed (each fixture
    keeps it and fails every test that asks for that configuration)."""
    try:
        with server:
            return work(server)
    except ServerStartError as err:
        return err
    except Exception as err:  # a request failed: keep the server's last words with the error
        return RuntimeError(f"{type(err).__name__}: {err}\nserver log {server.log_path}:\n"
                            f"{server.log_text()[-6000:]}")


def record_run(name: str, run) -> None:
    """A served workload's times and answers, for the terminal summary and RESULTS_PATH."""
    REPORT.setdefault("runs", {})[name] = {
        "startup_s": round(run.startup_s, 1), "per_token_ms": round(run.per_token_ms, 1),
        "prefill_ms": round(run.prefill_ms, 1),
        "answers": {k: dataclasses.asdict(v) for k, v in run.answers.items()}}


def refused_startup_log(server) -> str:
    """The log of a server that must refuse to start; fails the test if it becomes healthy."""
    try:
        server.start()
    except ServerStartError as err:
        return err.log
    server.stop()
    pytest.fail(f"{server.name} started although it should have refused: {' '.join(server.args)}")
