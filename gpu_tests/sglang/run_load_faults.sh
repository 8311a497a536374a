#!/usr/bin/env bash
# Device call (issue #58): the real SGLang server under load and faults, one server per entry MODEL:KV:MODE, all at
# once on the GPU (each a fixed --max-total-tokens pool and 0.15 of the GPU's memory), while LOAD_BUDGET_S lasts.
# MODE: plain, ngram (NGRAM speculative decoding), hicache (host tier 4x the device pool). Results: $OUT/load-faults/
# (one JSON and one server log per entry) and $OUT/load-faults/tables.md.
#   cd .h16 && bash gpu_tests/sglang/run_load_faults.sh llama-gqa4:mxfp8:plain llama-gqa4:auto:plain \
#       llama-gqa4:mxfp8:ngram llama-gqa4:mxfp8:hicache
. gpu_tests/sglang/gpu_env.sh
START=$SECONDS
BUDGET=${LOAD_BUDGET_S:-540}
MODELS=$(for e in "$@"; do echo "${e%%:*}"; done | sort -u | paste -sd,)
python3 gpu_tests/sglang/make_models.py --tokenizer tok --out /tmp/models --device cuda --models "$MODELS" 2>&1 | grep -v Writing
if ls ../.fi072/*.tar.xz > /dev/null 2>&1; then
  [ -d /tmp/fi_site/flashinfer ] || { mkdir -p /tmp/fi_site && tar -xJf ../.fi072/*.tar.xz -C /tmp/fi_site; }
  export PYTHONPATH=/tmp/fi_site:$PYTHONPATH FLASHINFER_WORKSPACE_BASE=$(cd .. && pwd)
fi
R=${OUT:-/tmp/out}/load-faults && mkdir -p $R
left=$(( BUDGET - (SECONDS - START) ))
for entry in "$@"; do
  IFS=: read -r m kv mode <<< "$entry"
  name=${m}_inkling_${kv}_${mode}
  timeout $left python3 gpu_tests/sglang/load_faults.py --model /tmp/models/$m --backend inkling --kv-cache-dtype $kv \
    --mode $mode --label $name --out $R/$name.json --log $R/$name.server.log ${LOAD_FAULTS_ARGS:-} \
    > $R/$name.out 2>&1 &
  sleep 3
done
wait
python3 gpu_tests/sglang/load_faults.py --summarize $R/*.json --json $R/summary.json > $R/tables.md
cat $R/tables.md
echo "done at $((SECONDS - START)) s"
