#!/usr/bin/env bash
# The drift tables of this folder (tables.md, summary.json), from the repository root:
#   bash bench/results/current/sglang-h200/q-rounding/drift.sh > bench/results/current/sglang-h200/q-rounding/tables.md
set -euo pipefail
D=bench/results/current/sglang-h200; Q=$D/q-rounding; T=$D/tp2-per-rank
python gpu_tests/sglang/drift_pairs.py --ref $Q/call1/runs/inkling-swa-rank2_inkling_auto_noprologue.json \
  --run "A: MXFP8, Q MXFP8, new keys read back (unfused)=$Q/call1/runs/inkling-swa-rank2_inkling_mxfp8_noprologue.json" \
  --run "B: MXFP8, Q bf16, new keys read back (unfused)=$Q/call1/runs/inkling-swa-rank2_inkling_mxfp8_noprologue+qbf16.json" \
  --run "C: ours fp8_e4m3, Q bf16, new keys read back (unfused)=$Q/call1/runs/inkling-swa-rank2_inkling_fp8_e4m3_noprologue.json" \
  --run "D: MXFP8, Q MXFP8, new keys read back (fused, tp2 call3)=$T/call3/runs/inkling-swa-rank2_inkling_mxfp8.json" \
  --run "E: MXFP8, Q MXFP8, new keys from the forward (fused)=$Q/call2/runs/inkling-swa-rank2_inkling_mxfp8.json" \
  --run "F: ours fp8_e4m3, Q bf16, new keys from the forward (fused)=$Q/call2/runs/inkling-swa-rank2_inkling_fp8_e4m3.json" \
  --run "G: SGLang triton fp8_e4m3, Q bf16, new keys from the forward (tp2 call4)=$T/call4/runs/inkling-swa-rank2_triton_fp8_e4m3_noprefillgraph.json" \
  --run "H: MXFP8, Q bf16 (querybf16), new keys from the forward (fused, call3)=$Q/call3/runs/inkling-swa-rank2_inkling_mxfp8_querybf16.json" \
  --run "F3: ours fp8_e4m3, Q bf16, new keys from the forward (fused, call3)=$Q/call3/runs/inkling-swa-rank2_inkling_fp8_e4m3.json" \
  --run "bf16, fused prologue, new keys from the forward=$Q/call2/runs/inkling-swa-rank2_inkling_auto.json" \
  --run "bf16, fused prologue (tp2 call3)=$T/call3/runs/inkling-swa-rank2_inkling_auto.json" \
  --run "SGLang triton bf16 (tp2 call3)=$T/call3/runs/inkling-swa-rank2_triton_auto_noprefillgraph.json" \
  --pair "A: MXFP8, Q MXFP8, new keys read back (unfused)::B: MXFP8, Q bf16, new keys read back (unfused)" \
  --pair "B: MXFP8, Q bf16, new keys read back (unfused)::C: ours fp8_e4m3, Q bf16, new keys read back (unfused)" \
  --pair "D: MXFP8, Q MXFP8, new keys read back (fused, tp2 call3)::E: MXFP8, Q MXFP8, new keys from the forward (fused)" \
  --pair "E: MXFP8, Q MXFP8, new keys from the forward (fused)::F: ours fp8_e4m3, Q bf16, new keys from the forward (fused)" \
  --pair "E: MXFP8, Q MXFP8, new keys from the forward (fused)::G: SGLang triton fp8_e4m3, Q bf16, new keys from the forward (tp2 call4)" \
  --pair "F: ours fp8_e4m3, Q bf16, new keys from the forward (fused)::G: SGLang triton fp8_e4m3, Q bf16, new keys from the forward (tp2 call4)" \
  --pair "H: MXFP8, Q bf16 (querybf16), new keys from the forward (fused, call3)::F3: ours fp8_e4m3, Q bf16, new keys from the forward (fused, call3)" \
  --pair "H: MXFP8, Q bf16 (querybf16), new keys from the forward (fused, call3)::G: SGLang triton fp8_e4m3, Q bf16, new keys from the forward (tp2 call4)" \
  --pair "E: MXFP8, Q MXFP8, new keys from the forward (fused)::H: MXFP8, Q bf16 (querybf16), new keys from the forward (fused, call3)" \
  --pair "F: ours fp8_e4m3, Q bf16, new keys from the forward (fused)::F3: ours fp8_e4m3, Q bf16, new keys from the forward (fused, call3)" \
  --json $Q/summary.json
