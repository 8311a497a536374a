#!/usr/bin/env bash
# One device call (H100/H200, carry [".h16"]): the Triton extend kernel's time with the non-finite guard (this
# checkout, sent as .h16/) and without it (82b4ff0's package in .h16/old/), alternated twice so the spread between
# repeats of one side shows the noise the difference must exceed. Only the Triton rows: FlashInfer is not needed.
#   prepare here:  bash bench/extend_guard_call.sh --prepare      # .h16 with old/ (82b4ff0's package) beside it
#   on the device: cd .h16 && bash bench/extend_guard_call.sh     # writes under $OUT
#   summarize:     python bench/summarize_extend_guard.py <files_at> --out bench/results/current/<date>-extend-guard
set -uo pipefail
OLD_COMMIT=${OLD_COMMIT:-82b4ff0}
if [ "${1:-}" = "--prepare" ]; then
  HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  MAIN=${MAIN:-/work/main}
  bash "$HERE/gpu_tests/sglang/sync_to_main.sh"
  WT=$(mktemp -d)/old
  git -C "$HERE" worktree add --detach "$WT" "$OLD_COMMIT" > /dev/null
  mkdir -p "$MAIN/.h16/old"
  cp -r "$WT/sglang_inkling_backend" "$MAIN/.h16/old/"
  git -C "$HERE" worktree remove --force "$WT"
  # the CPU check up to the GPU (where the bench stops, without CUDA): the old root is the package it imports
  first=$(cd "$MAIN/.h16" && BENCH_PACKAGE_ROOT=old "${PYTHON:-$HERE/.venv/bin/python}" bench/bench_extend.py \
      --kernels triton --out /tmp/extend-guard-check 2>&1 | head -1)
  [ "$first" = "package: $MAIN/.h16/old/sglang_inkling_backend" ] || { echo "imported: $first"; exit 1; }
  echo "prepared: .h16 (this checkout) and .h16/old ($OLD_COMMIT)"
  exit 0
fi
export PYTHONUNBUFFERED=1
R=$OUT
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv > $R/gpu.txt 2>&1
for rep in 1 2; do
  for side in new old; do
    root=$PWD; [ $side = old ] && root=$PWD/old
    echo "== $(date +%T) ${SECONDS}s $side rep $rep" | tee -a $R/call.log
    left=$((570 - SECONDS))
    [ $left -lt 30 ] && { echo "skip $side rep $rep: the call's time" | tee -a $R/call.log; continue; }
    BENCH_PACKAGE_ROOT=$root timeout $(( left < 200 ? left : 200 )) \
      python3 bench/bench_extend.py --kernels triton --out $R/$side-$rep > $R/$side-$rep.log 2>&1
    echo "rc=$?" | tee -a $R/$side-$rep.log $R/call.log
  done
done
