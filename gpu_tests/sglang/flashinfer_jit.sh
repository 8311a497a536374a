# Sourced by run_speed.sh and run_parity.sh once FLASHINFER_WORKSPACE_BASE is set: FlashInfer's JIT modules, built
# under $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer, take minutes on a machine without them (the first FlashInfer
# entry's start-up, 142-165 s: bench/results/current/sglang-h200/speed/call-four-peers/, .../call-flashinfer-decode/
# attempt-host-lengths/), and a machine given back loses them.
# - a carried FI_JIT_TAR (default ../.fijit/flashinfer-jit.tar.xz: carry ".fijit"; the vLLM call's own modules
#   travel as .vfijit/) is unpacked there before the entries run;
# - FI_SAVE_JIT=1: fi_jit_save packs them into $OUT/flashinfer-jit.tar.xz after the entries (copy it into .fijit/ to
#   carry it next time; the carry limit is 64 MiB for everything). llama-gqa4-l16's modules: 4.0 MB packed, 24 MB
#   unpacked; with them carried the first FlashInfer entry took 46-49 s instead of 202 s
#   (bench/results/current/sglang-h200/speed/call-fused-store*/). Modules of other shapes (gemma3-swa's head_dim
#   256) are still built at their first use.
FI_JIT_TAR=${FI_JIT_TAR:-../.fijit/flashinfer-jit.tar.xz}
if [ -n "${FLASHINFER_WORKSPACE_BASE:-}" ] && [ -f "$FI_JIT_TAR" ]; then
  mkdir -p "$FLASHINFER_WORKSPACE_BASE/.cache" && tar -xJf "$FI_JIT_TAR" -C "$FLASHINFER_WORKSPACE_BASE/.cache" \
    && echo "flashinfer JIT cache: unpacked $(du -sh "$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer" | cut -f1)"
fi
fi_jit_save() {
  if [ "${FI_SAVE_JIT:-0}" = 1 ] && [ -d "${FLASHINFER_WORKSPACE_BASE:-/nonexistent}/.cache/flashinfer" ]; then
    # everything, sources and objects too: ninja rebuilds a module whose inputs are missing or newer than it
    tar -cJf "$OUT/flashinfer-jit.tar.xz" -C "$FLASHINFER_WORKSPACE_BASE/.cache" flashinfer \
      && echo "flashinfer JIT cache: $OUT/flashinfer-jit.tar.xz, $(du -h "$OUT/flashinfer-jit.tar.xz" | cut -f1)"
  fi
}
