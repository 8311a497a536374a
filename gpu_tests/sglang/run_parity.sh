#!/usr/bin/env bash
# Device call: one server per entry MODEL:BACKEND:KV[:TAG], each serving serve_check.py's workload, in order, while
# the call's budget lasts (PARITY_BUDGET_S, default 520 s). Entry TAGs: nograph (--disable-cuda-graph),
# broken (INKLING_TEST_BREAK_SCALE=0.01, see patches/sitecustomize.py), noprefillgraph (--disable-prefill-cuda-graph:
# the Inkling model turns on SGLang's FULL prefill graph, which its triton backend cannot replay: "ValueError: Invalid
# forward mode: forward_mode=<ForwardMode.EXTEND: 1> for CUDA Graph replay"; decode graphs stay on), tp2
# (--tp-size 2: two GPUs, device kind nvidia-h200-x2; gpu_env.sh keeps NVLink multicast off in every process),
# noprologue (SGLANG_OPT_USE_INKLING_FUSED_ATTN_PROLOGUE=0: the Inkling model's unfused q/k/v path), qbf16
# (INKLING_TEST_Q_BF16=1: with noprologue, the Inkling model's Q is not rounded to MXFP8, see patches/), querybf16
# (INKLING_MXFP8_QUERY=bf16, the default: the backend's fused prologues keep the Inkling model's Q in bf16),
# querymxfp8 (INKLING_MXFP8_QUERY=mxfp8: Q rounded to MXFP8, FA4's contract), ngram (--speculative-algorithm NGRAM,
# BFS breadth 1 (SGLang refuses wider trees on a paged pool, page 128 for MXFP8, for every backend but flashinfer),
# the backend turns decode graphs off itself (the runs in bench/results/current/sglang-h200/spec-hicache/ passed
# --disable-cuda-graph); compare.py against the same entry with nograph), ngramtree (NGRAM with SGLang's default BFS
# breadth 10: draft trees, a page-1 (bf16) pool only), smallpool (a device pool of PARITY_SMALL_POOL_TOKENS (8192) tokens),
# eagle (--speculative-algorithm EAGLE, a chain of 3 drafts from make_models' llama-gqa4-eagle draft, seeded dummy
# weights, on SGLang's triton backend over a bf16 draft pool; compare.py against the same entry with nograph),
# eagletree (EAGLE with top-4 trees of 8 drafts: a page-1, bf16 pool only), eagle3 (EAGLE3's chain, the
# llama-gqa4-eagle3 draft), hicache (--enable-hierarchical-cache with smallpool and a host pool of 4x its tokens; with
# PARITY_SERVE_ARGS="--evict-tokens 16000" the workload's documents (3 x 2051 tokens) are pushed out of the device
# pool but stay in the host pool (a flood beyond it evicts them there too: no host hit) and are loaded back, see
# serve_check.py; compare.py against the same entry with smallpool, whose documents are computed again, and without
# it, whose documents stay on the device), eagerverify (INKLING_VERIFY_GRAPHS=0: with ngram/eagle*, decode CUDA graphs
# off, the target's verify steps and EAGLE's draft steps eager; without it, the default, they are captured),
# verifygraph (INKLING_VERIFY_GRAPHS=1, the default since 2026-12-05, named for results recorded before).
# Tags combine with "+", e.g. inkling-swa:triton:auto:tp2+noprefillgraph, llama-gqa4:inkling:mxfp8:ngram+verifygraph.
# PARITY_SERVE_ARGS: more serve_check.py flags for every entry (e.g. "--prompt-logprobs --rescore").
# FlashInfer: with the trimmed 0.7.2 tree carried in ../.fi072 (carry ".fi072") it is importable for EVERY entry, as
# wherever SGLang runs on a GPU: SGLang's flashinfer backend runs, and inkling's extends and 16-bit decodes go
# through it (sglang_inkling_backend/flashinfer); JIT builds in the carried checkout's .cache/flashinfer.
#   cd .h16 && bash gpu_tests/sglang/run_parity.sh llama-gqa4:triton:auto llama-gqa4:inkling:auto ...
. gpu_tests/sglang/gpu_env.sh
START=$SECONDS
# The models the entries name (PARITY_MODELS overrides); one without weights is served with --load-format dummy
# and the seeded initializer (patches/sitecustomize.py, INKLING_TEST_SEEDED_INIT).
MODELS=${PARITY_MODELS:-$( (for e in "$@"; do echo "${e%%:*}"; done; \
  for e in "$@"; do case $e in *eagle3*) echo llama-gqa4-eagle3 ;; *eagle*) echo llama-gqa4-eagle ;; esac; done) \
  | sort -u | paste -sd,)}
python3 gpu_tests/sglang/make_models.py --tokenizer tok --out /tmp/models --device cuda --models "$MODELS" 2>&1 | grep -v Writing
mkdir -p /tmp/logs /tmp/runs
if ls ../.fi072/*.tar.xz > /dev/null 2>&1; then
  [ -d /tmp/fi_site/flashinfer ] || { mkdir -p /tmp/fi_site && tar -xJf ../.fi072/*.tar.xz -C /tmp/fi_site; }
  export PYTHONPATH=/tmp/fi_site:$PYTHONPATH FLASHINFER_WORKSPACE_BASE=$(cd .. && pwd)
fi
. gpu_tests/sglang/flashinfer_jit.sh
# The first server of a fresh machine compiles every Triton kernel cold: Inkling's first bf16 server was healthy only
# after 200 s (bench/results/current/sglang-h200/inkling/call4), later ones in 76-142 s.
STARTUP_S=${PARITY_STARTUP_S:-300}
for entry in "$@"; do
  IFS=: read -r m b kv tag <<< "$entry"
  name=${m}_${b}_${kv}${tag:+_$tag}
  left=$(( ${PARITY_BUDGET_S:-520} - (SECONDS - START) ))
  if [ $left -lt 60 ]; then echo "skip $name: ${left}s left"; continue; fi
  extra=(); envs=()
  for t in ${tag//+/ }; do
    case $t in
      nograph) extra+=(--disable-cuda-graph) ;;
      noprefillgraph) extra+=(--disable-prefill-cuda-graph) ;;
      broken) envs+=(INKLING_TEST_BREAK_SCALE=0.01) ;;
      tp2) extra+=(--tp-size 2) ;;
      noprologue) envs+=(SGLANG_OPT_USE_INKLING_FUSED_ATTN_PROLOGUE=0) ;;
      qbf16) envs+=(INKLING_TEST_Q_BF16=1) ;;
      querybf16) envs+=(INKLING_MXFP8_QUERY=bf16) ;;
      querymxfp8) envs+=(INKLING_MXFP8_QUERY=mxfp8) ;;
      ngram) extra+=(--speculative-algorithm NGRAM --speculative-ngram-max-bfs-breadth 1) ;;
      ngramtree) extra+=(--speculative-algorithm NGRAM) ;;
      verifygraph) envs+=(INKLING_VERIFY_GRAPHS=1) ;;
      eagerverify) envs+=(INKLING_VERIFY_GRAPHS=0) ;;
      smallpool) extra+=(--max-total-tokens ${PARITY_SMALL_POOL_TOKENS:-8192}) ;;
      hicache) extra+=(--enable-hierarchical-cache --hicache-ratio 4 --max-total-tokens ${PARITY_SMALL_POOL_TOKENS:-8192}) ;;
      eagle|eagletree|eagle3)
        [ $t = eagletree ] && spec=(3 4 8) || spec=(3 1 4)  # steps, topk, draft tokens: trees (page 1 only), a chain
        [ $t = eagle3 ] && draft=(EAGLE3 llama-gqa4-eagle3) || draft=(EAGLE llama-gqa4-eagle)
        envs+=(INKLING_TEST_SEEDED_INIT=1)
        extra+=(--speculative-algorithm ${draft[0]} --speculative-draft-model-path /tmp/models/${draft[1]}
                --speculative-draft-load-format dummy --speculative-draft-attention-backend triton
                --speculative-draft-kv-cache-dtype bf16 --speculative-num-steps ${spec[0]}
                --speculative-eagle-topk ${spec[1]} --speculative-num-draft-tokens ${spec[2]}) ;;
      *) echo "entry $entry: unknown tag $t (nograph, noprefillgraph, broken, tp2, noprologue, qbf16, querybf16," \
           "querymxfp8, ngram, ngramtree, smallpool, hicache, eagle, eagletree, eagle3, verifygraph, eagerverify)"
         exit 2 ;;
    esac
  done
  ls /tmp/models/$m/*.safetensors > /dev/null 2>&1 || { extra+=(--load-format dummy); envs+=(INKLING_TEST_SEEDED_INIT=1); }
  t0=$SECONDS
  env "${envs[@]}" timeout $(( left < STARTUP_S + 60 ? left : STARTUP_S + 60 )) python3 gpu_tests/sglang/serve_check.py \
      --model /tmp/models/$m --backend $b --kv-cache-dtype $kv --label $name --out /tmp/runs/$name.json \
      --log /tmp/logs/$name.log --startup-timeout $STARTUP_S ${PARITY_SERVE_ARGS:-} -- "${extra[@]}"
  echo "  ($name took $((SECONDS - t0)) s)"
  grep -v "^\s*\[" /tmp/logs/$name.log | grep -B3 -A3 "Error\b\|Error:\|WARNING.*inkling" | grep -v "^\s*\^" | tail -25 | cut -c1-400
done
fi_jit_save
cd /tmp && tar -czf $OUT/runs.tgz runs logs
