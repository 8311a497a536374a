"""Shared state of the integration session (imported by conftest.py and the tests; not a test module)."""
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS_PATH = Path(os.environ.get("INKLING_INTEGRATION_RESULTS") or HERE / "results" / "last_run.json")
STARTUP_TIMEOUT_S = float(os.environ.get("INKLING_STARTUP_TIMEOUT_S", "300"))
MAX_TOTAL_TOKENS = 4096
# A test-only plugin (a dist-info and its module) that breaks the inkling backend; on the server's PYTHONPATH only
# in runs asked for with fault=True.
FAULT_PLUGIN_DIR = HERE / "fault_plugin"

# Numbers the tests measured, printed in the terminal summary and written to RESULTS_PATH.
REPORT: dict = {}


def run_name(model: str, backend: str, kv: str, tp: int, fault: bool = False) -> str:
    return f"{model}/{backend}{'-with-fault' if fault else ''}/{kv}/tp{tp}"


def run_log_path(server_logs: Path, model: str, backend: str, kv: str = "auto", tp: int = 1,
                 fault: bool = False) -> Path:
    return server_logs / (run_name(model, backend, kv, tp, fault).replace("/", "-") + ".log")


def run_log(server_logs: Path, model: str, backend: str, kv: str = "auto", tp: int = 1) -> str:
    return run_log_path(server_logs, model, backend, kv, tp).read_text(errors="replace")
