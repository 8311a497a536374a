#!/usr/bin/env bash
# Device call (issue #62): served throughput with SGLang's own client (serve_bench.py). One server per SERVE_CONFIGS
# entry (BACKEND:KV[:TAG], comma-separated; tags nobcg, bcg, graph512: serve_bench.py), each at 6.4 GiB of static
# memory (--mem-fraction-static from the card's size: the same bytes on an H100 and an H200), running each
# SERVE_WORKLOADS entry (short, long, capacity, prefix, rate<R>) through `python -m sglang.benchmark.serving`, while
# SERVE_BUDGET_S (default 540 s, counted from this script's start) lasts. SERVE_ARGS: more `serve_bench.py run`
# arguments (e.g. "--static-gib 12 -- --chunked-prefill-size 4096": after "--", server arguments for every config).
# $OUT/serve/: runs.jsonl, table.md, summary.json, served.png (where matplotlib imports); $OUT/serve-logs.tar.xz: the
# servers' and clients' logs and the client's own JSON lines (the device returns at most 8 files, 2 folder levels).
# FlashInfer as in run_parity.sh (carry ".fi072"); its JIT cache as in flashinfer_jit.sh (carry ".fijit",
# FI_SAVE_JIT=1).
#   cd .h16 && SERVE_CONFIGS=flashinfer:auto,flashinfer:fp8_e4m3,inkling:mxfp8 SERVE_WORKLOADS=short,long \
#       INKLING_FROM_SOURCE=1 bash gpu_tests/sglang/run_serve_bench.sh
. gpu_tests/sglang/gpu_env.sh || exit 1
START=$SECONDS
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
set -o pipefail
python3 gpu_tests/sglang/make_models.py --tokenizer tok --out /tmp/models --models llama-gqa4-l16 --device cuda 2>&1 \
    | grep -v Writing || { echo "make_models.py failed"; exit 1; }
set +o pipefail
if ls ../.fi072/*.tar.xz > /dev/null 2>&1; then
  [ -d /tmp/fi_site/flashinfer ] || { mkdir -p /tmp/fi_site && tar -xJf ../.fi072/*.tar.xz -C /tmp/fi_site; }
  export PYTHONPATH=/tmp/fi_site:$PYTHONPATH FLASHINFER_WORKSPACE_BASE=$(cd .. && pwd)
else
  echo "no ../.fi072/*.tar.xz (carry \".fi072\"): FlashInfer is not importable, its configs will not start"
fi
. gpu_tests/sglang/flashinfer_jit.sh
python3 gpu_tests/sglang/serve_bench.py run --model /tmp/models/llama-gqa4-l16 --tokenizer tok \
    --configs "${SERVE_CONFIGS:-flashinfer:auto,flashinfer:fp8_e4m3,inkling:mxfp8,inkling:auto}" \
    --workloads "${SERVE_WORKLOADS:-short,long}" --out $OUT/serve \
    --budget-s $(( ${SERVE_BUDGET_S:-540} - (SECONDS - START) )) ${SERVE_ARGS:-}
rc=$?
fi_jit_save
python3 gpu_tests/sglang/serve_bench.py summarize $OUT/serve --out $OUT/serve || rc=1
(cd $OUT/serve && tar -cJf $OUT/serve-logs.tar.xz server_*.log bench_*) \
    && rm -f $OUT/serve/server_*.log $OUT/serve/bench_*
exit $rc
