#!/usr/bin/env bash
# Assemble the HPC-Ops fp8 decode peer for one device call from a checkout of Tencent/hpc-ops at 6e2eced (the `fetch`
# tool's git dir, or any clone): its decode sources, utils, LICENSE and vendored CUTLASS headers, the binding
# (binding_prologue.cc + entry.cc's fp8 decode entry points, lines 569-817, with at::cuda's stream getter replaced
# by the prologue's + binding_epilogue.cc) and build_and_call.py, as .hpcops/hpc_dec_bundle.tar.xz (git-ignored).
#   bash bench/peers/hpc_ops/make_bundle.sh /work/.mirror/Tencent+hpc-ops/repo [--objects]
# --objects: also compile the .cu sources here (nvcc 13 for sm_90a, about 4 minutes on 2 cores) and pack the
# objects (about 3 MB compressed), so the device only compiles the binding and links (build_and_call.py --build manual
# keeps an object newer than its source).
# Device (carry [".hpcops"]): mkdir -p /tmp/hpc && tar -xJf .hpcops/hpc_dec_bundle.tar.xz -C /tmp/hpc &&
#   cd /tmp/hpc && python3 build_and_call.py --B 32 --hq 32 --hkv 4 --kvlen 4096 --bench
set -euo pipefail
GITDIR=${1:?usage: make_bundle.sh HPC_OPS_GIT_DIR [--objects]}
OBJECTS=${2:-}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/src" "$TMP/ext"
if [ -d "$GITDIR/.git" ]; then GITDIR="$GITDIR/.git"; fi
git --git-dir="$GITDIR" archive 6e2eced LICENSE.txt src/attention/decode src/utils 3rd/cutlass/include \
  src/attention/entry.cc | tar -x -C "$TMP/src"
{ cat "$HERE/binding_prologue.cc"
  sed -n '569,817p' "$TMP/src/src/attention/entry.cc" \
    | sed 's/at::cuda::getCurrentCUDAStream/hpc_dec_detail::getCurrentCUDAStream/'
  cat "$HERE/binding_epilogue.cc"; } > "$TMP/ext/hpc_decode_fp8_binding.cc"
rm "$TMP/src/src/attention/entry.cc"
cp "$HERE/build_and_call.py" "$TMP/"
if [ "$OBJECTS" = "--objects" ]; then
  (cd "$TMP" && "${PYTHON:-python3}" build_and_call.py --cuda-objects-only)
fi
mkdir -p "$ROOT/.hpcops"
tar -C "$TMP" -cJf "$ROOT/.hpcops/hpc_dec_bundle.tar.xz" .
du -h "$ROOT/.hpcops/hpc_dec_bundle.tar.xz"
