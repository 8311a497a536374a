#!/usr/bin/env bash
# device call 2 (2026-12-05): ncu of both Hopper kernels at one point; the early-launched merge at small points again
set -uo pipefail
export PYTHONUNBUFFERED=1
R=$OUT
stamp() { echo "== $(date +%T) ${SECONDS}s $*" | tee -a $R/call.log; }
for k in hopper hopper_ws; do
  stamp "ncu $k"
  KERNEL=$k POINT=16,2,128,128,32768 timeout 80 ncu --clock-control none --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section SchedulerStats --section LaunchStats -k regex:decode_ -c 1 -s 2 \
    python3 tools/profile_decode.py > $R/ncu-$k.log 2>&1
  echo "rc=$?" >> $R/ncu-$k.log
done
stamp "sweep planned vs planned/pdl"
timeout $((280 - SECONDS)) python3 bench/sweep_decode_variants.py --out $R/pdl --points 20,21,22,23,9,17 \
  --only planned,planned/pdl > $R/sweep.log 2>&1
echo "rc=$?" >> $R/sweep.log
stamp done
