#!/usr/bin/env bash
# Device call: how far the CUDA import chain and the server get; then the first parity pairs.
#   cd .h16 && bash gpu_tests/sglang/probe.sh
. gpu_tests/sglang/gpu_env.sh
START=$SECONDS
python3 gpu_tests/sglang/make_models.py --tokenizer tok --out /tmp/models --device cuda 2>&1 | grep -v Writing
mkdir -p /tmp/logs
for mb in llama-gqa4:triton llama-gqa4:inkling gemma3-swa:triton gemma3-swa:inkling; do
  m=${mb%%:*}; b=${mb##*:}
  if [ $((SECONDS - START)) -gt ${PROBE_BUDGET_S:-430} ]; then echo "skip $mb: budget"; continue; fi
  timeout 200 python3 gpu_tests/sglang/serve_check.py --model /tmp/models/$m --backend $b \
      --out $OUT/${m}_${b}_auto.json --log /tmp/logs/${m}_${b}_auto.log --startup-timeout 170
  grep -v "^\s*\[" /tmp/logs/${m}_${b}_auto.log | grep -B2 -A25 "Traceback\|Error" | head -60
done
cd /tmp && tar -czf $OUT/logs.tgz logs
