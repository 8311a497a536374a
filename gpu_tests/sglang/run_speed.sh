#!/usr/bin/env bash
# Device call: one_batch_speed.py (one process per entry BACKEND:KV, on one model), in order, while the call's
# budget lasts. Writes $OUT/speed.json (one record per entry; a failed entry: its rc and the log's last lines) and
# $OUT/speed.log (every entry's full log).
#   cd .h16 && bash gpu_tests/sglang/run_speed.sh inkling:mxfp8 triton:auto inkling:auto triton:fp8_e4m3
# Environment: SPEED_MODEL (llama-gqa4-l16), SPEED_POINTS (1x4096,32x4096,128x4096,1x32768,32x32768,128x32768),
# SPEED_STEPS (64), SPEED_MEM (0.55, --mem-fraction-static: a bf16 pool of llama-gqa4-l16 then holds the 4.2M tokens
# of 128 x 32k), SPEED_BUDGET_S (540), SPEED_TIMEOUT_S (240, per entry), SPEED_ARGS (more one_batch_speed.py
# arguments, e.g. "--warmup-steps 8"). Exit status: 1 if any entry failed.
# FlashInfer: the trimmed 0.7.2 tree carried in ../.fi072 (bench/pack_flashinfer072.sh; carry ".fi072") is unpacked
# to /tmp/fi_site and importable for EVERY entry, as it is wherever SGLang runs on a GPU (inkling's extends then go
# through it, see sglang_inkling_backend/flashinfer); without it, a flashinfer entry needs FlashInfer's wheels in
# ../.whl (carry ".whl"), installed for that entry's process only. FlashInfer's JIT builds go to the carried
# checkout's .cache/flashinfer (FLASHINFER_WORKSPACE_BASE), kept between calls on a warm machine.
# FlashInfer's JIT cache can travel between machines: gpu_tests/sglang/flashinfer_jit.sh (carry ".fijit", FI_SAVE_JIT=1).
# An entry BACKEND:KV:EXTEND sets INKLING_EXTEND_KERNEL=EXTEND for that entry (e.g. inkling:mxfp8:triton);
# BACKEND:KV:EXTEND:SRC puts the sglang_inkling_backend in folder SRC (relative to this checkout, e.g. a
# `git archive` of an older commit) first on that entry's PYTHONPATH, to time two versions in one call.
. gpu_tests/sglang/gpu_env.sh || exit 1
START=$SECONDS
MODEL=${SPEED_MODEL:-llama-gqa4-l16}
POINTS=${SPEED_POINTS:-1x4096,32x4096,128x4096,1x32768,32x32768,128x32768}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
set -o pipefail
python3 gpu_tests/sglang/make_models.py --tokenizer tok --out /tmp/models --models "$MODEL" --device cuda 2>&1 \
    | grep -v Writing || { echo "make_models.py failed"; exit 1; }
set +o pipefail
rm -rf /tmp/speed && mkdir -p /tmp/speed
FI_ALL=""
if ls ../.fi072/*.tar.xz > /dev/null 2>&1; then
  [ -d /tmp/fi_site/flashinfer ] || { mkdir -p /tmp/fi_site && tar -xJf ../.fi072/*.tar.xz -C /tmp/fi_site; }
  FI_ALL=/tmp/fi_site
  export FLASHINFER_WORKSPACE_BASE=$(cd .. && pwd)
fi
. gpu_tests/sglang/flashinfer_jit.sh
for entry in "$@"; do
  IFS=: read -r b kv extend src <<< "$entry"
  name=${b}_${kv}${extend:+_extend_$extend}${src:+_$(basename "$src")}
  left=$(( ${SPEED_BUDGET_S:-540} - (SECONDS - START) ))
  if [ $left -lt 60 ]; then echo "skip $name: ${left}s left" | tee -a /tmp/speed/skipped.txt; continue; fi
  limit=${SPEED_TIMEOUT_S:-240}; [ $left -lt $limit ] && limit=$left
  t0=$SECONDS
  path=$PYTHONPATH
  [ -n "$FI_ALL" ] && path=$FI_ALL:$PYTHONPATH
  [ -n "$src" ] && path=$(cd "$src" && pwd):$path
  if [ "$b" = flashinfer ] && [ -z "$FI_ALL" ]; then
    if ! ls ../.whl/flashinfer_python-*.whl > /dev/null 2>&1; then
      echo "== $name: not run: no FlashInfer wheel in ../.whl (carry \".whl\")" | tee /tmp/speed/$name.log
      echo 2 > /tmp/speed/$name.rc; continue
    fi
    [ -d /tmp/fi_site/flashinfer ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fi_site ../.whl/flashinfer_python-*.whl
    path=/tmp/fi_site:$PYTHONPATH
  fi
  PYTHONPATH=$path INKLING_EXTEND_KERNEL=${extend:-auto} timeout $limit python3 gpu_tests/sglang/one_batch_speed.py --model /tmp/models/$MODEL --attention-backend $b \
      --kv-cache-dtype $kv --points "$POINTS" --steps ${SPEED_STEPS:-64} --mem-fraction-static ${SPEED_MEM:-0.55} \
      --label $name --out /tmp/speed/$name.json $SPEED_ARGS > /tmp/speed/$name.log 2>&1
  rc=$?
  echo "$rc" > /tmp/speed/$name.rc
  echo "== $name: rc=$rc, $((SECONDS - t0)) s (limit $limit s)"
  grep -a "^$name" /tmp/speed/$name.log | cut -c1-300
  [ $rc -ne 0 ] && grep -av "Ignore import error" /tmp/speed/$name.log | tail -15 | cut -c1-400
done
fi_jit_save
python3 - "$OUT" "$@" <<'EOF'
import json, sys
from pathlib import Path
out, entries = Path(sys.argv[1]), sys.argv[2:]
records = []
def entry_name(entry):
    b, kv, *rest = entry.split(":") + ["", ""]
    extend, src = rest[0], rest[1]
    return f"{b}_{kv}" + (f"_extend_{extend}" if extend else "") + (f"_{Path(src).name}" if src else "")
for entry in entries:
    name = entry_name(entry)
    base = Path("/tmp/speed") / name
    rc = base.with_suffix(".rc")
    if not rc.exists():
        records.append({"label": name, "skipped": True})
        continue
    record = json.loads(base.with_suffix(".json").read_text()) if base.with_suffix(".json").exists() else {"label": name}
    record["rc"] = int(rc.read_text())
    if record["rc"] != 0:
        record["log_tail"] = base.with_suffix(".log").read_text(errors="replace").splitlines()[-40:]
    records.append(record)
(out / "speed.json").write_text(json.dumps(records, indent=1))
with open(out / "speed.log", "w") as log:
    for entry in entries:
        path = Path("/tmp/speed") / (entry_name(entry) + ".log")
        if path.exists():
            log.write(f"===== {entry}\n" + path.read_text(errors="replace"))
sys.exit(1 if any(r.get("rc", 0) != 0 for r in records) else 0)
EOF
