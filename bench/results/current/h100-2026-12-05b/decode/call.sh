#!/usr/bin/env bash
# device call A (2026-12-05 b): #34's route table and new shapes' table from one run (the whole grid and the issue's
# shapes, every peer, the warp-specialized kernel's row), then the GPU checks in the time left
set -uo pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv > $OUT/gpu.txt 2>&1
mkdir -p /tmp/site && tar -xJf .fi072/*.tar.xz -C /tmp/site
PYTHONPATH=/tmp/site:$PWD BENCH_HOPPER_WS=1 timeout 480 python3 bench/bench_decode.py \
  --points grid,issue34 --out $OUT/grid > $OUT/grid-bench.log 2>&1
echo "rc=$? ${SECONDS}s" >> $OUT/grid-bench.log
mkdir -p $OUT/checks
left=$((588 - SECONDS))
OUT=$OUT/checks GPU_CHECKS_ONLY=check_decode PYTHONPATH=$PWD timeout $left python3 gpu_tests/check_triton_gpu.py \
  > $OUT/checks/gpu_checks.log 2>&1
echo "rc=$? ${SECONDS}s" >> $OUT/checks/gpu_checks.log
