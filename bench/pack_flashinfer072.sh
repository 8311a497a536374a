#!/usr/bin/env bash
# FlashInfer 0.7.2.post1's wheel (62 MB) and the tree of this checkout do not fit one device call's 64 MiB carry.
# This unpacks it with apache-tvm-ffi 0.1.11 and drops source trees its fa2/fa3 prefill, decode and XQA JIT builds do
# not compile (MoE, GDN/KDA, Blackwell-only and "cake_*" kernels; CUTLASS examples, tests, tools except
# tools/util, whose cutlass/util/command_line.h the FA3 sm90 prefill includes): a 16 MB tar.xz.
# Needs the two wheels in .whl072/ (bench/results/current/README.md says how to download them).
#   bash bench/pack_flashinfer072.sh        # writes .fi072/flashinfer-0.7.2.post1-sm90-trim.tar.xz
# On the device (carry [".fi072"]): mkdir -p /tmp/site && tar -xJf .fi072/*.tar.xz -C /tmp/site
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for w in "$ROOT"/.whl072/flashinfer_python-0.7.2.post1-*.whl "$ROOT"/.whl072/apache_tvm_ffi-0.1.11-*.whl; do
  unzip -q -o "$w" -d "$TMP"
done
data=$TMP/flashinfer/data
rm -rf "$data"/csrc/cake_* "$data"/csrc/kda "$data"/csrc/gdn "$data"/csrc/fused_moe "$data"/csrc/blackwell_* \
    "$data"/csrc/experimental "$data"/csrc/alphamoe* "$data"/cutlass/{examples,test,python,docs,media}
find "$data"/cutlass/tools -mindepth 1 -maxdepth 1 ! -name util -exec rm -rf {} +
mkdir -p "$ROOT/.fi072"
tar -C "$TMP" -cJf "$ROOT/.fi072/flashinfer-0.7.2.post1-sm90-trim.tar.xz" .
du -h "$ROOT/.fi072/flashinfer-0.7.2.post1-sm90-trim.tar.xz"
