#!/usr/bin/env bash
# One device call that checks and times variants of the Gluon Hopper decode kernel against the current one, on an
# H100/H200 (carry [".fi072"]: FlashInfer 0.7.2 for the XQA fp8 and FA2 bf16 peers; bench/pack_flashinfer072.sh):
#   1. GPU checks of each variant, forced (the 27 Hopper cases against float64, pool bytes untouched);
#   2. decode grid points with every variant as a row next to the current kernel, the Triton kernel, XQA fp8 and
#      SDPA bf16, in one run;
#   3. the hybrid step (5 windowed : 1 full, B 32, 32k) at head_dim 128 with the variants as rows;
#   4. the SGLang host's CUDA-graph test (the route's own kernel choice), into study.log;
#   5. ncu's warp-state and scheduler sections of one launch per kernel at 16/2/128, B 128, 32k.
# Every step has its own time limit so that the call ends inside the device's 10 minutes.
#   VARIANTS='{"noslots": {"constexprs": {"SLOTS_AHEAD": false}}}' CHECKED=noslots bash bench/hopper_variant_study.sh "$OUT"
#   VARIANTS='{"wsagain": {"kernel": "hopper_ws"}}' bash bench/hopper_variant_study.sh "$OUT"   # the warp-specialized
#     kernel: its checks and ncu, and a second grid row of it (this study always times ours_mxfp8_hopper_ws,
#     BENCH_HOPPER_WS=1: two rows of one configuration show the run's spread)
# A variant: DecodeConfig fields (kernel, block_n, num_stages; kernel defaults to "hopper") and "constexprs".
# CHECKED: the variants steps 1 and 5 run (default: the first); every variant's grid and hybrid rows are also
# checked against float64 on their own data.
set -uo pipefail
OUT=${1:?usage: hopper_variant_study.sh OUT}
VARIANTS=${VARIANTS:?VARIANTS: BENCH_HOPPER_VARIANTS JSON}
POINTS=${POINTS:-inkling-tp4:128:32768,inkling-tp4:32:32768,inkling-tp4:128:4096,gqa8-tp1:32:16384,gqa8-tp1:128:8192,gqa8-tp1:8:32768}
CHECKED=${CHECKED:-$(python3 -c "import json, os; print(next(iter(json.loads(os.environ['VARIANTS']))))")}
W=$OUT/w
mkdir -p "$W" /tmp/site
tar -xJf .fi072/*.tar.xz -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 BENCH_HOPPER_WS=1
stamp() { echo "== $(date +%T) ${SECONDS}s $*" | tee -a "$W/study.log"; }
# a step's time limit: its own, or what is left before BUDGET_S (default 570 s) less 10 s for the archive
BUDGET_S=${BUDGET_S:-570}
limit() { local left=$((BUDGET_S - SECONDS - 10)); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }

constexprs() { python3 -c "import json, os; print(json.dumps(json.loads(os.environ['VARIANTS'])['$1'].get('constexprs', {})))"; }
# the variant's DecodeConfig fields as the checks' plan options ({"map": "table", "kernel": "hopper", ...})
plan_options() { python3 -c "import json, os; v = dict(json.loads(os.environ['VARIANTS'])['$1']); v.pop('constexprs', None); print(json.dumps({'map': 'table', 'kernel': 'hopper', **v}))"; }
variant_kernel() { python3 -c "import json, os; print(json.loads(os.environ['VARIANTS'])['$1'].get('kernel', 'hopper'))"; }
# its other DecodeConfig fields (tiles, stages) for the profile's plan
variant_fields() { python3 -c "import json, os; v = dict(json.loads(os.environ['VARIANTS'])['$1']); [v.pop(k, None) for k in ('constexprs', 'kernel')]; print(json.dumps(v))"; }
for name in ${CHECKED//,/ }; do
  consts=$(constexprs "$name")
  stamp "checks $name $consts $(plan_options "$name")"
  mkdir -p "/tmp/checks-$name"
  OUT=/tmp/checks-$name GPU_CHECKS_ONLY=check_decode DECODE_PLAN_OPTIONS="$(plan_options "$name")" \
    GPU_CHECKS_HOPPER_CONSTEXPRS="$consts" timeout $(limit 120) python3 gpu_tests/check_triton_gpu.py >> "$W/checks.log" 2>&1
  echo "rc=$?" >> "$W/checks.log"
  cp "/tmp/checks-$name/gpu_checks.json" "$W/checks-$name.json" 2>/dev/null
  grep "GPU checks passed" "$W/checks.log" | tail -1 | tee -a "$W/study.log"
done

stamp "grid points $POINTS"
BENCH_PEERS=flashinfer_xqa_fp8,sdpa_bf16 BENCH_HOPPER_VARIANTS="$VARIANTS" timeout "$(limit 200)" \
  python3 bench/bench_decode.py --points "$POINTS" --out /tmp/grid > "$W/grid-bench.log" 2>&1
echo "rc=$?" >> "$W/grid-bench.log"
cp /tmp/grid/*-h200.json "$W/grid.json" 2>/dev/null

stamp "hybrid step"
BENCH_PEERS=flashinfer_bf16,flashinfer_xqa_fp8,sdpa_bf16 BENCH_HOPPER_VARIANTS="$VARIANTS" timeout "$(limit 170)" \
  python3 bench/bench_hybrid_step.py --shapes gemma3-27b-tp2 --out "$W" > "$W/hybrid-bench.log" 2>&1
echo "rc=$?" >> "$W/hybrid-bench.log"

stamp "graph test"
timeout "$(limit 60)" python3 tests/hosts/sglang/test_sglang_graph_gpu.py >> "$W/study.log" 2>&1
echo "rc=$?" >> "$W/study.log"

for name in current ${CHECKED//,/ }; do
  consts='{}'
  kernel=hopper
  fields='{}'
  if [ "$name" != current ]; then consts=$(constexprs "$name"); kernel=$(variant_kernel "$name"); fields=$(variant_fields "$name"); fi
  stamp "ncu $name ($kernel $fields)"
  KERNEL="$kernel" DECODE_CONFIG="$fields" HOPPER_CONSTEXPRS="$consts" timeout "$(limit 45)" ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section LaunchStats -k regex:decode_ -c 1 -s 2 python3 tools/profile_decode.py \
    >> "$W/ncu.log" 2>&1
done
stamp done
tar -C "$W" -czf "$OUT/study.tgz" . && cp "$W/study.log" "$OUT/" && rm -rf "$W"
