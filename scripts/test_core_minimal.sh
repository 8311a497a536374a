#!/usr/bin/env bash
# The core tests in a venv holding only what `pip install -e '.[test]'` brings (on a CPU torch): no SGLang, vLLM,
# Triton, MLX, transformers, safetensors, ... The rule it holds: a test of an optional part skips, with its reason,
# where that part is absent; none may error at collection. The venv is made afresh on every run, outside the
# checkout, and removed afterwards.
#
#   scripts/test_core_minimal.sh
#   PYTHON=python3.11 TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/test_core_minimal.sh
#   CORE_VENV=/path/to/venv scripts/test_core_minimal.sh    # kept afterwards (it is still emptied first)
#
# Fails if pytest fails, errors (collection included) or collects nothing, or if the venv turns out to hold one of
# the optional packages (then it would no longer show a missing skip).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
TEST_WORKERS=${TEST_WORKERS:-2}

step() { printf '[core-minimal %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
VENV=${CORE_VENV:-$TMP/venv-core}
PIP_LOG=$TMP/pip.log
CONSTRAINTS=$TMP/constraints.txt

pip_quiet() {
  if ! "$VENV/bin/python" -m pip "$@" >"$PIP_LOG" 2>&1; then
    cat "$PIP_LOG" >&2
    echo "[core-minimal] pip $* failed (log above)" >&2
    exit 1
  fi
  grep -vE "^WARNING: Location 'file://" "$PIP_LOG" || true
}

"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python >= 3.10 is needed (PYTHON=...)")'
step "creating a fresh $VENV"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"

# As scripts/setup.sh: the CPU torch, pinned for the later install (otherwise pip may pick a CUDA torch).
printf 'torch==%s+cpu\n' "$TORCH_VERSION" > "$CONSTRAINTS"
TORCH_INDEX=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then TORCH_INDEX=(--extra-index-url "$TORCH_INDEX_URL"); fi

step "installing torch $TORCH_VERSION (CPU)"
pip_quiet install -q "${TORCH_INDEX[@]}" -c "$CONSTRAINTS" "torch==$TORCH_VERSION"
step "installing sglang-inkling-backend (editable, with the test extra only)"
pip_quiet install -q "${TORCH_INDEX[@]}" -c "$CONSTRAINTS" -e "$REPO[test]"

# The point of this venv is what it lacks: if a dependency ever pulls one of these in, say so rather than pass.
"$VENV/bin/python" - <<'PY'
import importlib.util, sys
optional = ["sglang", "sgl_kernel", "vllm", "triton", "mlx", "transformers", "safetensors", "gguf", "accelerate",
            "flashinfer"]
present = [name for name in optional if importlib.util.find_spec(name) is not None]
if present:
    sys.exit(f"[core-minimal] the core venv holds optional packages {present}: it no longer tests their absence")
PY

step "running the core tests (-n $TEST_WORKERS)"
cd "$REPO"
rc=0
# No PYTHONPATH from the caller: it could bring another venv's packages (e.g. third_party/sglang_cpu/pythonpath).
env -u PYTHONPATH "$VENV/bin/python" -m pytest -q -p no:cacheprovider -n "$TEST_WORKERS" --dist worksteal tests || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "[core-minimal] FAILED: pytest collected no tests (exit 5)" >&2
  exit 1
fi
if [ "$rc" -ne 0 ]; then
  echo "[core-minimal] FAILED (pytest exit $rc): a core test failed, or a test errored at collection (an optional" \
       "package imported where it should skip: pytest.importorskip(..., reason=...))" >&2
  exit "$rc"
fi
step "passed"
