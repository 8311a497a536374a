#!/usr/bin/env bash
# One device call (H100/H200, carry [".fi072"]) for what issue #34 still has to measure, each step inside the call's
# 10 minutes: the GPU checks of every decode configuration at the two shapes the H100 call left; GQA 16 on one
# program (variants ws16, one16: HEAD_SPLIT 1) and the head_dim-64 points against every peer; both Hopper kernels
# forced at head_dim 64; the hybrid step (gemma3-27b-tp2); the SGLang graph test; single requests with and without
# the early-launched merge (planned/pdl).
#   bash bench/hopper_open_items_call.sh     # writes under $OUT
set -uo pipefail
export PYTHONUNBUFFERED=1
R=$OUT
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv > $R/gpu.txt 2>&1
stamp() { echo "== $(date +%T) ${SECONDS}s $*" | tee -a $R/call.log; }
limit() { local left=$((585 - SECONDS)); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
mkdir -p /tmp/site && tar -xJf .fi072/*.tar.xz -C /tmp/site
# every configuration at 4/1/256 and 64/4/128 (16/2/128 and 64/8/128 passed on an H100 in
# bench/results/current/h100-2026-12-05b/decode/gpu_checks.log)
stamp "checks: every configuration at 4/1/256 and 64/4/128"
mkdir -p $R/checks
OUT=$R/checks GPU_CHECKS_ONLY=check_decode GPU_CHECKS_DECODE_SHAPES=4/1/256,64/4/128 PYTHONPATH=$PWD \
  timeout $(limit 200) python3 gpu_tests/check_triton_gpu.py \
  > $R/checks/gpu_checks.log 2>&1
echo "rc=$?" >> $R/checks/gpu_checks.log; tail -1 $R/checks/gpu_checks.log | tee -a $R/call.log
stamp "head_dim 64 points; GQA 16 on one program"
VARIANTS='{"n64": {"block_n": 64, "num_stages": 3}, "ws16": {"kernel": "hopper_ws", "constexprs": {"HEAD_SPLIT": 1}},
  "one16": {"constexprs": {"HEAD_SPLIT": 1}}}'
PYTHONPATH=/tmp/site:$PWD BENCH_HOPPER_WS=1 BENCH_HOPPER_VARIANTS="$VARIANTS" timeout $(limit 150) \
  python3 bench/bench_decode.py --points qwen3-235b-gqa16:32:32768,headdim64 --out $R/hd64 > $R/hd64-bench.log 2>&1
echo "rc=$?" >> $R/hd64-bench.log
stamp "checks: the Hopper kernels at head_dim 64"
mkdir -p $R/checks64
for k in hopper hopper_ws; do
  OUT=$R/checks64/$k GPU_CHECKS_ONLY=check_decode GPU_CHECKS_DECODE_SHAPES=32/8/64 \
    DECODE_PLAN_OPTIONS="{\"map\":\"table\",\"kernel\":\"$k\"}" PYTHONPATH=$PWD timeout $(limit 35) \
    python3 gpu_tests/check_triton_gpu.py > $R/checks64/$k.log 2>&1; echo "rc=$?" >> $R/checks64/$k.log
  tail -1 $R/checks64/$k.log | tee -a $R/call.log
done
stamp "hybrid step"
PYTHONPATH=/tmp/site:$PWD BENCH_HOPPER_WS=1 timeout $(limit 110) python3 bench/bench_hybrid_step.py \
  --shapes gemma3-27b-tp2 --out $R/hybrid \
  > $R/hybrid-bench.log 2>&1; echo "rc=$?" >> $R/hybrid-bench.log
stamp "graph test"
PYTHONPATH=$PWD timeout $(limit 40) python3 tests/hosts/sglang/test_sglang_graph_gpu.py > $R/graph_gpu.log 2>&1
echo "rc=$?" >> $R/graph_gpu.log
stamp "small work: planned vs planned/pdl"
PYTHONPATH=$PWD timeout $(limit 150) python3 bench/sweep_decode_variants.py --out $R/pdl --points 20,21,22,23,9,17 \
  --only planned,planned/pdl > $R/sweep.log 2>&1; echo "rc=$?" >> $R/sweep.log
stamp done
