#!/usr/bin/env bash
# Here (a CPU machine with PyPI): everything the vLLM GPU call carries. Downloads vllm 0.33.0, the start-up wheels
# (make_bundle.py REQUIREMENTS), FlashInfer 0.7.2.post1 and apache-tvm-ffi for Python 3.12 / manylinux x86_64; builds
# .vgpu/vllm_site.tar.xz, .vgpu/tokenizer.json.xz (SmolLM2's, the models' tokenizer: the demo's prepared copy) and
# .fi072/ (bench/pack_flashinfer072.sh). Needs the SGLang venv (.venv: scripts/setup.sh) for the project wheel.
#   bash gpu_tests/vllm/prepare.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
WHEELS=${WHEELS:-$HOME/.cache/sglang-inkling-backend/vllm-gpu-wheels}
PY=${PY:-.venv/bin/python}
PLATFORMS=()
for n in 39 38 36 35 34 33 32 31 30 29 28 27 24 17 12 5; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$1" "${@:2}" 2>&1 | grep -v "is ignored" || true
}
mkdir -p "$WHEELS" .whl072 .vgpu
download "$WHEELS" vllm==0.33.0 $("$PY" gpu_tests/vllm/make_bundle.py --print-requirements)
"$PY" gpu_tests/vllm/make_bundle.py --wheels "$WHEELS" --out .vgpu/vllm_site.tar.xz
TOKENIZER=$("$PY" -c "from demo.models import prepare_model; print(prepare_model('smollm2-135m-instruct'))" | tail -1)
xz -9 -c "$TOKENIZER/tokenizer.json" > .vgpu/tokenizer.json.xz
cp "$TOKENIZER/tokenizer_config.json" .vgpu/
if ! ls .fi072/*.tar.xz > /dev/null 2>&1; then
  download .whl072 flashinfer-python==0.7.2.post1 apache-tvm-ffi==0.1.11
  bash bench/pack_flashinfer072.sh
fi
du -sh .vgpu/* .fi072/*
