"""Start the real SGLang server (``python -m sglang.launch_server``) on a CPU, talk to it, and always stop it.
``ServerProcess`` is the part every host's server shares (``vllm_server.py`` is the other).

The server runs in its own process group with its output in a log file; start-up is bounded by a timeout and a
server that dies during start-up raises with the tail of its log (SGLang SIGKILLs its own tree when a child fails,
so the exit code alone says little). A log file the server made itself (no ``log_path`` given) is removed by
``stop()``, except after a failed start-up, whose error names it.
"""
import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from sglang_inkling_backend.checks import require_int_value

from .cpu_host import cpu_env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerStartError(RuntimeError):
    def __init__(self, message: str, log: str):
        super().__init__(message)
        self.log = log


_RUNNING: dict[int, "ServerProcess"] = {}  # id -> server whose process group may still be alive


def stop_running_servers() -> None:
    """Stop every server this process started and has not stopped (atexit; a SIGTERM handler may call it too)."""
    for server in list(_RUNNING.values()):
        server.stop(grace_s=5.0)


atexit.register(stop_running_servers)


class ServerProcess:
    """A server process on 127.0.0.1 (``args``, ``env``, ``port`` set by the subclass, its log by ``_use_log``)
    with a ``/health`` endpoint. Use as a context manager, or ``start()`` / ``stop()``."""

    name = "server"
    port: int
    args: list
    env: dict
    log_path: Path
    owns_log: bool
    startup_timeout_s: float
    cwd = None  # the server's working directory (None: ours)
    process = None
    startup_seconds = None

    def _use_log(self, log_path: Path | None, prefix: str) -> None:
        """Log to ``log_path``, or to a temporary file (``prefix``...) that ``stop()`` removes unless start-up
        failed."""
        self.owns_log = log_path is None
        self.log_path = Path(log_path) if log_path is not None else temporary_log(prefix)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def start(self, on_wait: Callable[[float], None] | None = None) -> "ServerProcess":
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            cwd=self.cwd)
        _RUNNING[id(self)] = self
        deadline = started + self.startup_timeout_s
        while True:
            if self.process.poll() is not None:
                log = self.log_text()
                self.owns_log = False  # the error names the log: keep it
                self.stop()
                raise ServerStartError(f"{self.name} exited with rc {self.process.returncode} during start-up "
                                       f"(log {self.log_path}):\n{log[-6000:]}", log)
            if self._healthy():
                self.startup_seconds = time.monotonic() - started
                return self
            if time.monotonic() > deadline:
                log = self.log_text()
                self.owns_log = False  # the error names the log: keep it
                self.stop()
                raise ServerStartError(f"{self.name} not healthy after {self.startup_timeout_s:.0f} s "
                                       f"(log {self.log_path}):\n{log[-6000:]}", log)
            if on_wait is not None:
                on_wait(time.monotonic() - started)
            time.sleep(0.5)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the server's process group, then SIGKILL whatever is left after ``grace_s``; remove a temporary
        log (see ``owns_log``)."""
        try:
            self._stop_process(grace_s)
            _RUNNING.pop(id(self), None)
        finally:
            if self.owns_log:
                self.log_path.unlink(missing_ok=True)

    def _stop_process(self, grace_s: float) -> None:
        if self.process is None:
            return
        pgid = self.process.pid  # start_new_session: the server leads its own group
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
            # The leader is gone; make sure no child (scheduler, engine core, worker) is left in the group.
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _post(self, path: str, body: dict, timeout_s: float) -> dict:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())


def temporary_log(prefix: str) -> Path:
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".log")
    os.close(fd)
    return Path(name)


class SGLangServer(ServerProcess):
    """One ``sglang.launch_server`` process on 127.0.0.1."""

    name = "SGLang server"

    def __init__(self, model_path: Path | str, attention_backend: str, kv_cache_dtype: str = "auto",
                 tp_size: int = 1, max_total_tokens: int = 4096, extra_args: tuple[str, ...] = (),
                 log_path: Path | None = None, env_overrides: dict | None = None, startup_timeout_s: float = 300.0):
        self.model_path = str(model_path)
        self.attention_backend = attention_backend
        self.kv_cache_dtype = kv_cache_dtype
        self.tp_size = tp_size
        self.port = free_port()
        self.startup_timeout_s = startup_timeout_s
        self.args = [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", self.model_path, "--device", "cpu", "--dtype", "bfloat16",
            "--attention-backend", attention_backend, "--kv-cache-dtype", kv_cache_dtype,
            "--tp-size", str(tp_size), "--max-total-tokens", str(max_total_tokens),
            "--host", "127.0.0.1", "--port", str(self.port), "--skip-server-warmup", *extra_args,
        ]
        # tp ranks get one core each ("0|1"); a single rank keeps SGLang's default binding.
        bind = "|".join(str(rank) for rank in range(tp_size)) if tp_size > 1 else None
        self.env = cpu_env(omp_threads_bind=bind)
        self.env.update(env_overrides or {})
        self._use_log(log_path, f"sglang-{attention_backend}-{kv_cache_dtype}-tp{tp_size}-")

    def tokenize(self, prompt: str, timeout_s: float = 60.0) -> list[int]:
        """The token ids the server's own tokenizer gives ``prompt`` (special tokens such as ``<bos>`` included, as
        for a text prompt to ``/generate``)."""
        return list(self._post("/tokenize", {"prompt": prompt}, timeout_s)["tokens"])

    def generate(self, prompt: str | None = None, max_new_tokens: int = 8, input_ids: list[int] | None = None,
                 return_logprob: bool = False, top_logprobs_num: int = 0, input_logprobs_from: int | None = None,
                 timeout_s: float = 300.0) -> dict:
        """Greedy generation through SGLang's native ``/generate``. Returns ``output_ids``, ``text``, ``meta``
        (SGLang's meta_info) and, when asked, the chosen tokens' ``logprobs`` and per position the ``top_logprobs``
        as ``[(token_id, logprob), ...]``. ``input_logprobs_from=k`` adds ``input_logprobs``: the log-probability of
        each prompt token after index k after the ones before it, teacher-forced (SGLang gives none for token k)."""
        body = {"sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens},
                "return_logprob": return_logprob or top_logprobs_num > 0 or input_logprobs_from is not None}
        if top_logprobs_num:
            body["top_logprobs_num"] = top_logprobs_num
        if input_logprobs_from is not None:
            require_int_value(input_logprobs_from, "input_logprobs_from", "an int >= 0", minimum=0)
            body["logprob_start_len"] = input_logprobs_from
        if input_ids is not None:
            body["input_ids"] = input_ids
        else:
            body["text"] = prompt
        out = self._post("/generate", body, timeout_s)
        meta = out.get("meta_info", {})
        result = {"text": out["text"], "output_ids": out.get("output_ids"), "meta": meta}
        if body["return_logprob"]:
            result["logprobs"] = [entry[0] for entry in meta["output_token_logprobs"]]
            if result["output_ids"] is None:
                result["output_ids"] = [entry[1] for entry in meta["output_token_logprobs"]]
        if input_logprobs_from is not None:
            result["input_logprobs"] = [entry[0] for entry in meta["input_token_logprobs"] if entry[0] is not None]
        if top_logprobs_num:
            result["top_logprobs"] = [[(entry[1], entry[0]) for entry in position]
                                      for position in meta["output_top_logprobs"]]
        return result
