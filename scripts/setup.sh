#!/usr/bin/env bash
# One command for a new CPU-only Linux machine: a virtual environment with a CPU torch, the real SGLang 0.5.23
# (installed --no-deps, plus what it imports on the CPU path) and this project, editable, with its test extras.
#
#   scripts/setup.sh                 # creates ./.venv
#   VENV=/path/to/venv PYTHON=python3.11 scripts/setup.sh
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/setup.sh   # where the configured index has no CPU torch
#
# Then: .venv/bin/python -m demo      (the main job)
#       .venv/bin/python -m pytest -m integration integration/   (the real server on CPU)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$REPO/.venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

step() { printf '[setup %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# pip, with its output kept in a log. sglang is installed --no-deps, so every later pip run ends with the resolver
# listing sglang's unmet pins (CUDA packages, another torch): expected, they are not needed on this path. Those
# lines are counted into one line; anything else pip prints is shown, and on failure the whole log.
PIP_LOG=$(mktemp)
pip_quiet() {
  if ! "$VENV/bin/python" -m pip "$@" >"$PIP_LOG" 2>&1; then
    cat "$PIP_LOG" >&2
    echo "[setup] pip $* failed (log above)" >&2
    exit 1
  fi
  local pins
  pins=$(grep -cE "^sglang [0-9.]+ requires |^sglang [0-9.]+ has requirement " "$PIP_LOG" || true)
  grep -vE "^sglang [0-9.]+ (requires|has requirement) |^ERROR: pip's dependency resolver does not currently take into account|^WARNING: Location 'file://" "$PIP_LOG" || true
  if [ "${pins:-0}" -gt 0 ]; then
    echo "[setup] pip: sglang's $pins unmet pins (CUDA packages, another torch) are expected here; not needed on the CPU path"
  fi
}

"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python >= 3.10 is needed (PYTHON=...)")'
if [ ! -x "$VENV/bin/python" ]; then
  step "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi

# Pin the CPU torch for every later step: without it, torchvision and friends resolve to a CUDA torch (about 6 GB).
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS" "$PIP_LOG"' EXIT
printf 'torch==%s+cpu\n' "$TORCH_VERSION" > "$CONSTRAINTS"
TORCH_INDEX=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then TORCH_INDEX=(--extra-index-url "$TORCH_INDEX_URL"); fi

step "installing torch $TORCH_VERSION (CPU)"
pip_quiet install -q "${TORCH_INDEX[@]}" -c "$CONSTRAINTS" "torch==$TORCH_VERSION"

step "installing sglang 0.5.23 (--no-deps: its pins pull CUDA packages)"
pip_quiet install -q --no-deps sglang==0.5.23

# What sglang imports at start-up on the CPU path, found one by one (see third_party/sglang_cpu/README.md):
# xgrammar is needed at run time by the detokenizer; jsonschema, soundfile and python-multipart by the HTTP server;
# accelerate + gguf by the GGUF converter.
step "installing sglang's CPU-path dependencies"
pip_quiet install -q "${TORCH_INDEX[@]}" -c "$CONSTRAINTS" \
  numpy orjson psutil pybase64 requests triton packaging pillow starlette msgspec pyzmq tqdm ipython pydantic \
  aiohttp uvloop transformers==5.19.0 dill sentencepiece compressed-tensors gguf openai partial-json-parser \
  uvicorn fastapi setproctitle einops jsonschema soundfile python-multipart accelerate
# These three resolve to a CUDA torch if pip may choose their dependencies.
pip_quiet install -q --no-deps -c "$CONSTRAINTS" torchvision==0.28.0 apache-tvm-ffi==0.1.11 xgrammar==0.2.7

step "installing sglang-inkling-backend (editable, with the test and mlx extras)"
pip_quiet install -q "${TORCH_INDEX[@]}" -c "$CONSTRAINTS" -e "$REPO[test,mlx]"

step "checking that SGLang finds the inkling plugin through its entry point"
SGLANG_USE_CPU_ENGINE=1 PYTHONPATH="$REPO/third_party/sglang_cpu/pythonpath" "$VENV/bin/python" - <<'PY'
from importlib.metadata import entry_points
names = [ep.name for ep in entry_points(group="sglang.srt.plugins")]
assert "inkling" in names, f"entry point sglang.srt.plugins:inkling not installed (found {names})"
import sglang
print(f"sglang {sglang.__version__}; plugins {names}")
PY
step "done: $VENV"
