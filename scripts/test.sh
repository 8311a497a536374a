#!/usr/bin/env bash
# The tests, as CI runs them:
#   1. the SGLang venv's suite (.venv): unit tests, Triton kernels under the interpreter, the MLX path on mlx[cpu],
#      the integration tests against the real SGLang server and, started from .venv-vllm, the real vLLM server;
#   2. the unit tests that import vLLM (tests/hosts/vllm), in .venv-vllm.
# Arguments go to the first suite (e.g. -m "not integration"). Fails if either suite fails or collects nothing;
# without .venv-vllm the second is skipped, saying so (as the vLLM tests in the first skip with their reason).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

status=0
run() {
  "$@"
  local rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests: $*" >&2
    rc=1
  fi
  if [ "$rc" -ne 0 ]; then status=1; fi
}

# Two workers (pytest-xdist): SGLang's integration tests keep one worker and vLLM's another, each in order
# (integration/conftest.py's scheduler); the unit tests, most of them single-threaded Triton-interpreter runs, fill
# the rest. TEST_WORKERS=0 runs everything in this process.
run .venv/bin/python -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-2}" "$@"
if [ -x .venv-vllm/bin/python ]; then
  run .venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/hosts/vllm
else
  echo "test.sh: skipped the vLLM unit tests: no .venv-vllm (scripts/setup_vllm.sh makes it)" >&2
fi
exit "$status"
