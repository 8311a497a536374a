#!/usr/bin/env bash
# One device call (repository root; carry .vgpu and .fi072): the environment, vLLM's compiled ops checked, the models,
# then one engine per entry MODEL:BACKEND:KV[:TAGS] (gpu_tests/vllm/engine_check.py), in VLLM_LANES parallel lanes
# (default 3: each engine has a fixed 4 GiB pool and 0.2 of the GPU, so they share it), while VLLM_BUDGET_S lasts.
# TAGS, joined by "+": eager (enforce_eager), broken (softmax scale x1.01: patches/sitecustomize.py), serve (vllm serve
# and the OpenAI client instead of the offline LLM), nocompile (compilation mode NONE, FULL decode graphs only),
# fp16 (the model in float16: the parity rule's engines, gpu_tests/vllm/parity.py), again (no change: a second run
# of the entry under its own name, the reference against itself).
# Entries speed:BACKEND:KV time decode steps on llama-gqa4-l16 instead (latency_points.py, VLLM_POINTS), one at a
# time after the parity lanes have ended, alone on the GPU.
# Everything lands in $OUT/runs.tgz (runs/*.json, logs/*.log, env.txt, ops.json), refreshed as entries end.
# FlashInfer's JIT modules (gpu_tests/sglang/flashinfer_jit.sh): a carried .vfijit/flashinfer-jit.tar.xz is unpacked
# first; FI_SAVE_JIT=1 packs what the call built into $OUT/flashinfer-jit.tar.xz (copy it to .vfijit/). Without them
# an entry's first FlashInfer module is built at its start (gemma3-swa's head_dim 256 prefill ran past 240 s).
#   bash gpu_tests/vllm/run_call.sh llama-gqa4:TRITON_ATTN:auto llama-gqa4:CUSTOM:mxfp8 ...
set -uo pipefail
. gpu_tests/vllm/gpu_env.sh || exit 1
FI_JIT_TAR=.vfijit/flashinfer-jit.tar.xz . gpu_tests/sglang/flashinfer_jit.sh
START=$SECONDS
BUDGET=${VLLM_BUDGET_S:-540}
W=/tmp/vrun && mkdir -p $W/runs $W/logs
OUT=${OUT:-/tmp/vout} && mkdir -p "$OUT"
# lanes pack concurrently: each writes its own part file, then renames it (atomic)
pack() { tar -czf "$OUT/runs.tgz.$BASHPID" -C $W . 2>/dev/null && mv "$OUT/runs.tgz.$BASHPID" "$OUT/runs.tgz"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -m pip list 2>/dev/null; } > $W/env.txt
python3 gpu_tests/vllm/check_ops_gpu.py --out $W/ops.json > $W/logs/ops.log 2>&1; echo "ops rc=$?" | tee -a $W/logs/ops.log
MODELS=$(for e in "$@"; do m=${e%%:*}; [ "$m" = speed ] && m=llama-gqa4-l16; echo "$m"; done | sort -u | paste -sd,)
mkdir -p tok && [ -f tok/tokenizer.json ] || xz -dc .vgpu/tokenizer.json.xz > tok/tokenizer.json
cp .vgpu/tokenizer_config.json tok/ 2>/dev/null
# the parity rule's models (gpu_tests/vllm/parity.py MODEL_ARGS: sharper attention, 64 strong output rows); summarize
# rebuilds the same checkpoints on a CPU for the float32 oracle
MODEL_ARGS=$(python3 -c "import sys; sys.path.insert(0, 'gpu_tests/vllm'); import parity; print(' '.join(parity.MODEL_ARGS))")
echo "$MODEL_ARGS" > $W/model_args.txt
python3 gpu_tests/sglang/make_models.py --tokenizer tok --out /tmp/models --device cuda --models "$MODELS" $MODEL_ARGS > $W/logs/models.log 2>&1
echo "models rc=$? ($MODELS) at $((SECONDS - START)) s"
pack
run_entry() {
  local entry=$1 m b kv tag name left extra=() envs=()
  IFS=: read -r m b kv tag <<< "$entry"
  name=${m}_${b}_${kv}${tag:+_$tag}
  left=$(( BUDGET - (SECONDS - START) ))
  if [ $left -lt 45 ]; then echo "skip $name: ${left}s left"; return; fi
  for t in ${tag//+/ }; do
    case $t in
      eager) extra+=(--eager) ;;
      broken) envs+=(INKLING_TEST_BREAK_SCALE=0.01) ;;
      serve) extra+=(--serve --log $W/logs/${name}.server.log) ;;
      nocompile) extra+=(--compilation '{"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}') ;;
      fp16) extra+=(--dtype float16) ;;  # the parity rule's engines (gpu_tests/vllm/parity.py)
      again) ;;  # the same engine a second time, under its own name (the reference against itself)
    esac
  done
  local t0=$SECONDS
  if [ "$m" = speed ]; then
    timeout $(( left < ${VLLM_ENTRY_S:-300} ? left : ${VLLM_ENTRY_S:-300} )) python3 gpu_tests/vllm/latency_points.py \
      --model /tmp/models/llama-gqa4-l16 --backend $b --kv-cache-dtype $kv --points "${VLLM_POINTS:-32x4096,128x4096,16x32768}" --iters "${VLLM_SPEED_ITERS:-3}" \
      --out $W/runs/$name.json > $W/logs/$name.log 2>&1
    echo "$name rc=$? $((SECONDS - t0)) s"; grep -E "decode step" $W/logs/$name.log; pack; return
  fi
  env "${envs[@]}" timeout $(( left < ${VLLM_ENTRY_S:-300} ? left : ${VLLM_ENTRY_S:-300} )) \
    python3 gpu_tests/vllm/engine_check.py --model /tmp/models/$m --backend $b --kv-cache-dtype $kv "${extra[@]}" \
    --label $name --out $W/runs/$name.json > $W/logs/$name.log 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s: $(grep -E "^$name:" $W/logs/$name.log | cut -c1-160)"
  [ $rc -eq 0 ] || grep -E "Error|error|Traceback" $W/logs/$name.log | grep -v "^\s*$" | tail -4
  pack
}
LANES=${VLLM_LANES:-3}
PARITY=() SPEED=()
for entry in "$@"; do if [ "${entry%%:*}" = speed ]; then SPEED+=("$entry"); else PARITY+=("$entry"); fi; done
for ((lane = 0; lane < LANES; lane++)); do
  (
    i=0
    for entry in "${PARITY[@]}"; do
      if [ $((i % LANES)) -eq $lane ]; then run_entry "$entry"; fi
      i=$((i + 1))
    done
  ) &
  sleep 5
done
wait
# the speed entries after every parity engine has ended: alone on the GPU
for entry in "${SPEED[@]}"; do run_entry "$entry"; done
pack
fi_jit_save
echo "done at $((SECONDS - START)) s"
