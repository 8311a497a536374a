"""Compile every Triton kernel of the package for every GPU target on a machine without a GPU, and table what each
compile uses.

    python tools/compile_targets.py --out DIR [--targets sm_80 gfx942 ...] [--kernels decode_blocks extend ...]

Targets (``TARGETS``): NVIDIA sm_80, sm_86, sm_89, sm_90, sm_100, sm_120 and AMD gfx942 (MI300), gfx950 (MI350).
Kernels (``CASES``, each in the configurations its launcher uses at head_dim 128, 16 query heads over 2 KV heads):
decode stage 1 (``decode_blocks``, ``decode_tiles``: every configuration ``plan.choose_config`` returns;
``decode_hopper``, the Gluon kernel, on sm_90 only), the split merge (``decode_merge``), ``extend``, the MXFP8 K/V
store and the 16-bit copy (``kv_store``), the rail gather (``gather_rails``), the gather (``gather_kv``) and the
fused decode prologue (``prologue``, head_dim 128 only).
8-bit pools are passed as the route passes them: as bytes (``*u8``) on NVIDIA before sm_89
(``plan.e4m3_by_integers``), as ``float8e4nv`` everywhere else, AMD included (the ROCm route passes SGLang's
float8_e4m3fn pool as it is).

Writes DIR/compile_targets.json (one record per compile) and DIR/compile_targets.md (the tables). Read from each
compiled artifact:
- NVIDIA: registers per thread, stack frame and spill stores / loads in bytes (ptxas' report, which Triton prints
  with TRITON_DUMP_PTXAS_LOG), shared memory (Triton's metadata: the dynamic shared memory a launch asks for);
- AMD: architectural VGPRs, AGPRs (``; NumVgprs`` / ``; NumAgprs``; ``.vgpr_count`` is their sum), SGPRs, VGPR and
  SGPR spill counts and scratch bytes per lane (``.private_segment_fixed_size``) from the AMDGCN, waves per SIMD
  (``; Occupancy``), LDS (Triton's metadata: Triton's LDS is dynamic, so ``.group_segment_fixed_size`` is 0);
- both: the dot instructions in the code (mma.sync / wgmma / tcgen05.mma; v_mfma / v_dot2 / v_wmma) and how e4m3
  bytes become floats (the conversion instructions, or which software sequence).

Each target compiles in its own process: a compiler crash costs that one compile, recorded as not compiled, and a
new process goes on with the rest. Every compile is fresh (``always_compile``), so ptxas reports each time. The
numbers are the installed Triton's (the GPU machine runs 3.6; tools/compile_sm90.py says how to install it aside).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

os.environ.pop("TRITON_INTERPRET", None)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (ROOT, os.path.join(ROOT, "tools")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

# name -> (Triton backend, arch, warp size)
TARGETS = {
    "sm_80": ("cuda", 80, 32), "sm_86": ("cuda", 86, 32), "sm_89": ("cuda", 89, 32), "sm_90": ("cuda", 90, 32),
    "sm_100": ("cuda", 100, 32), "sm_120": ("cuda", 120, 32),
    "gfx942": ("hip", "gfx942", 64), "gfx950": ("hip", "gfx950", 64),
}
D, G, HKV = 128, 8, 2  # head_dim, query heads per KV head, KV heads
HQ = G * HKV
KV_FORMAT = {"bf16": 0, "fp8": 1, "mxfp8": 2}  # device.KV_FLOAT / KV_FP8 / KV_MXFP8
POOLS = {"mxfp8": "MXFP8", "fp8": "per-tensor fp8", "bf16": "bf16", "none": "-"}  # "none": reads no pool
RESULTS_JSON, RESULTS_MD = "compile_targets.json", "compile_targets.md"
# Environment variables of tools/compile_sm90.py that would change the launchers' configurations
COMPILE_SM90_OVERRIDES = ("COMPILE_EXTRA", "COMPILE_OPTIONS", "COMPILE_UNMARKED")


def gpu_target(name: str):
    from triton.backends.compiler import GPUTarget

    return GPUTarget(*TARGETS[name])


def pool_as_bytes(target_name: str) -> bool:
    """Whether the route passes an 8-bit pool as bytes on this target: NVIDIA before sm_89 (no e4m3 conversions)."""
    from sglang_inkling_backend.triton.plan import NATIVE_E4M3_CAPABILITY

    backend, arch, _ = TARGETS[target_name]
    return backend == "cuda" and arch < NATIVE_E4M3_CAPABILITY[0] * 10 + NATIVE_E4M3_CAPABILITY[1]


def pool_pointer(pool: str, as_bytes: bool) -> str:
    """The K/V buffers' pointer type at a launch (``inputs.kv_data``)."""
    if pool == "bf16":
        return "*bf16"
    return "*u8" if as_bytes else "*fp8e4nv"


def scale_pointer(pool: str, as_bytes: bool) -> str:
    """The scale arguments' pointer type (``inputs.scale_args``): MXFP8's scale bytes, else the K buffer as the
    kernels take it (unused by the kernel; bytes where the pool is passed as bytes)."""
    return "*u8" if pool == "mxfp8" else pool_pointer(pool, as_bytes)


SCALE_ARGUMENT_KERNELS = ("decode_blocks", "decode_tiles", "extend", "gather_kv")  # take scale_args' pointers


def pointer_attrs(target) -> list:
    """A launch's marks on a torch tensor argument: 16-byte aligned; on AMD also within 2 GB (buffer operations,
    Triton's default ``AMDGCN_USE_BUFFER_OPS``), as for every tensor of a layer under 2 GB."""
    import triton

    attrs = [["tt.divisibility", 16]]
    if target.backend == "hip" and triton.knobs.amd.use_buffer_ops:
        attrs.append(["tt.pointer_range", 32])
    return attrs


def compile_launch(fn, args: dict, target, options: dict):
    """``fn`` compiled as a launch with ``args`` specializes it (by name: a pointer's type such as ``"*bf16"``, an
    int, a float, or a constexpr's value; a constexpr left out takes its default). As Triton's JIT does: an int equal
    to 1 becomes a constant, an int divisible by 16 is marked so, floats are fp32."""
    import triton
    from triton.compiler import ASTSource

    sig, consts, attrs = {}, {}, {}
    for i, param in enumerate(fn.params):
        name = param.name
        if name not in args and not param.has_default:
            raise KeyError(f"{fn.__name__}: no value for argument {name!r}")
        value = args.get(name, param.default)
        if param.is_constexpr:
            sig[name], consts[name] = "constexpr", value
        elif isinstance(value, str):
            sig[name], attrs[(i,)] = value, pointer_attrs(target)
        elif isinstance(value, bool):
            raise TypeError(f"{fn.__name__}: a bool for the runtime argument {name!r}")
        elif isinstance(value, int):
            if value == 1:
                sig[name], consts[name] = "constexpr", 1
                continue
            sig[name] = "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: cannot specialize {name}={value!r}")
    return triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs), target=target, options=options)


# ---------------------------------------------------------------------------------------------------------------
# The kernels, as their launchers configure them
# ---------------------------------------------------------------------------------------------------------------

def _decode(target, as_bytes, pool, paged, block_n, warps, stages, extra=None):
    """Decode stage 1 through tools/compile_sm90.compile_decode (its marks matched the GPU machine's JIT)."""
    from compile_sm90 import compile_decode

    sf = scale_pointer(pool, as_bytes)
    return compile_decode(D=D, G=G, HKV=HKV, fmt=pool, block_n=block_n, warps=warps, stages=stages, paged=paged,
                          extra=extra, e4m3_bytes=as_bytes, target=target, arg_types={"ksf_ptr": sf, "vsf_ptr": sf})


def _hopper(target, as_bytes, pool):
    """The Gluon kernel as ``decode_hopper.launch_decode_hopper`` launches a 3-stage plan (no extra options)."""
    from compile_hopper import compile_hopper

    return compile_hopper(D=D, G=G, block_n=128, stages=3, hkv=HKV)


def _merge(target, as_bytes, pool, block_d, split_block):
    from sglang_inkling_backend.triton.decode_merge import decode_merge_kernel

    # after the block kernel over a page table: ALIGN = BLOCK_N = 32; 12 splits (not a multiple of 16)
    args = dict(part_o_ptr="*fp32", part_lse_ptr="*fp32", lens_ptr="*i32", sinks_ptr="*bf16", out_ptr="*bf16",
                stride_ob=HQ * D, stride_oh=D, window=0, split_len=1024, max_splits=12,
                HQ=HQ, D=D, HAS_WINDOW=False, HAS_SINKS=False, SPLIT_BLOCK=split_block, ALIGN=32, BLOCK_D=block_d,
                PAGE_TABLE=True, BLOCK_N=32)
    return compile_launch(decode_merge_kernel, args, target, {"num_warps": 4})


def _verify_merge(target, as_bytes, pool):
    from sglang_inkling_backend.triton.extend_attention import verify_merge_kernel

    args = dict(part_o_ptr="*fp32", part_lse_ptr="*fp32", sinks_ptr="*bf16", out_ptr="*bf16", stride_ot=HQ * D,
                stride_oh=D, HQ=HQ, D=D, NUM_SPLITS=32, HAS_SINKS=False)
    return compile_launch(verify_merge_kernel, args, target, {"num_warps": 4})


def _extend(target, as_bytes, pool, tree=False, uniform=0, splits=1):
    import triton.language as tl

    from sglang_inkling_backend.triton.extend_attention import extend_kernel

    kv, sf = pool_pointer(pool, as_bytes), scale_pointer(pool, as_bytes)
    # paged_extend_attention's defaults: block_rows 64 -> BLOCK_R 64 rows = 8 tokens x 8 heads, block_n 64; rails
    args = dict(q_ptr="*bf16", k_ptr=kv, v_ptr=kv, ksf_ptr=sf, vsf_ptr=sf, lens_ptr="*i32", index_ptr="*i32",
                stride_index_row=0, qo_indptr_ptr="*i32", block_req_ptr="*i32", block_row_ptr="*i32",
                rel_bias_ptr="*bf16", sinks_ptr="*bf16", out_ptr="*bf16", tree_mask_ptr="*u8",
                mask_indptr_ptr="*i64", depth_ptr="*i64", stride_qt=HQ * D, stride_qh=D, stride_k_slot=HKV * D, stride_k_head=D, stride_v_slot=HKV * D,
                stride_v_head=D, stride_rb_row=0, stride_rb_head=0, rel_extent=0, stride_ot=HQ * D, stride_oh=D,
                sm_scale=D ** -0.5, k_scale=1.0, v_scale=1.0, logit_cap=0.0, window=0,
                part_o_ptr="*fp32", part_lse_ptr="*fp32", split_min=256,
                G=G, BLOCK_M=8, BLOCK_R=64, D=D, HKV=HKV, BLOCK_N=64, KV_FORMAT=KV_FORMAT[pool],
                PAGE=128 if pool == "mxfp8" else 1, INTERLEAVED=pool == "mxfp8", DOT_DTYPE=tl.bfloat16,
                HAS_REL_BIAS=False, HAS_WINDOW=False, HAS_CAP=False, HAS_SINKS=False, PAGE_TABLE=False, KV_PAGE=0,
                HAS_TREE=tree, UNIFORM_QLEN=uniform, NUM_SPLITS=splits)
    return compile_launch(extend_kernel, args, target, {"num_warps": 4, "num_stages": 2})


def _kv_store(target, as_bytes, pool):
    from sglang_inkling_backend.triton.kv_store import quantize_store_kernel

    args = dict(k_ptr="*bf16", v_ptr="*bf16", loc_ptr="*i64", kbuf_ptr="*u8", vbuf_ptr="*u8", ksf_ptr="*u8",
                vsf_ptr="*u8", stride_kt=HKV * D, stride_kh=D, stride_vt=HKV * D, stride_vh=D,
                stride_buf_slot=HKV * D, stride_buf_head=D, HKV=HKV, D=D, PAGE=128, INTERLEAVED=True)
    return compile_launch(quantize_store_kernel, args, target, {"num_warps": 1})


def _copy_store(target, as_bytes, pool):
    from sglang_inkling_backend.triton.kv_store import copy_store_kernel

    args = dict(k_ptr="*bf16", v_ptr="*bf16", loc_ptr="*i64", kbuf_ptr="*bf16", vbuf_ptr="*bf16",
                stride_kt=HKV * D, stride_kh=D, stride_vt=HKV * D, stride_vh=D, stride_buf_slot=HKV * D,
                stride_buf_head=D, HKV=HKV, D=D, BLOCK_H=HKV)
    return compile_launch(copy_store_kernel, args, target, {"num_warps": 1})


def _gather_rails(target, as_bytes, pool):
    from sglang_inkling_backend.triton.gather_rails import BLOCK, gather_rails_kernel

    args = dict(table_ptr="*i32", stride_table_row=4096, stride_table_col=1, rows_ptr="*i64", indptr_ptr="*i64",
                start_ptr="*i64", out_ptr="*i64", BLOCK=BLOCK)
    return compile_launch(gather_rails_kernel, args, target, {"num_warps": 4})


def _gather(target, as_bytes, pool):
    import triton.language as tl

    from sglang_inkling_backend.triton.gather_kv import gather_kv_kernel

    kv, sf = pool_pointer(pool, as_bytes), scale_pointer(pool, as_bytes)
    args = dict(k_ptr=kv, v_ptr=kv, ksf_ptr=sf, vsf_ptr=sf, slots_ptr="*i32", num_rows=1000, k_out_ptr="*bf16",
                v_out_ptr="*bf16", stride_k_slot=HKV * D, stride_k_head=D, stride_v_slot=HKV * D, stride_v_head=D,
                HKV=HKV, D=D, BLOCK_N=32, KV_FORMAT=KV_FORMAT[pool], PAGE=128 if pool == "mxfp8" else 1,
                INTERLEAVED=pool == "mxfp8", OUT_DTYPE=tl.bfloat16)
    return compile_launch(gather_kv_kernel, args, target, {})  # the launcher sets no options


def _prologue(target, as_bytes, pool):
    from sglang_inkling_backend.triton.prologue import _inkling_prologue_decode_kernel

    mx = pool == "mxfp8"
    q_out = "*u8" if mx else "*bf16"
    # rows [q 2048 | k 256 | v 256 | 2048 more]; conv width 4: weights [256, 4] (stride 1 specializes to 1)
    args = dict(qkvr_ptr="*bf16", row_stride=4608, q_off=0, k_off=HQ * D, v_off=HQ * D + HKV * D,
                k_cache_ptr="*bf16", v_cache_ptr="*bf16", cache_stride_slot=3 * HKV * D, cache_stride_w=HKV * D,
                cache_indices_ptr="*i32", cache_mask_ptr="*u8", k_weight_ptr="*bf16", v_weight_ptr="*bf16",
                weight_stride_c=4, weight_stride_w=1, q_gamma_ptr="*bf16", k_gamma_ptr="*bf16", tau_ptr="*bf16",
                eps=1e-6, q_out_ptr=q_out, k_out_ptr="*bf16", v_out_ptr="*bf16", sfq_ptr="*u8" if mx else "*bf16",
                loc_ptr="*i64", k_buf_ptr=q_out, v_buf_ptr=q_out, kv_slot_stride=HKV * D,
                sfk_ptr="*u8" if mx else "*bf16", sfv_ptr="*u8" if mx else "*bf16", track_mask_ptr="*u8",
                track_indices_ptr="*i64", track_stride=0, num_cache_slots=257, num_kv_slots=1024 * 128,
                HQ=HQ, HKV=HKV, Q_HEADS=4, NUM_Q_PROGRAMS=HQ // 4, W=4, PAGE=128, USE_SILU=False,
                USE_RESIDUAL=True, HAS_TAU=False, DO_TRACK=False, DO_STORE=True, MXFP8=mx, Q_MXFP8=mx)
    return compile_launch(_inkling_prologue_decode_kernel, args, target, {"num_warps": 4})


@dataclass(frozen=True)
class Case:
    kernel: str  # --kernels name
    config: str  # the launch configuration in words
    pool: str  # "mxfp8", "fp8" (per-tensor), "bf16", "none"
    build: Callable = field(compare=False)  # (GPUTarget, pool as bytes, pool) -> the compiled kernel
    only: tuple = ()  # the targets it is built for (empty: every target)
    reads_e4m3: bool = True  # whether it converts the pool's e4m3 bytes to floats (the store and prologue encode)


def _cases() -> list:
    page_table = {"PAGE_TABLE": True, "KV_PAGE": 128}
    cases = []
    for pool in ("mxfp8", "fp8"):
        cases.append(Case("decode_blocks", "BLOCK_N 32, 1 warp, 3 stages, page table (8-bit pools, >= 512 programs, "
                          "or mid-size batches)", pool,
                          functools.partial(_decode, paged="blocks", block_n=32, warps=1, stages=3, extra=page_table)))
    cases.append(Case("decode_blocks", "as above + relative bias, window (Inkling mode)", "mxfp8",
                      functools.partial(_decode, paged="blocks", block_n=32, warps=1, stages=3,
                                        extra=dict(page_table, HAS_REL_BIAS=True, HAS_WINDOW=True))))
    for pool in ("mxfp8", "fp8"):
        cases.append(Case("decode_tiles", "BLOCK_N 64, 4 warps, 3 stages, page table (8-bit pools, small batches)",
                          pool, functools.partial(_decode, paged=True, block_n=64, warps=4, stages=3,
                                                  extra=page_table)))
    for pool in ("mxfp8", "fp8", "bf16"):
        cases.append(Case("decode_tiles", "BLOCK_N 64, 2 warps, 2 stages, per-token rails", pool,
                          functools.partial(_decode, paged=False, block_n=64, warps=2, stages=2)))
    cases.append(Case("decode_tiles", "BLOCK_N 64, 2 warps, 2 stages, page table (16-bit pools)", "bf16",
                      functools.partial(_decode, paged=True, block_n=64, warps=2, stages=2,
                                        extra={"PAGE_TABLE": True, "KV_PAGE": 64})))
    cases.append(Case("decode_tiles", "BLOCK_N 16, 2 warps, 2 stages, page table of 16-slot pages", "bf16",
                      functools.partial(_decode, paged=True, block_n=16, warps=2, stages=2,
                                        extra={"PAGE_TABLE": True, "KV_PAGE": 16})))
    cases.append(Case("decode_hopper", "BLOCK_N 128, 4 warps, 3 stages, page table (Gluon, sm_90a)", "mxfp8",
                      _hopper, only=("sm_90",)))
    cases.append(Case("decode_merge", "BLOCK_D 128, SPLIT_BLOCK 32, 4 warps", "none",
                      functools.partial(_merge, block_d=128, split_block=32), reads_e4m3=False))
    cases.append(Case("decode_merge", "BLOCK_D 32, SPLIT_BLOCK 128, 4 warps (small batches)", "none",
                      functools.partial(_merge, block_d=32, split_block=128), reads_e4m3=False))
    for pool in ("mxfp8", "fp8", "bf16"):
        cases.append(Case("extend", "BLOCK_R 64 (8 tokens x 8 heads), BLOCK_N 64, 4 warps, 2 stages, rails", pool,
                          _extend))
    for pool in ("mxfp8", "bf16"):
        cases.append(Case("extend", "the same with a verify step's tree mask (HAS_TREE)", pool,
                          functools.partial(_extend, tree=True)))
    cases.append(Case("extend", "a verify step laid out from its shapes (UNIFORM_QLEN 6: uniform_verify_attention)",
                      "mxfp8", functools.partial(_extend, tree=True, uniform=6)))
    cases.append(Case("extend", "the same split over its keys (NUM_SPLITS 32: a small batch's verify)", "mxfp8",
                      functools.partial(_extend, tree=True, uniform=6, splits=32)))
    cases.append(Case("verify_merge", "NUM_SPLITS 32, 4 warps (the split verify's merge)", "none", _verify_merge,
                      reads_e4m3=False))
    cases.append(Case("kv_store", "1 warp, interleaved scales (page 128)", "mxfp8", _kv_store, reads_e4m3=False))
    cases.append(Case("kv_store", "the 16-bit copy (copy_store_kernel), 1 warp", "bf16", _copy_store,
                      reads_e4m3=False))
    cases.append(Case("gather_rails", "BLOCK 1024, 4 warps (a graph step's rails)", "none", _gather_rails,
                      reads_e4m3=False))
    for pool in ("mxfp8", "fp8", "bf16"):
        cases.append(Case("gather_kv", "BLOCK_N 32, bf16 out, default warps and stages", pool, _gather))
    for pool in ("mxfp8", "bf16"):
        cases.append(Case("prologue", "Q_HEADS 4, conv width 4, K/V store, 4 warps", pool, _prologue,
                          reads_e4m3=False))
    return cases


CASES = _cases()
KERNELS = tuple(dict.fromkeys(case.kernel for case in CASES))


def cases_for(target_name: str, kernels=None) -> list:
    """Indices into ``CASES`` of the compiles for this target (of ``kernels`` only, when given)."""
    return [i for i, case in enumerate(CASES)
            if (not case.only or target_name in case.only) and (kernels is None or case.kernel in kernels)]


# ---------------------------------------------------------------------------------------------------------------
# Reading the compiled artifact
# ---------------------------------------------------------------------------------------------------------------

def ptxas_report(log: str) -> dict:
    """Registers, stack frame and spill bytes from ptxas' -v report (None where it says nothing)."""
    regs = re.search(r"Used (\d+) registers", log)
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return {"registers": int(regs.group(1)) if regs else None,
            "stack_frame_bytes": int(frame.group(1)) if frame else None,
            "spill_store_bytes": int(frame.group(2)) if frame else None,
            "spill_load_bytes": int(frame.group(3)) if frame else None}


def amdgcn_report(asm: str) -> dict:
    """Register, spill, scratch and occupancy numbers of the AMDGCN's kernel metadata and the assembler's
    comments."""
    def number(pattern):
        found = re.search(pattern, asm, re.M)
        return int(found.group(1)) if found else None

    return {"vgprs": number(r"^; NumVgprs: (\d+)"), "agprs": number(r"^; NumAgprs: (\d+)"),
            "vgpr_count": number(r"^\s+\.vgpr_count:\s+(\d+)"), "sgpr_count": number(r"^\s+\.sgpr_count:\s+(\d+)"),
            "vgpr_spill_count": number(r"^\s+\.vgpr_spill_count:\s+(\d+)"),
            "sgpr_spill_count": number(r"^\s+\.sgpr_spill_count:\s+(\d+)"),
            "scratch_bytes": number(r"^\s+\.private_segment_fixed_size:\s+(\d+)"),
            "static_lds_bytes": number(r"^\s+\.group_segment_fixed_size:\s+(\d+)"),
            "waves_per_simd": number(r"^; Occupancy: (\d+)")}


def dot_instructions(kernel, backend: str) -> dict:
    """Static counts of the matrix instructions in the code, by short name."""
    counts = collections.Counter()
    if backend == "cuda":
        for op in re.findall(r"\b(mma\.sync\.aligned\.[\w.]+|wgmma\.mma_async\.[\w.]+|tcgen05\.mma[\w.:]*)",
                             kernel.asm["ptx"]):
            parts = op.split(".")
            shape = next((p for p in parts if re.fullmatch(r"m\d+n\d+k\d+", p)), "")
            if op.startswith("mma."):
                counts[f"mma.sync.{shape}.{parts[-3]}"] += 1  # mma...m16n8k16.row.col.f32.f16.f16.f32: A is f16
            elif op.startswith("wgmma."):
                counts[f"wgmma.{shape}.{parts[-2]}"] += 1  # wgmma...m64n32k16.f32.f16.f16
            else:
                counts["tcgen05.mma"] += 1
    else:
        counts.update(re.findall(r"^\s+(v_mfma_\w+|v_wmma_\w+|v_dot2\w*)", kernel.asm["amdgcn"], re.M))
    return dict(sorted(counts.items()))


# gfx942's software e4m3fn -> fp16 conversion (Triton's Fp8E4M3FN_to_Fp16 for CDNA3 and older): the NaN half and
# the fp16 bits of the 7 subnormal codes 0x01..0x07, selected by v_cndmask (see e4m3fn_to_fp16_like_gfx942 in
# tests/triton_tests/test_compile_targets.py)
GFX942_F16_SEQUENCE_CONSTANTS = ("0x7e00", "0x1800", "0x1c00", "0x1e00", "0x2000", "0x2100", "0x2200", "0x2300")
# gfx942's software e4m3fn -> bf16 conversion: (byte & 0x7f) << 20 as a float32 times 2**120 (0x7b800000)
GFX942_BF16_SEQUENCE = re.compile(r"v_(?:pk_)?mul_f32\w*\s[^\n]*0x7b800000")


def e4m3_decoding(kernel, backend: str, pool_arg: str) -> dict:
    """How the code turns the pool's e4m3 bytes into floats: conversion instructions with their static counts, and
    the software sequences found (AMD gfx942)."""
    if pool_arg == "*u8":
        return {"how": "integer operations (device.e4m3_bytes_to_float: the pool passed as bytes)"}
    if backend == "cuda":
        found = collections.Counter(re.findall(r"\bcvt\.rn\.(?:f16x2|bf16x2)\.e4m3x2\b", kernel.asm["ptx"]))
        return {"how": "native conversion" if found else "no e4m3 conversion found", "instructions": dict(found)}
    asm = kernel.asm["amdgcn"]
    found = collections.Counter(re.findall(r"^\s+(v_cvt\w*_(?:fp8|bf8)\w*)", asm, re.M))
    sequences = []
    if all(re.search(rf"\b{c}\b", asm) for c in GFX942_F16_SEQUENCE_CONSTANTS):
        sequences.append("software to fp16 (NaN kept)")
    if GFX942_BF16_SEQUENCE.search(asm):
        sequences.append("software to bf16 by x2^120 (0x7F/0xFF -> +-480)")
    how = "native conversion" if found else "software" if sequences else "no e4m3 conversion found"
    return {"how": how, "instructions": dict(found), "software_sequences": sequences}


def compile_case(case_id: int, target_name: str) -> dict:
    """Compile ``CASES[case_id]`` for the target and read the artifact: the record the JSON holds."""
    import triton

    case, target = CASES[case_id], gpu_target(target_name)
    as_bytes = case.pool in ("mxfp8", "fp8") and pool_as_bytes(target_name)
    record = {"target": target_name, "backend": target.backend, "kernel": case.kernel, "config": case.config,
              "pool": case.pool, "pool_arg": pool_pointer(case.pool, as_bytes) if case.reads_e4m3 else None,
              "scale_arg": scale_pointer(case.pool, as_bytes) if case.kernel in SCALE_ARGUMENT_KERNELS else None,
              "case_id": case_id, "compiled": False, "error": None}
    log, start = io.StringIO(), time.perf_counter()
    try:
        with triton.knobs.compilation.scope(), triton.knobs.nvidia.scope():
            triton.knobs.compilation.always_compile = True  # a cached kernel would skip ptxas and its report
            triton.knobs.nvidia.dump_ptxas_log = True  # printed: caught below
            with contextlib.redirect_stdout(log):
                kernel = case.build(target, as_bytes, case.pool)
    except Exception as err:  # noqa: BLE001 - every compiler error is a result to record
        record.update(seconds=round(time.perf_counter() - start, 1), error=error_summary(err),
                      error_detail=str(err)[-4000:])
        return record
    record.update(compiled=True, seconds=round(time.perf_counter() - start, 1),
                  num_warps=kernel.metadata.num_warps, num_stages=kernel.metadata.num_stages,
                  shared_bytes=kernel.metadata.shared, dot_instructions=dot_instructions(kernel, target.backend))
    if target.backend == "cuda":
        record["nvidia"] = ptxas_report(log.getvalue())
        record["sass_sha256"] = sass_digest(kernel.asm["cubin"])
        record["registers"] = record["nvidia"]["registers"]
        record["spilled"] = bool(record["nvidia"]["spill_store_bytes"])
    else:
        record["amd"] = amdgcn_report(kernel.asm["amdgcn"])
        record["registers"] = record["amd"]["vgpr_count"]
        # VGPR spills go to scratch memory; SGPR spills to VGPR lanes first (to scratch only when none is free)
        record["spilled"] = bool(record["amd"]["vgpr_spill_count"] or record["amd"]["scratch_bytes"])
    if record["pool_arg"] and record["pool_arg"] != "*bf16":
        record["e4m3"] = e4m3_decoding(kernel, target.backend, record["pool_arg"])
    return record


def sass_digest(cubin: bytes) -> str:
    """sha256 of the cubin's SASS instructions (``cuobjdump -sass``, instruction lines only): equal digests mean
    the same machine code, whatever line-number debug information the cubin also carries."""
    import triton.backends.nvidia as nvidia_backend

    tool = os.path.join(os.path.dirname(nvidia_backend.__file__), "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    lines = [line.strip() for line in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4}\*/", line)]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def error_summary(err: BaseException) -> str:
    """The exception's type and the line that says what went wrong: a Triton CompilationError's message is a
    location line, the source line and a caret, then the error; other errors' first line."""
    while err.__cause__ is not None:
        err = err.__cause__
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    after_caret = lines[lines.index("^") + 1:] if "^" in lines else []
    return f"{type(err).__name__}: {(after_caret or lines or [''])[0]}"[:300]


# ---------------------------------------------------------------------------------------------------------------
# Driving the compiles: one process per target
# ---------------------------------------------------------------------------------------------------------------

def worker_environment() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET" and k not in COMPILE_SM90_OVERRIDES}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, set to silence its warning
    return env


def run_worker(target_name: str, case_ids: list, results_path: str) -> None:
    """Compile the cases in order, appending each record to ``results_path`` as one JSON line when it is done."""
    for case_id in case_ids:
        case = CASES[case_id]
        print(f"[{target_name}] {case.kernel} {case.pool}: {case.config}", file=sys.stderr, flush=True)
        record = compile_case(case_id, target_name)
        with open(results_path, "a") as out:
            out.write(json.dumps(record) + "\n")


def compile_target(target_name: str, case_ids: list, scratch: str) -> list:
    """Every case of ``case_ids`` for one target, in worker processes: when one dies, the case it was compiling is
    recorded as not compiled and a new worker takes the rest."""
    records, pending = {}, list(case_ids)
    results_path = os.path.join(scratch, f"{target_name}.jsonl")
    while pending:
        open(results_path, "w").close()
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", target_name,
                               "--case-ids", ",".join(map(str, pending)), "--results", results_path],
                              env=worker_environment(), cwd=ROOT)
        with open(results_path) as f:
            for line in f:
                if line.strip():
                    record = json.loads(line)
                    records[record["case_id"]] = record
        pending = [i for i in pending if i not in records]
        if pending:
            died = pending.pop(0)
            case = CASES[died]
            records[died] = {"target": target_name, "backend": TARGETS[target_name][0], "kernel": case.kernel,
                             "config": case.config, "pool": case.pool, "case_id": died, "compiled": False,
                             "error": f"the compiler process died (exit status {proc.returncode}) on this compile"}
    return [records[i] for i in case_ids]


def _cell(record) -> str:
    """A summary cell: registers (NVIDIA) or VGPRs + AGPRs (AMD), "spills" when it spills to memory, "FAIL" when it
    did not compile."""
    if not record["compiled"]:
        return "FAIL"
    if record["backend"] == "cuda":
        return str(record["registers"]) + (" spills" if record["spilled"] else "")
    amd = record["amd"]
    text = f"{amd['vgprs']}+{amd['agprs']}"
    if record["spilled"]:
        return text + " spills"
    return text + (" (SGPR spills)" if amd["sgpr_spill_count"] else "")


def _counts(counts: dict) -> str:
    return ", ".join(f"{name} x{n}" for name, n in counts.items()) or "-"


def _e4m3_cell(record) -> str:
    e4m3 = record.get("e4m3")
    if not e4m3:
        return "-"
    found = [f"{name} x{n}" for name, n in e4m3.get("instructions", {}).items()] + e4m3.get("software_sequences", [])
    return ", ".join(found) or e4m3["how"]


def _pool_cell(record) -> str:
    """The pool and the pointer type its K/V buffers are passed as; for a per-tensor fp8 pool also the type of the
    scale arguments, which the launchers fill with the K buffer as passed (unused by the kernel)."""
    args = [record["pool_arg"]] if record.get("pool_arg") else []
    if record["pool"] == "fp8" and record.get("scale_arg"):
        args.append(f"unused scale args {record['scale_arg']}")
    return POOLS[record["pool"]] + (f" ({'; '.join(args)})" if args else "")


def markdown(records: list, meta: dict) -> str:
    targets = list(dict.fromkeys(r["target"] for r in records))
    rows = list(dict.fromkeys((r["kernel"], r["config"], r["pool"]) for r in records))
    by_key = {(r["kernel"], r["config"], r["pool"], r["target"]): r for r in records}
    compiled = sum(r["compiled"] for r in records)
    out = [f"# Every kernel for every target (Triton {meta['triton']}, offline, no GPU)", "",
           f"`{meta['command']}`: {compiled} of {len(records)} compiles succeeded. Head_dim {D}, {HQ} query heads "
           f"over {HKV} KV heads; each kernel in its launcher's configuration.", "",
           "## Summary: registers per thread (NVIDIA) / VGPRs + AGPRs per lane (AMD)", "",
           "`spills`: the compile spills to memory (NVIDIA: spill stores; AMD: VGPR spills or scratch); "
           "`(SGPR spills)`: AMD SGPRs spilled to VGPR lanes only, no scratch; `FAIL`: did not compile (below); `-`: "
           "not built for that target. On sm_80 / sm_86 the 8-bit pools are passed as bytes.",
           "", "| kernel | configuration | pool | " + " | ".join(targets) + " |",
           "|---|---|---|" + "---|" * len(targets)]
    for kernel, config, pool in rows:
        cells = [_cell(by_key[(kernel, config, pool, t)]) if (kernel, config, pool, t) in by_key else "-"
                 for t in targets]
        out.append(f"| {kernel} | {config} | {POOLS[pool]} | " + " | ".join(cells) + " |")
    nvidia = [r for r in records if r["backend"] == "cuda"]
    amd = [r for r in records if r["backend"] == "hip"]
    if nvidia:
        out += ["", "## NVIDIA (ptxas -v; shared memory from Triton's metadata)", "",
                "| target | kernel | configuration | pool (pointer) | compiled | registers | spill stores / loads B "
                "| stack B | shared B | dot instructions | e4m3 to float |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in nvidia:
            pool = _pool_cell(r)
            if not r["compiled"]:
                out.append(f"| {r['target']} | {r['kernel']} | {r['config']} | {pool} | no: {r['error']} "
                           "| | | | | | |")
                continue
            nv = r["nvidia"]
            out.append(f"| {r['target']} | {r['kernel']} | {r['config']} | {pool} | yes | {nv['registers']} | "
                       f"{nv['spill_store_bytes']} / {nv['spill_load_bytes']} | {nv['stack_frame_bytes']} | "
                       f"{r['shared_bytes']} | {_counts(r['dot_instructions'])} | {_e4m3_cell(r)} |")
    if amd:
        out += ["", "## AMD (AMDGCN metadata; LDS from Triton's metadata)", "",
                "| target | kernel | configuration | pool (pointer) | compiled | VGPRs | AGPRs | SGPRs | spills "
                "VGPR / SGPR | scratch B | LDS B | waves / SIMD | dot instructions | e4m3 to float |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in amd:
            pool = _pool_cell(r)
            if not r["compiled"]:
                out.append(f"| {r['target']} | {r['kernel']} | {r['config']} | {pool} | no: {r['error']} "
                           "| | | | | | | | | |")
                continue
            a = r["amd"]
            out.append(f"| {r['target']} | {r['kernel']} | {r['config']} | {pool} | yes | {a['vgprs']} | "
                       f"{a['agprs']} | {a['sgpr_count']} | {a['vgpr_spill_count']} / {a['sgpr_spill_count']} | "
                       f"{a['scratch_bytes']} | {r['shared_bytes']} | {a['waves_per_simd']} | "
                       f"{_counts(r['dot_instructions'])} | {_e4m3_cell(r)} |")
    failed = [r for r in records if not r["compiled"]]
    out += ["", "## Not compiled", ""]
    out += [f"- {r['target']}, {r['kernel']} ({_pool_cell(r)}; {r['config']}): {r['error']}" for r in failed] \
        or ["None."]
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="folder for compile_targets.json and compile_targets.md")
    ap.add_argument("--targets", nargs="+", choices=list(TARGETS), default=list(TARGETS))
    ap.add_argument("--kernels", nargs="+", choices=list(KERNELS), default=None)
    ap.add_argument("--worker", choices=list(TARGETS), help=argparse.SUPPRESS)
    ap.add_argument("--case-ids", help=argparse.SUPPRESS)
    ap.add_argument("--results", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        run_worker(a.worker, [int(i) for i in a.case_ids.split(",")], a.results)
        sys.stderr.flush()
        os._exit(0)  # every record is written; skips nanobind's leak report on Triton's bindings at exit
    if not a.out:
        ap.error("--out is required")
    import triton

    os.makedirs(a.out, exist_ok=True)
    scratch = os.path.join(a.out, ".workers")
    os.makedirs(scratch, exist_ok=True)
    command = "python tools/compile_targets.py --out " + a.out + (
        " --targets " + " ".join(a.targets) if a.targets != list(TARGETS) else "") + (
        " --kernels " + " ".join(a.kernels) if a.kernels else "")
    start, records = time.perf_counter(), []
    for target_name in a.targets:
        records += compile_target(target_name, cases_for(target_name, a.kernels), scratch)
    for name in os.listdir(scratch):
        os.remove(os.path.join(scratch, name))
    os.rmdir(scratch)
    meta = {"triton": triton.__version__, "command": command, "seconds": round(time.perf_counter() - start),
            "head_dim": D, "num_q_heads": HQ, "num_kv_heads": HKV}
    with open(os.path.join(a.out, RESULTS_JSON), "w") as f:
        json.dump({"meta": meta, "records": records}, f, indent=1)
        f.write("\n")
    with open(os.path.join(a.out, RESULTS_MD), "w") as f:
        f.write(markdown(records, meta))
    failed = [r for r in records if not r["compiled"]]
    print(f"{len(records) - len(failed)} of {len(records)} compiled in {meta['seconds']} s; "
          f"{os.path.join(a.out, RESULTS_MD)}")
    for r in failed:
        print(f"  not compiled: {r['target']} {r['kernel']} {r['pool']} ({r['config']}): {r['error']}")


if __name__ == "__main__":
    main()
