#!/usr/bin/env bash
# Device call, repository root (issue #64 item 1): served throughput on vLLM with its own client (serve_bench.py). One
# `vllm serve` per SERVE_CONFIGS entry (BACKEND:KV, comma-separated; default FLASHINFER bf16 and fp8, CUSTOM MXFP8 and
# bf16), each with the same KV pool (6.4 GiB static less the weights), running each SERVE_WORKLOADS entry (short, long,
# capacity, prefix, rate<R>) through `vllm bench serve`, while SERVE_BUDGET_S (default 540 s from this script's start)
# lasts. SERVE_ARGS: more `serve_bench.py run` arguments (after "--": server arguments for every config).
# carry: .vgpu .fi072 (and .vfijit: FlashInfer's JIT cache, FI_SAVE_JIT=1 saves what this call built).
# $OUT/serve/: runs.jsonl, table.md, summary.json, served.png; $OUT/serve-logs.tar.xz: servers' and clients' logs.
#   SERVE_CONFIGS=FLASHINFER:fp8,CUSTOM:mxfp8 SERVE_WORKLOADS=short FI_SAVE_JIT=1 bash gpu_tests/vllm/run_serve_bench.sh
set -uo pipefail
. gpu_tests/vllm/gpu_env.sh || exit 1
START=$SECONDS
OUT=${OUT:-/tmp/vout} && mkdir -p "$OUT"
FI_JIT_TAR=.vfijit/flashinfer-jit.tar.xz . gpu_tests/sglang/flashinfer_jit.sh
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
mkdir -p tok && [ -f tok/tokenizer.json ] || xz -dc .vgpu/tokenizer.json.xz > tok/tokenizer.json
cp .vgpu/tokenizer_config.json tok/ 2>/dev/null
python3 gpu_tests/sglang/make_models.py --tokenizer tok --out /tmp/models --models llama-gqa4-l16 --device cuda 2>&1 \
    | grep -v Writing || { echo "make_models.py failed"; exit 1; }
python3 gpu_tests/vllm/serve_bench.py run --model /tmp/models/llama-gqa4-l16 --tokenizer tok \
    --configs "${SERVE_CONFIGS:-FLASHINFER:auto,FLASHINFER:fp8,CUSTOM:mxfp8,CUSTOM:auto}" \
    --workloads "${SERVE_WORKLOADS:-short,long}" --out $OUT/serve \
    --budget-s $(( ${SERVE_BUDGET_S:-540} - (SECONDS - START) )) ${SERVE_ARGS:-}
rc=$?
fi_jit_save
python3 gpu_tests/vllm/serve_bench.py summarize $OUT/serve --out $OUT/serve || rc=1
(cd $OUT/serve && tar -cJf $OUT/serve-logs.tar.xz server_*.log bench_*) \
    && rm -f $OUT/serve/server_*.log $OUT/serve/bench_*
exit $rc
