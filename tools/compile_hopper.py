"""Compile the Gluon Hopper decode kernel (``sglang_inkling_backend/triton/decode_hopper.py``) for sm_90a on a machine
without a GPU, and report registers, spills, shared memory and its MMA and TMA instruction counts.

    python tools/compile_hopper.py                       # head_dim 128, 8 heads per KV head, 128-key tiles, 3 stages
    python tools/compile_hopper.py --D 256 --G 4 --stages 2 --all-flags --sass /tmp/k.sass
    python tools/compile_hopper.py --block-n 128 --stages 2 --one-p --maxnreg 168   # the 3-programs-per-SM variant
    python tools/compile_hopper.py --ws [--D 256 --block-n 64 --stages 2]   # the warp-specialized kernel

Triton's wheel carries ptxas and cuobjdump (made executable here if the wheel's unzip dropped the bit). The numbers
are the installed Triton's; the GPU machine runs 3.6 (``pip install --target /tmp/t36 triton==3.6.0`` and
``PYTHONPATH=/tmp/t36`` for its numbers). The kernel compiles with Triton 3.6 and 3.9 (their Gluon API differs in
three names, bridged in decode_hopper.py).
"""
import argparse
import json
import os
import re
import stat
import subprocess
import sys

os.environ.pop("TRITON_INTERPRET", None)
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
FLAGS = ("HAS_REL_BIAS", "HAS_WINDOW", "HAS_CAP", "HAS_SINKS", "DIRECT")


def _executable_tools():
    for name in ("ptxas", "cuobjdump", "nvdisasm", "ptxas-blackwell"):
        path = os.path.join(BIN, name)
        if os.path.exists(path) and not os.access(path, os.X_OK):
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def compile_hopper(D=128, G=8, block_n=128, stages=3, one_p=False, flags=(), maxnreg=None, hkv=2,
                   page_table=True, extra=None, head_split=1, g_pad=None, ws=False):
    """The compiled kernel (``triton.compile``'s result) for one configuration, specialized like a launch.
    ``ws``: the warp-specialized kernel (``decode_hopper_ws``; no ``one_p``; ``maxnreg`` defaults to its launch's)."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from sglang_inkling_backend.triton import decode_hopper, decode_hopper_ws
    from tools.compile_sm90 import launch_signature

    _executable_tools()
    g_pad = g_pad or max(8, triton.next_power_of_2(G))
    layout = gl.NVMMASharedLayout.get_default_for([block_n, D], gl.float8e4nv)
    desc = f"tensordesc<fp8e4nv[{block_n}, {D}],{layout!r}>"
    fn = decode_hopper_ws.decode_hopper_ws_kernel if ws else decode_hopper.decode_hopper_kernel
    types = {"q_ptr": "*bf16", "k_desc": desc, "v_desc": desc, "ksf_ptr": "*u8", "vsf_ptr": "*u8",
             "lens_ptr": "*i32", "table_ptr": "*i32", "rel_bias_ptr": "*bf16", "sinks_ptr": "*bf16",
             "out_ptr": "*bf16", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "sm_scale": "fp32",
             "logit_cap": "fp32"}
    consts = dict(G=G, G_PAD=g_pad, D=D, HKV=hkv, NUM_STAGES=stages, BLOCK_N=block_n, PAGE_TABLE=page_table,
                  HEAD_SPLIT=head_split, **{f: f in flags for f in FLAGS}, **(extra or {}))
    if not ws:
        consts["ONE_P"] = one_p
    sig, attrs = launch_signature(fn, types, consts)
    options = {"num_warps": decode_hopper.HOPPER_NUM_WARPS}
    if ws:
        options = {"num_warps": decode_hopper_ws.HOPPER_WS_NUM_WARPS, "maxnreg": decode_hopper_ws.HOPPER_WS_MAXNREG}
    if maxnreg:
        options["maxnreg"] = maxnreg
    return triton.compile(GluonASTSource(fn, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                          options=options)


def report(kernel) -> dict:
    """Registers, spill (stack) bytes, shared memory, and the PTX's warpgroup MMAs and TMA loads."""
    path = "/tmp/_compile_hopper.cubin"
    with open(path, "wb") as f:
        f.write(kernel.asm["cubin"])
    out = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage", path], capture_output=True,
                         text=True).stdout
    regs, stack = re.search(r"REG:(\d+)", out), re.search(r"STACK:(\d+)", out)
    ptx = kernel.asm["ptx"]
    return {"regs": int(regs.group(1)) if regs else None, "stack": int(stack.group(1)) if stack else None,
            "shared": kernel.metadata.shared,
            "wgmma_e4m3": len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.e4m3", ptx)),
            "wgmma_f16": len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.f16\.f16", ptx)),
            "tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor\.2d", ptx)),
            "griddepcontrol": ptx.count("griddepcontrol."),  # TRIGGER_MERGE: the merge's early launch
            # register budgets a warp-specialized kernel moves its warps to (its partitions' in the order emitted)
            "setmaxnreg": [int(n) for n in re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx)]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--block-n", type=int, default=128)
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--one-p", action="store_true", help="one P' buffer (the 2-stage variant's layout)")
    ap.add_argument("--maxnreg", type=int)
    ap.add_argument("--head-split", type=int, default=1, help="programs per KV head (G heads each, GQA G x this)")
    ap.add_argument("--g-pad", type=int, help="heads on the MMA's N side (default max(8, next power of 2 of G))")
    ap.add_argument("--csr", action="store_true", help="a CSR of whole pages instead of a page table")
    ap.add_argument("--all-flags", action="store_true", help="rel bias, window, cap, sinks, one split")
    ap.add_argument("--constexpr", action="append", default=[], metavar="NAME=INT",
                    help="a variant constexpr of the kernel, e.g. SLOTS_AHEAD=0 (flags: 0 or 1), P_SETS=2")
    ap.add_argument("--ws", action="store_true", help="the warp-specialized kernel (decode_hopper_ws)")
    ap.add_argument("--sass", help="write SASS here")
    ap.add_argument("--ttgir", help="write TTGIR here")
    a = ap.parse_args()
    k = compile_hopper(a.D, a.G, a.block_n, a.stages, a.one_p, FLAGS if a.all_flags else (), a.maxnreg,
                       page_table=not a.csr, head_split=a.head_split, g_pad=a.g_pad, ws=a.ws,
                       extra={n: int(v) for n, v in (c.split("=") for c in a.constexpr)})
    print(json.dumps(report(k)))
    if a.ttgir:
        open(a.ttgir, "w").write(k.asm["ttgir"])
    if a.sass:
        cubin = a.sass + ".cubin"
        open(cubin, "wb").write(k.asm["cubin"])
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-sass", cubin], capture_output=True, text=True)
        open(a.sass, "w").write(sass.stdout)


if __name__ == "__main__":
    main()
