"""Compile the decode kernel for an H100/H200 (sm_90) on a machine without a GPU and report its resources.

Triton's wheel carries ptxas and cuobjdump, so registers, spills, shared memory, PTX and SASS of a configuration
can be read here at no device time (the numbers are this Triton's, which may differ from the GPU machine's).

    python tools/compile_sm90.py --D 128 --G 8 --fmt mxfp8 --block-n 64 --warps 2 --stages 2 [--paged] [--sass F]
    python tools/compile_sm90.py --blocks --block-n 32 --warps 1 --stages 3 --ttgir k.ttgir   # the planned block kernel
    COMPILE_EXTRA='{"PAGE_TABLE": 1, "KV_PAGE": 128}' python tools/compile_sm90.py --blocks ...  # page-table reads
    COMPILE_OPTIONS='{"maxnreg": 200}' python tools/compile_sm90.py --blocks ...              # extra compile options
    COMPILE_UNMARKED=stride_qh,stride_oh python tools/compile_sm90.py --blocks ...            # as do_not_specialize

The signature is marked as Triton's JIT specializes a real launch (pointers and ints divisible by 16); the
registers, shared memory and loop length matched the GPU machine's JIT for four kernels
(bench/results/history/2026-11-30-offline-vs-jit-registers/).

Use the GPU machine's Triton (3.6) for numbers that match it: ``pip install --target /tmp/t36 triton==3.6.0`` (the
wheel for this Python) and ``PYTHONPATH=/tmp/t36``.
"""
import argparse
import json
import os
import re
import subprocess
import sys

os.environ.pop("TRITON_INTERPRET", None)
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sglang_inkling_backend.triton import decode_blocks  # noqa: E402
from sglang_inkling_backend.triton import decode_tiles  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def launch_signature(fn, types, consts, unmarked=(), target=None):
    """``fn``'s signature and attributes as Triton's JIT specializes a real launch: ``types`` by argument name
    (ints otherwise), ``consts`` as constexprs, and every pointer and int argument marked divisible by 16 except
    ``max_splits`` (the split count) and ``unmarked``. At run time every stride, split_len (whole tiles), window
    and rel_extent (0 when unused) are multiples of 16. Without the marks on stride_qh / stride_oh, q's load took
    another layout and some variants compiled with 30 fewer registers than launched (124 against 154,
    bench/results/history/2026-11-30-offline-vs-jit-registers/). A constexpr parameter that ``consts`` does not
    name takes its default, as at a launch (added to ``consts``: without it the compile would make it an int
    argument and compile every branch on it at run time). ``target``: an AMD one also marks every pointer as
    within 2 GB (``tt.pointer_range`` 32), as Triton's launch does for such tensors while buffer operations are on
    (``AMDGCN_USE_BUFFER_OPS``, on by default)."""
    sig, attrs = {}, {}
    pointer_attrs = [["tt.divisibility", 16]]
    if target is not None and target.backend == "hip" and triton.knobs.amd.use_buffer_ops:
        pointer_attrs = pointer_attrs + [["tt.pointer_range", 32]]
    for param in fn.params:
        if param.is_constexpr and param.has_default and param.name not in consts:
            consts[param.name] = param.default
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
            continue
        sig[name] = types.get(name, "i32")
        if sig[name].startswith("*"):
            attrs[(i,)] = pointer_attrs
        elif sig[name] == "i32" and name not in ("max_splits",) + tuple(unmarked):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def compile_decode(D=128, G=8, HKV=2, fmt="mxfp8", block_n=64, warps=2, stages=2, paged=False, direct=False,
                   extra=None, arch=90, e4m3_bytes=False, target=None, arg_types=None):
    """``arch``: the sm number to compile for; ``e4m3_bytes``: pass an 8-bit pool as bytes (``*u8``), as the launchers
    do where the GPU has no e4m3 conversions (``triton.inputs.e4m3_by_integers``); ``target``: a ``GPUTarget`` to
    compile for instead of ``arch`` (an AMD one, say: ``GPUTarget("hip", "gfx942", 64)``); ``arg_types``: argument
    types by name in place of these (``{"ksf_ptr": "*fp8e4nv"}``, say)."""
    target = target or GPUTarget("cuda", arch, 32)
    fn = decode_blocks.decode_blocks_kernel if paged == "blocks" else decode_tiles.decode_tiles_kernel
    e4m3 = "*u8" if e4m3_bytes else "*fp8e4nv"
    kvt = {"mxfp8": e4m3, "fp8": e4m3, "bf16": "*bf16"}[fmt]
    types = {"q_ptr": "*bf16", "k_ptr": kvt, "v_ptr": kvt, "ksf_ptr": "*u8", "vsf_ptr": "*u8",
             "lens_ptr": "*i32", "index_ptr": "*i32", "rel_bias_ptr": "*bf16", "sinks_ptr": "*bf16",
             "out_ptr": "*bf16", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32",
             "sm_scale": "fp32", "k_scale": "fp32", "v_scale": "fp32", "logit_cap": "fp32", **(arg_types or {})}
    consts = dict(G=G, G_PAD=max(16, triton.next_power_of_2(G)), D=D, HKV=HKV, BLOCK_N=block_n,
                  KV_FORMAT={"mxfp8": 2, "fp8": 1, "bf16": 0}[fmt], PAGE=128 if fmt == "mxfp8" else 1,
                  INTERLEAVED=fmt == "mxfp8", DOT_DTYPE=triton.language.float16 if fmt != "bf16" else
                  triton.language.bfloat16, HAS_REL_BIAS=False, HAS_WINDOW=False, HAS_CAP=False, HAS_SINKS=False,
                  DIRECT=direct, FP16_TILES=fmt != "bf16", PAGE_TABLE=False, KV_PAGE=0)
    if paged == "blocks":
        for name in ("DOT_DTYPE", "FP16_TILES"):
            consts.pop(name)
        consts["PV_DTYPE"] = triton.language.float16 if fmt != "bf16" else triton.language.bfloat16
        consts["G_PAD"] = max(8, triton.next_power_of_2(G))  # the heads are the block kernel's N side
    else:
        consts["PAGED"] = bool(paged)
    consts.update(extra or {})
    consts.update(json.loads(os.environ.get("COMPILE_EXTRA", "{}")))
    for param in fn.params:  # constexprs not set above take their defaults (else they would compile as runtime ints)
        if param.is_constexpr and param.name not in consts and param.has_default:
            consts[param.name] = param.default
    # COMPILE_UNMARKED (comma-separated names) leaves arguments unmarked, as do_not_specialize would.
    sig, attrs = launch_signature(fn, types, consts, tuple(os.environ.get("COMPILE_UNMARKED", "").split(",")), target)
    src = ASTSource(fn, sig, constexprs=consts, attrs=attrs)
    options = dict({"num_warps": warps, "num_stages": stages}, **json.loads(os.environ.get("COMPILE_OPTIONS", "{}")))
    return triton.compile(src, target=target, options=options)


def resources(kernel):
    """Registers, spill bytes and shared memory of a compiled kernel, from cuobjdump's resource usage."""
    path = "/tmp/_compile_sm90.cubin"
    open(path, "wb").write(kernel.asm["cubin"])
    out = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage", path], capture_output=True,
                         text=True).stdout
    regs = re.search(r"REG:(\d+)", out)
    stack = re.search(r"STACK:(\d+)", out)
    return {"regs": int(regs.group(1)) if regs else None, "stack": int(stack.group(1)) if stack else None,
            "shared": kernel.metadata.shared}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--fmt", default="mxfp8")
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--warps", type=int, default=2)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--paged", action="store_true", help="page-aligned tiles (PAGED)")
    ap.add_argument("--blocks", action="store_true", help="the block kernel of decode_blocks.py")
    ap.add_argument("--sass", help="write SASS here")
    ap.add_argument("--ttgir", help="write TTGIR here")
    a = ap.parse_args()
    k = compile_decode(a.D, a.G, 2, a.fmt, a.block_n, a.warps, a.stages, "blocks" if a.blocks else a.paged)
    print(resources(k))
    if a.ttgir:
        open(a.ttgir, "w").write(k.asm["ttgir"])
    if a.sass:
        cubin = a.sass + ".cubin"
        open(cubin, "wb").write(k.asm["cubin"])
        tool = os.path.join(BIN, "cuobjdump")
        open(a.sass, "w").write(subprocess.run([tool, "--dump-sass", cubin], capture_output=True, text=True).stdout)


if __name__ == "__main__":
    main()
