#!/usr/bin/env bash
# device call C (2026-12-05 b): #35's decode rates with and without NGRAM, ours next to SGLang's flashinfer backend
# (bf16, CUDA graphs, verify graphs), then MXFP8 with and without NGRAM and EAGLE3 under graphs
set -uo pipefail
cd .h16
PARITY_BUDGET_S=560 PARITY_SERVE_ARGS="--decode-rate 128" INKLING_FROM_SOURCE=1 bash gpu_tests/sglang/run_parity.sh \
  llama-gqa4:inkling:auto llama-gqa4:inkling:auto:ngram llama-gqa4:flashinfer:auto llama-gqa4:flashinfer:auto:ngram \
  llama-gqa4:inkling:mxfp8 llama-gqa4:inkling:mxfp8:ngram llama-gqa4:inkling:mxfp8:eagle3 > $OUT/parity.log 2>&1
