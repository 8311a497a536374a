#!/usr/bin/env bash
# One device call for issue #62: the eager-step profile (one_batch_speed.py through run_speed.sh, entries in
# PROFILE_ENTRIES, at PROFILE_POINTS with decode graphs off: every step eager, host time per attention call), then
# the served throughput (run_serve_bench.sh, SERVE_CONFIGS x SERVE_WORKLOADS), each within its own budget
# (PROFILE_BUDGET_S, SERVE_BUDGET_S). Everything comes back in at most 8 files: $OUT/serve/{runs.jsonl, table.md,
# summary.json, served.png}, $OUT/speed.json, $OUT/logs.tar.xz (every log), $OUT/flashinfer-jit.tar.xz (FI_SAVE_JIT=1),
# $OUT/triton-cache.tar.xz (SAVE_TRITON_CACHE=1).
#   cd .h16 && PROFILE_ENTRIES="inkling:mxfp8 flashinfer:fp8_e4m3" SERVE_CONFIGS=inkling:mxfp8,flashinfer:fp8_e4m3 \
#       SERVE_WORKLOADS=short INKLING_FROM_SOURCE=1 FI_SAVE_JIT=1 bash gpu_tests/sglang/run_served_call.sh
FINAL=$OUT
# A warm machine keeps /tmp between calls: a second call in a row starts from an empty /tmp/call (serve_bench.py
# refuses an --out that already holds runs.jsonl).
rm -rf /tmp/call
mkdir -p /tmp/call/speed /tmp/call/serve
# Triton's cache (this package's kernels, compiled cold in 1-2 min) travels like FlashInfer's JIT cache: a carried
# ../.tcache/triton-cache.tar.xz (carry ".tcache") is unpacked first; SAVE_TRITON_CACHE=1 packs it back at the end.
export TRITON_CACHE_DIR=/tmp/triton_cache
mkdir -p $TRITON_CACHE_DIR
if ls ../.tcache/triton-cache.tar.xz > /dev/null 2>&1; then
  tar -xJf ../.tcache/triton-cache.tar.xz -C /tmp && echo "triton cache: unpacked $(du -sh $TRITON_CACHE_DIR | cut -f1)"
fi
if [ -n "${PROFILE_ENTRIES:-}" ]; then
  # shellcheck disable=SC2086
  OUT=/tmp/call/speed FI_SAVE_JIT=0 SPEED_POINTS=${PROFILE_POINTS:-600x768} SPEED_STEPS=${PROFILE_STEPS:-16} \
      SPEED_MEM=${PROFILE_MEM:-0.3} SPEED_BUDGET_S=${PROFILE_BUDGET_S:-240} SPEED_TIMEOUT_S=${PROFILE_TIMEOUT_S:-200} \
      SPEED_ARGS="--disable-cuda-graph --prefill-chunk-tokens 8192 --warmup-steps 4 ${PROFILE_ARGS:-}" \
      bash gpu_tests/sglang/run_speed.sh $PROFILE_ENTRIES
  cp /tmp/call/speed/speed.json "$FINAL/" 2>/dev/null
fi
if [ -n "${SERVE_CONFIGS:-}" ]; then
  OUT=/tmp/call/serve bash gpu_tests/sglang/run_serve_bench.sh
  mkdir -p "$FINAL/serve"
  cp /tmp/call/serve/serve/runs.jsonl /tmp/call/serve/serve/table.md /tmp/call/serve/serve/summary.json \
     /tmp/call/serve/serve/served.png "$FINAL/serve/" 2>/dev/null
  cp /tmp/call/serve/flashinfer-jit.tar.xz "$FINAL/" 2>/dev/null
fi
tar -cJf "$FINAL/logs.tar.xz" -C /tmp/call --exclude=flashinfer-jit.tar.xz .
if [ "${SAVE_TRITON_CACHE:-0}" = 1 ]; then
  tar -cJf "$FINAL/triton-cache.tar.xz" -C /tmp triton_cache && echo "triton cache: $(du -h "$FINAL/triton-cache.tar.xz" | cut -f1)"
fi
ls -la "$FINAL" "$FINAL/serve" 2>/dev/null
