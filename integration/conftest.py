"""Integration tests against the real SGLang 0.5.23 server on a CPU (marked ``integration``).

Models are prepared once (``demo.models``, cache dir ``$INKLING_CACHE_DIR`` or
``~/.cache/sglang-inkling-backend/models``). Each server configuration is started at most once per session on a
loopback port, runs the whole workload (``workloads.py``) and is stopped before the next one starts (bounded
start-up, always stopped, even when a test fails). The measured numbers are printed at the end and written to
``$INKLING_INTEGRATION_RESULTS`` (default ``integration/results/last_run.json``).
"""
import importlib.util
import json
import os
import signal
import time
from pathlib import Path

import pytest

from demo.cpu_host import cpu_env
from demo.models import prepare_model
from demo.server import SGLangServer, stop_running_servers
from workloads import TEACHER_FORCED_CHUNK, TeacherForcedRun, WorkloadRun, run_workload, score_teacher_forced

from harness import (FAULT_PLUGIN_DIR, HERE, MAX_TOTAL_TOKENS, REPORT, RESULTS_PATH, SPECULATION, STARTUP_TIMEOUT_S,
                     fault_name, record_run, refused_startup_log, run_log_path, run_name, serve)


SGLANG_MISSING = importlib.util.find_spec("sglang") is None


def _stop_servers_on_sigterm(signum, frame):
    """A SIGTERM (a CI timeout, ``kill``) would end pytest without its teardown and leave the servers it started
    running in their own process groups: stop them, then exit as SIGTERM would."""
    stop_running_servers()
    raise SystemExit(128 + signum)


signal.signal(signal.SIGTERM, _stop_servers_on_sigterm)


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="SGLang is not installed (scripts/setup.sh installs it): the integration tests "
                                   "run the real server")
    for item in items:
        parents = Path(str(item.fspath)).resolve().parents
        if HERE in parents:
            item.add_marker(pytest.mark.integration)
            if SGLANG_MISSING and HERE / "vllm_host" not in parents:  # vllm_host/: vLLM's server (own conftest)
                item.add_marker(skip)


def work_unit(nodeid: str) -> str:
    """The pytest-xdist work unit of a test: all integration tests are one unit, every other test its own."""
    return "integration" if nodeid.startswith("integration/") else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (`scripts/test.sh -n 2 ARGS`) the integration tests run in one worker, in order: one real
    server at a time (two at once took about 3x as long each: integration/results/README.md), each configuration
    started once (its session fixtures live in that worker); the unit tests share the other workers. (A scheduler, not
    ``xdist_group`` marks: with pytest 9, xdist 3.8's group suffix on ``_nodeid`` no longer reaches ``nodeid``.)"""
    from xdist.scheduler import LoadScopeScheduling

    class HostScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return HostScopes(config, log)


def pytest_sessionfinish(session):
    """In a pytest-xdist worker: hand the numbers this worker measured to the controller, which prints them."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["inkling_report"] = json.dumps(REPORT)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """In the pytest-xdist controller: merge a finished worker's numbers into this process's REPORT."""
    theirs = json.loads(getattr(node, "workeroutput", {}).get("inkling_report", "{}"))
    runs = theirs.pop("runs", None)
    if runs:
        REPORT.setdefault("runs", {}).update(runs)
    REPORT.update(theirs)


def pytest_terminal_summary(terminalreporter):
    if not REPORT or getattr(terminalreporter.config, "workeroutput", None) is not None:
        return
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    REPORT["written_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    RESULTS_PATH.write_text(json.dumps(REPORT, indent=1, sort_keys=True))
    terminalreporter.section("inkling integration numbers")
    for key in sorted(k for k in REPORT if k != "runs"):
        terminalreporter.write_line(f"{key}: {json.dumps(REPORT[key])}")
    for name, run in sorted(REPORT.get("runs", {}).items()):
        terminalreporter.write_line(f"run {name}: start-up {run['startup_s']:.1f} s, decode {run['per_token_ms']:.1f} "
                                    f"ms/token, 1-token request {run['prefill_ms']:.0f} ms")
    terminalreporter.write_line(f"written to {RESULTS_PATH}")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    prepared = {}

    def get(name: str) -> Path:
        if name not in prepared:
            prepared[name] = prepare_model(name, progress=lambda msg: print(f"[models] {msg}", flush=True))
        return prepared[name]
    return get


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sglang-logs")




@pytest.fixture(scope="session")
def workload(model_dir, server_logs):
    """``workload(model, backend, kv_cache_dtype='auto', tp=1, fault=False, spec=None) -> WorkloadRun``, each
    configuration served once. ``fault=True`` (or a name of ``harness.FAULTS``) serves it with the test-only fault
    plugin (``fault_plugin/``) loaded; ``spec`` (a key of ``harness.SPECULATION``) with speculative decoding."""
    done: dict[str, WorkloadRun | BaseException] = {}

    def get(model: str, backend: str, kv: str = "auto", tp: int = 1, fault: bool | str = False,
            spec: str | None = None) -> WorkloadRun:
        name = run_name(model, backend, kv, tp, fault, spec)
        if name not in done:
            env = None
            if fault_name(fault) is not None:
                env = {"PYTHONPATH": os.pathsep.join([str(FAULT_PLUGIN_DIR), cpu_env()["PYTHONPATH"]]),
                       "INKLING_FAULT": fault_name(fault)}
            server = SGLangServer(model_dir(model), backend, kv, tp_size=tp, max_total_tokens=MAX_TOTAL_TOKENS,
                                  extra_args=SPECULATION[spec] if spec else (),
                                  log_path=run_log_path(server_logs, model, backend, kv, tp, fault, spec),
                                  env_overrides=env, startup_timeout_s=STARTUP_TIMEOUT_S)
            config = {"model": model, "backend": backend, "kv": kv, "tp": tp, "fault": fault, "spec": spec}
            done[name] = serve(server, lambda srv: run_workload(srv, config))
            if isinstance(done[name], WorkloadRun):
                record_run(name, done[name])
        run = done[name]
        if isinstance(run, BaseException):
            pytest.fail(f"{name}: {run}", pytrace=False)
        return run
    return get


@pytest.fixture(scope="session")
def teacher_forced(model_dir, server_logs):
    """``teacher_forced(model, kv_cache_dtype) -> TeacherForcedRun``: the teacher-forced text scored by an inkling
    server of its own with chunked prefill (``workloads.TEACHER_FORCED_CHUNK``), each configuration once."""
    done: dict[str, TeacherForcedRun | BaseException] = {}

    def get(model: str, kv: str) -> TeacherForcedRun:
        name = f"{model}/inkling-chunked-{TEACHER_FORCED_CHUNK}/{kv}"
        if name not in done:
            server = SGLangServer(model_dir(model), "inkling", kv, max_total_tokens=MAX_TOTAL_TOKENS,
                                  extra_args=("--chunked-prefill-size", str(TEACHER_FORCED_CHUNK)),
                                  log_path=server_logs / (name.replace("/", "-") + ".log"),
                                  startup_timeout_s=STARTUP_TIMEOUT_S)
            config = {"model": model, "backend": "inkling", "kv": kv, "chunked_prefill": TEACHER_FORCED_CHUNK}
            done[name] = serve(server, lambda srv: score_teacher_forced(srv, config))
            if isinstance(done[name], TeacherForcedRun):
                REPORT.setdefault("teacher_forced_runs", {})[name] = {"score_s": round(done[name].text_score_s, 1)}
        run = done[name]
        if isinstance(run, BaseException):
            pytest.fail(f"{name}: {run}", pytrace=False)
        return run
    return get


@pytest.fixture(scope="session")
def failed_startup(model_dir, server_logs):
    """``failed_startup(model_path, backend, kv, tp=1, extra_args=(), env=None) -> log text`` of a server that must
    refuse to start; fails the test if it becomes healthy."""
    def start(model_path, backend: str, kv: str = "auto", tp: int = 1, extra_args=(), env=None) -> str:
        name = f"expected-failure-{backend}-{kv}-tp{tp}-{len(os.listdir(server_logs))}"
        server = SGLangServer(model_path, backend, kv, tp_size=tp, max_total_tokens=MAX_TOTAL_TOKENS,
                              extra_args=tuple(extra_args), env_overrides=env,
                              log_path=server_logs / f"{name}.log", startup_timeout_s=STARTUP_TIMEOUT_S)
        return refused_startup_log(server)
    return start
