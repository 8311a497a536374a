#!/usr/bin/env bash
# Here, on a CPU: the vLLM bundle (.vgpu/vllm_site.tar.xz) as the GPU machine will see it, up to the GPU. A Python
# 3.12 venv of the GPU image's torch 2.11.0+cu130 and the image's packages this path uses (numpy, transformers 5.17,
# tokenizers, safetensors, huggingface_hub, pillow, make_bundle.IMAGE_PACKAGES); the bundle appended after its
# site-packages by a .pth file, as gpu_env.sh does; a stub libcuda.so.1 (vLLM's _C links the driver, absent here).
# Checks: vLLM's compiled ops load on torch 2.11 and register their schemas; vLLM's engine, GPU worker and model
# runner, models, attention backends, sampler, OpenAI server, CLI and benchmarks import; the plugin registers CUSTOM and mxfp8 through its entry point;
# `vllm serve`'s HTTP app is built with all its routers and served, short of the engine; serve_bench.py's server and
# client arguments parse with `vllm serve`'s and `vllm bench serve`'s own parsers.
#   PYTHON312=python3.12 bash gpu_tests/vllm/check_bundle_cpu.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON312=${PYTHON312:-python3.12}
VENV=${VENV:-$HOME/.cache/sglang-inkling-backend/venv-torch211}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
[ -x "$VENV/bin/python" ] || "$PYTHON312" -m venv "$VENV"
# the image's packages the bundle leaves to it (make_bundle.py IMAGE_PACKAGES); a no-op once installed
"$VENV/bin/pip" install -q torch==2.11.0 numpy==2.5.2 transformers==5.17.0 tokenizers==0.23.2 safetensors==0.8.0 \
  huggingface_hub==1.33.0 pillow $(python3 "$ROOT/gpu_tests/vllm/make_bundle.py" --print-image-packages) 2>&1 \
  | grep -v "is ignored" || true
tar -xJf "$ROOT/.vgpu/vllm_site.tar.xz" -C "$WORK"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$WORK/vsite" > "$SITE/zz-inkling-vllm-bundle.pth"
trap 'rm -rf "$WORK" "$SITE/zz-inkling-vllm-bundle.pth"' EXIT
printf 'int cuGetProcAddress_v2(void){return 100;}\nint cuPointerGetAttribute(void){return 100;}\nint cuTensorMapEncodeTiled(void){return 100;}\n' > "$WORK/stub.c"
gcc -shared -fPIC -o "$WORK/libcuda.so.1" "$WORK/stub.c" -Wl,-soname,libcuda.so.1
mkdir -p "$WORK/src" && cp -r "$ROOT/sglang_inkling_backend" "$WORK/src/"
mkdir -p "$WORK/fi" && tar -xJf "$ROOT"/.fi072/*.tar.xz -C "$WORK/fi"
# Every torch symbol vLLM's ops import (the stable ABI's C shims) is one torch 2.11's libraries export
TORCH_LIB=$("$VENV/bin/python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null)
nm -D --undefined-only "$WORK/vsite/vllm/_C_stable_libtorch.abi3.so" | awk '{print $2}' | grep -E '^(aoti_|torch_)' \
  | sort -u > "$WORK/needed.txt"
for lib in libtorch_cpu.so libtorch_cuda.so libtorch.so libc10.so libc10_cuda.so; do
  nm -D --defined-only "$TORCH_LIB/$lib" | awk '{print $3}'
done | sort -u > "$WORK/exported.txt"
missing=$(comm -23 "$WORK/needed.txt" "$WORK/exported.txt" | wc -l)
echo "torch symbols vLLM's ops import: $(wc -l < "$WORK/needed.txt"); not exported by torch 2.11: $missing"
[ "$missing" -eq 0 ] || { comm -23 "$WORK/needed.txt" "$WORK/exported.txt"; exit 1; }
cd "$WORK"
LD_LIBRARY_PATH=$WORK PYTHONPATH=$WORK/src:$WORK/fi BUNDLE=$WORK/vsite ROOT=$ROOT "$VENV/bin/python" - <<'PY' 2>&1 | grep -vE "Warning|warn\(|^\s*$"
import importlib, os, sys
import torch
print("torch", torch.__version__)
import vllm._C_stable_libtorch as ops
print("vllm._C_stable_libtorch loaded from", ops.__file__.replace(os.environ["BUNDLE"], "<bundle>"))
for op in ("_C::rms_norm", "_C::fused_add_rms_norm", "_C::silu_and_mul", "_C_cache_ops::reshape_and_cache_flash"):
    ns, name = op.split("::")
    print(" ", getattr(getattr(torch.ops, ns), name).default._schema)
modules = ["vllm", "vllm.platforms.cuda", "vllm.entrypoints.llm", "vllm.v1.engine.core", "vllm.v1.engine.async_llm",
           "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner", "vllm.v1.executor.multiproc_executor",
           "vllm.model_executor.models.llama", "vllm.model_executor.models.gemma3",
           "vllm.v1.attention.backends.triton_attn", "vllm.v1.attention.backends.flashinfer",
           "vllm.v1.sample.sampler", "vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main",
           "vllm.benchmarks.latency", "vllm.benchmarks.throughput", "vllm.benchmarks.serve",
           "vllm.entrypoints.cli.serve", "vllm.entrypoints.launchers.api_server.app_state",
           "vllm.entrypoints.openai.chat_completion.serving", "vllm.entrypoints.openai.completion.serving",
           "vllm.entrypoints.openai.responses.serving", "vllm.entrypoints.anthropic.serving",
           "vllm.compilation.backends", "openai"]
failed = 0
for m in modules:
    try:
        importlib.import_module(m)
        print("import", m, "ok")
    except Exception as e:
        failed += 1
        print("import", m, "FAILED", repr(e)[:300])
import vllm
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.config.cache import get_kv_cache_dtype_handler
print("vllm", vllm.__version__, "CUSTOM ->", AttentionBackendEnum.CUSTOM.get_path())
print("--kv-cache-dtype mxfp8 ->", type(get_kv_cache_dtype_handler("mxfp8")).__name__)
# `vllm serve`'s HTTP server as build_and_serve starts it, short of the engine (which needs the GPU): every router
# and its imports (the sagemaker, LoRA and Anthropic ones among them), served over HTTP and asked for its routes.
import asyncio, json, socket, urllib.request
import uvicorn
from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.entrypoints.launchers.app import build_app
from vllm.utils.argparse_utils import FlexibleArgumentParser
import vllm.platforms
from vllm.platforms.cuda import CudaPlatform
vllm.platforms._current_platform = CudaPlatform()  # the platform the GPU machine resolves (no GPU here to find)
args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "/models/llama-gqa4"])
app = build_app(args, ("generate",), None)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
# lifespan off: its start-up reads the engine's state (init_app_state), which needs the engine
server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
async def serve_and_ask():
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    url = f"http://127.0.0.1:{port}/openapi.json"
    spec = await asyncio.to_thread(lambda: json.load(urllib.request.urlopen(url, timeout=30)))
    server.should_exit = True
    await task
    return spec
paths = asyncio.run(serve_and_ask())["paths"]
need = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/health"]
missing = [p for p in need if p not in paths]
print(f"vllm serve's app served {len(paths)} routes on :{port}; missing of {need}: {missing}")
failed += bool(missing)
# serve_bench.py's server arguments, per config, through `vllm serve`'s own parser (with the plugin's mxfp8), and its
# client's, per workload, through `vllm bench serve`'s
sys.path.insert(0, os.path.join(os.environ["ROOT"], "gpu_tests", "vllm"))
import serve_bench
from vllm.benchmarks.serve import add_cli_args
from vllm.entrypoints.cli.serve import ServeSubcommand
cli = FlexibleArgumentParser()
ServeSubcommand().subparser_init(cli.add_subparsers(dest="subparser"))  # as `vllm` builds its serve command
for spec in ("FLASHINFER:auto", "FLASHINFER:fp8", "CUSTOM:mxfp8", "CUSTOM:auto"):
    parsed = cli.parse_args(["serve", *serve_bench.server_args(serve_bench.parse_config(spec), "/models/m", 2**32, [])])
    print(f"vllm serve parses serve_bench {spec}: --attention-backend {parsed.attention_backend} "
          f"--kv-cache-dtype {parsed.kv_cache_dtype} --kv-cache-memory-bytes {parsed.kv_cache_memory_bytes}")
client = FlexibleArgumentParser()
add_cli_args(client)
for workload in [*serve_bench.WORKLOADS, "rate16"]:
    parsed = client.parse_args(serve_bench.client_args(workload, "http://127.0.0.1:1", "/m", "/t", "/tmp", "r.json"))
    print(f"vllm bench serve parses serve_bench {workload}: --dataset-name {parsed.dataset_name} "
          f"--num-prompts {parsed.num_prompts} --request-rate {parsed.request_rate}")
bundle = os.environ["BUNDLE"]
used = sorted({m.__file__[len(bundle) + 1:].split("/")[0] for m in list(sys.modules.values())
               if (getattr(m, "__file__", None) or "").startswith(bundle + "/")})
print("imported from the bundle:", " ".join(used))
sys.exit(1 if failed else 0)
PY
