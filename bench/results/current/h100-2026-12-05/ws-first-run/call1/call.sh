#!/usr/bin/env bash
# device call 1 (2026-12-05): the warp-specialized kernel's first run, the early-launched merge
set -uo pipefail
export PYTHONUNBUFFERED=1
R=$OUT
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv > $R/gpu.txt 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $R/gpu.txt 2>&1
stamp() { echo "== $(date +%T) ${SECONDS}s $*" | tee -a $R/call.log; }
stamp "checks hopper_ws (16/2/128, 4/1/256, 64/4/128)"
mkdir -p /tmp/c1
OUT=/tmp/c1 GPU_CHECKS_ONLY=check_decode GPU_CHECKS_DECODE_SHAPES=16/2/128,4/1/256,64/4/128 \
  DECODE_PLAN_OPTIONS='{"map":"table","kernel":"hopper_ws"}' timeout 170 python3 gpu_tests/check_triton_gpu.py \
  > $R/checks-ws.log 2>&1
rc=$?; echo "rc=$rc" >> $R/checks-ws.log; cp /tmp/c1/gpu_checks.json $R/checks-ws.json 2>/dev/null
tail -1 $R/checks-ws.log | tee -a $R/call.log
stamp "checks pdl_merge (16/2/128)"
mkdir -p /tmp/c2
OUT=/tmp/c2 GPU_CHECKS_ONLY=check_decode GPU_CHECKS_DECODE_SHAPES=16/2/128 \
  DECODE_PLAN_OPTIONS='{"map":"table","pdl_merge":true}' timeout 60 python3 gpu_tests/check_triton_gpu.py \
  > $R/checks-pdl.log 2>&1
echo "rc=$?" >> $R/checks-pdl.log; cp /tmp/c2/gpu_checks.json $R/checks-pdl.json 2>/dev/null
tail -2 $R/checks-pdl.log | tee -a $R/call.log
mkdir -p /tmp/site && tar -xJf .fi072/*.tar.xz -C /tmp/site
WS=""
if [ "$rc" = 0 ]; then WS=1; fi
stamp "grid points (hopper_ws rows: ${WS:-off})"
PYTHONPATH=/tmp/site:$PWD BENCH_HOPPER_WS=$WS BENCH_PDL_MERGE=1 \
  BENCH_PEERS=flashinfer_xqa_fp8,sdpa_bf16,flashinfer_bf16,flashinfer_fp8 \
  BENCH_HOPPER_VARIANTS=$([ -n "$WS" ] && echo '{"ws2p": {"kernel": "hopper_ws", "num_stages": 2, "constexprs": {"P_SETS": 2}}}' || echo '{}') \
  timeout $((590 - SECONDS)) python3 bench/bench_decode.py \
  --points inkling-tp4:128:32768,gqa8-tp1:32:16384,gqa8-tp1:128:8192,inkling-tp4:8:32768,gemma2-9b:32:16384,inkling-tp4:1:1024,gqa8-tp1:1:1024,inkling-tp4:1:4096 \
  --out /tmp/grid > $R/grid.log 2>&1
echo "rc=$?" >> $R/grid.log
cp /tmp/grid/*.json $R/ 2>/dev/null; cp /tmp/grid/*.png $R/ 2>/dev/null
stamp done
