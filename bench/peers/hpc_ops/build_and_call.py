#!/usr/bin/env python3
"""Build Tencent/hpc-ops SM90 fp8 paged decode attention as a standalone torch extension and
call it once on random paged data (q [B, Hq, 128] bf16 -> fp8, 128-token pages, Hkv heads).

Layout expected next to this script (or set HPCOPS_ROOT):
    <root>/src/attention/decode/...           (hpc-ops@6e2eced sources, see REPORT.md)
    <root>/src/utils/{utils.cc,utils.h,utils.cuh,tma.cuh}
    <root>/3rd/cutlass/include/...            (vendored CUTLASS 4.4.2 / CuTe headers)
    <root>/ext/hpc_decode_fp8_binding.cc      (our minimal TORCH_LIBRARY(hpc_dec) binding)

Build modes (--build):
    load   : torch.utils.cpp_extension.load (needs the `ninja` binary / pip package)
    manual : plain nvcc/g++ subprocesses in parallel + torch.ops.load_library (no ninja)
    auto   : load if ninja is available, else manual (default)

Usage:  python build_and_call.py [--B 32] [--hq 32] [--hkv 4] [--kvlen 4096] [--bench]
"""
import argparse
import concurrent.futures as cf
import math
import os
import shutil
import subprocess
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("HPCOPS_ROOT", os.path.join(HERE, "src"))
EXT = os.environ.get("HPCOPS_EXT", os.path.join(HERE, "ext"))
BUILD_DIR = os.environ.get("HPCOPS_BUILD", os.path.join(HERE, "build_hpc_dec"))

DEC = os.path.join(ROOT, "src/attention/decode")
SOURCES = [
    os.path.join(EXT, "hpc_decode_fp8_binding.cc"),
    os.path.join(ROOT, "src/utils/utils.cc"),
    os.path.join(DEC, "assign_task.cu"),
    os.path.join(DEC, "sm90/dynamic/smallm_fp8_qpertoken_perhead_kvpertensor_dim128_dynamic.cu"),
    os.path.join(DEC, "sm90/static/smallm_fp8_qpertoken_perhead_kvpertensor_dim128_static.cu"),
]
INCLUDES = [ROOT, os.path.join(ROOT, "3rd/cutlass/include")]
# Same device flags as upstream CMakeLists.txt (minus -Werror/-Xptxas -v); sm_90a is REQUIRED
# (wgmma, setmaxnreg, tensormap.replace guarded by __CUDA_ARCH_FEAT_SM90_ALL).
CUDA_FLAGS = [
    "-gencode=arch=compute_90a,code=sm_90a",
    "-std=c++17",
    "-O3",
    "--expt-relaxed-constexpr",
    "-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED",
    "-DNDEBUG",
    "-lineinfo",
    # torch.utils.cpp_extension adds these -D's; upstream builds without them.
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
]
CXX_FLAGS = ["-O3", "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI)]


def _cuda_home():
    from torch.utils.cpp_extension import CUDA_HOME

    for c in (CUDA_HOME, os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if c and os.path.exists(os.path.join(c, "include/cuda_runtime_api.h")):
            return c
    nv = shutil.which("nvcc")
    if nv:
        return os.path.dirname(os.path.dirname(os.path.realpath(nv)))
    return "/usr/local/cuda"


def _nvcc():
    for cand in [os.path.join(_cuda_home(), "bin/nvcc"), shutil.which("nvcc") or ""]:
        if cand and os.path.exists(cand):
            return cand
    raise RuntimeError("nvcc not found")


def build_load(verbose=True):
    from torch.utils.cpp_extension import load

    os.makedirs(BUILD_DIR, exist_ok=True)
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 8))
    load(
        name="hpc_dec",
        sources=SOURCES,
        extra_include_paths=INCLUDES,
        extra_cflags=CXX_FLAGS,
        extra_cuda_cflags=CUDA_FLAGS,
        build_directory=BUILD_DIR,
        is_python_module=False,  # binding uses TORCH_LIBRARY, not PYBIND11_MODULE
        verbose=verbose,
    )


def build_manual(cuda_only=False):
    """nvcc/g++ in parallel, then link; an object newer than its source is kept (a bundle can carry the .cu
    objects prebuilt: they need no torch). ``cuda_only``: compile the .cu sources and stop."""
    from torch.utils.cpp_extension import include_paths, library_paths

    CUDA_HOME = _cuda_home()
    os.makedirs(BUILD_DIR, exist_ok=True)
    nvcc = _nvcc()
    tinc = include_paths()  # CPU-only include list is enough (binding avoids ATen/cuda headers)
    cuda_inc = os.path.join(CUDA_HOME, "include")
    inc = [f"-I{p}" for p in INCLUDES]
    sysinc = [f"-isystem{p}" for p in tinc] + [f"-isystem{cuda_inc}"]
    cmds, objs = [], []
    for src in SOURCES:
        if cuda_only and not src.endswith(".cu"):
            continue
        obj = os.path.join(BUILD_DIR, os.path.basename(src) + ".o")
        objs.append(obj)
        if os.path.exists(obj) and os.path.getmtime(obj) > os.path.getmtime(src):
            continue
        if src.endswith(".cu"):
            cmd = [nvcc, *CUDA_FLAGS, "-Xcompiler", "-fPIC", *inc, "-c", src, "-o", obj]
        else:
            tv = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
            std = "-std=c++20" if tv >= (2, 10) else "-std=c++17"
            cmd = ["c++", std, "-fPIC", *CXX_FLAGS, "-DTORCH_API_INCLUDE_EXTENSION_H",
                   "-DTORCH_EXTENSION_NAME=hpc_dec", *inc, *sysinc, "-c", src, "-o", obj]
        cmds.append(cmd)

    def run(cmd):
        t = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        return cmd[-1], r.returncode, time.time() - t, r.stderr[-4000:]

    with cf.ThreadPoolExecutor(max_workers=max(1, len(cmds))) as ex:
        for obj, rc, dt, err in ex.map(run, cmds):
            print(f"[build] {os.path.basename(obj)} rc={rc} {dt:.0f}s", flush=True)
            if rc != 0:
                print(err)
                raise RuntimeError(f"compile failed: {obj}")
    if cuda_only:
        return
    so = os.path.join(BUILD_DIR, "hpc_dec.so")
    libdirs = library_paths() + [os.path.join(CUDA_HOME, "lib64")]
    # the binding only needs c10/torch core + cudart (no c10_cuda/torch_cuda symbols are used)
    libs = ["-lc10", "-ltorch", "-ltorch_cpu", "-lcudart"]
    link = ["c++", "-shared", "-o", so, *objs, *[f"-L{d}" for d in libdirs],
            *[f"-Wl,-rpath,{d}" for d in libdirs], *libs, "-Wl,--no-undefined"]
    subprocess.check_call(link)
    torch.ops.load_library(so)


def build(mode="auto", cuda_only=False):
    t0 = time.time()
    if mode == "auto":
        try:
            from torch.utils.cpp_extension import is_ninja_available

            mode = "load" if is_ninja_available() else "manual"
        except Exception:
            mode = "manual"
    print(f"[build] mode={'manual, .cu objects only' if cuda_only else mode} root={ROOT}", flush=True)
    if cuda_only:
        build_manual(cuda_only=True)
    else:
        (build_load if mode == "load" else build_manual)()
    print(f"[build] done in {time.time() - t0:.0f}s", flush=True)


# ---------------- python side of hpc/attention.py (hpc-ops@6e2eced) ----------------
def get_attention_decode_task_workspace(max_num_batch, max_seqlen, num_head_kv,
                                        min_process_len=512):
    # copy of hpc/attention.py:520-582
    kTaskInfoByteSize, kMaxCtaPerSm = 48, 4
    num_sm = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    max_num_cta_count = num_sm * kMaxCtaPerSm
    kMinTileN = 64
    total_tiles = max_num_batch * num_head_kv * ((max_seqlen + kMinTileN - 1) // kMinTileN)
    max_num_tasks = 0
    for cta_per_sm in (4, 3, 2, 1):
        num_ctas = num_sm * cta_per_sm
        tile_per_cta = max((total_tiles + num_ctas - 1) // num_ctas, min_process_len // kMinTileN)
        max_num_tasks = max(max_num_tasks, (tile_per_cta + 1) * num_ctas + 1)
    num_chunks_bytes = max_num_batch * num_head_kv * 4
    max_num_batch_pad = (num_chunks_bytes + kTaskInfoByteSize - 1) // kTaskInfoByteSize * kTaskInfoByteSize
    kTaskStrideInts = kTaskInfoByteSize // 4
    num_cta_count_pad = ((max_num_cta_count + kTaskStrideInts - 1) // kTaskStrideInts * kTaskStrideInts) * 4
    sched_need_byte_size = max_num_tasks * kTaskInfoByteSize + max_num_batch_pad
    ws = torch.zeros(sched_need_byte_size + 2 * num_cta_count_pad, dtype=torch.int8, device="cuda")
    ws.view(torch.int32)[2] = num_head_kv
    ws.view(torch.int32)[3] = max_num_batch
    ws.view(torch.int32)[4] = sched_need_byte_size
    return ws


def assign_attention_decode_task(kv_lens, task_map, num_head_kv, num_seq_q, new_kv_included=True,
                                 min_process_len=512):
    # CUDA path of hpc/attention.py:585-626 (4th arg is num_seq_q, upstream names it `mtp`)
    return torch.ops.hpc_dec.assign_attention_decode_task(
        kv_lens, num_head_kv, num_seq_q, new_kv_included, min_process_len, task_map)


QUANT_QPERTOKEN_PERHEAD_KVPERTENSOR = 1  # hpc.QuantType.QPERTOKEN_PERHEAD_KPERTENSOR_VPERTENSOR


def hpc_decode_fp8(q8, qscale, kcache64, vcache64, block_ids64, kv_lens, kscale, vscale,
                   task_map=None, output=None):
    return torch.ops.hpc_dec.attention_decode_fp8(
        q8, kcache64, vcache64, block_ids64, kv_lens, qscale, kscale, vscale,
        0,      # mtp (num_seq_q - 1)
        True,   # new_kv_included: kv_lens already counts the current token
        QUANT_QPERTOKEN_PERHEAD_KVPERTENSOR,
        True,   # use_splitk
        task_map, None, output)


# --------------- adapters from our layout (128-token pages) to hpc-ops (64) ---------------
def split_pages_nhd(cache, block_table, page=128, sub=64):
    """cache [P, page, Hkv, D] (contiguous NHD) -> view [P*page/sub, sub, Hkv, D];
    block_table [B, maxp] int32 -> [B, maxp*page/sub]. Zero-copy for the cache."""
    r = page // sub
    P, _, H, D = cache.shape
    c = cache.view(P * r, sub, H, D)
    bt = (block_table.to(torch.int64)[:, :, None] * r +
          torch.arange(r, device=block_table.device)[None, None, :]).reshape(block_table.shape[0], -1)
    return c, bt.to(torch.int32).contiguous()


def quant_q_per_token_head(q_bf16):
    amax = q_bf16.float().abs().amax(-1).clamp_min(1e-6)  # [B, Hq]
    qscale = amax / 448.0
    q8 = (q_bf16.float() / qscale[..., None]).to(torch.float8_e4m3fn)
    return q8, qscale.contiguous()


def reference(q8, qscale, kc, vc, bt, kv_lens, kscale, vscale, page):
    B, Hq, D = q8.shape
    Hkv = kc.shape[2]
    out = torch.empty(B, Hq, D, dtype=torch.float32, device=q8.device)
    for b in range(B):
        L = int(kv_lens[b])
        np_ = (L + page - 1) // page
        k = kc[bt[b, :np_].long()].reshape(-1, Hkv, D)[:L].float() * kscale
        v = vc[bt[b, :np_].long()].reshape(-1, Hkv, D)[:L].float() * vscale
        k = k.repeat_interleave(Hq // Hkv, dim=1)
        v = v.repeat_interleave(Hq // Hkv, dim=1)
        q = q8[b].float() * qscale[b][:, None]
        s = torch.einsum("hd,lhd->hl", q, k) / math.sqrt(D)
        p = torch.softmax(s, -1)
        out[b] = torch.einsum("hl,lhd->hd", p, v)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="auto", choices=["auto", "load", "manual"])
    ap.add_argument("--B", type=int, default=32)
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=4)   # Hq/Hkv must be 4 or 8
    ap.add_argument("--kvlen", type=int, default=4096)
    ap.add_argument("--page", type=int, default=128)
    ap.add_argument("--min-process-len", type=int, default=64)  # upstream bench default
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--cuda-objects-only", action="store_true",
                    help="compile the .cu objects (no GPU or torch ABI needed) and stop: make_bundle.sh --objects")
    a = ap.parse_args()
    build(a.build, cuda_only=a.cuda_objects_only)
    if a.cuda_objects_only:
        return
    if a.build_only:
        print(torch.ops.hpc_dec.attention_decode_fp8.default._schema)
        return
    assert torch.cuda.get_device_capability() == (9, 0), "sm_90 (H100/H200) only"

    torch.manual_seed(0)
    dev, D, page = "cuda", 128, a.page
    B, Hq, Hkv = a.B, a.hq, a.hkv
    kv_lens = torch.randint(max(1, a.kvlen // 2), a.kvlen + 1, (B,), dtype=torch.int32, device=dev)
    maxp = (a.kvlen + page - 1) // page
    P = B * maxp + 8
    kc = (torch.randn(P, page, Hkv, D, device=dev) / 4).to(torch.float8_e4m3fn)
    vc = torch.randn(P, page, Hkv, D, device=dev).to(torch.float8_e4m3fn)
    block_table = torch.randperm(P, device=dev)[: B * maxp].view(B, maxp).to(torch.int32)
    kscale = torch.tensor([0.5], device=dev)
    vscale = torch.tensor([0.25], device=dev)
    q = torch.randn(B, Hq, D, device=dev, dtype=torch.bfloat16)

    q8, qscale = quant_q_per_token_head(q)
    kc64, bt64 = split_pages_nhd(kc, block_table, page, 64)
    vc64, _ = split_pages_nhd(vc, block_table, page, 64)

    task_map = get_attention_decode_task_workspace(B, a.kvlen, Hkv, min_process_len=a.min_process_len)
    assign_attention_decode_task(kv_lens, task_map, Hkv, 1, True, a.min_process_len)
    out = torch.empty(B, Hq, D, dtype=torch.bfloat16, device=dev)
    y_dyn = hpc_decode_fp8(q8, qscale, kc64, vc64, bt64, kv_lens, kscale, vscale, task_map, out)
    y_sta = hpc_decode_fp8(q8, qscale, kc64, vc64, bt64, kv_lens, kscale, vscale, None, None)
    torch.cuda.synchronize()
    ref = reference(q8, qscale, kc, vc, block_table, kv_lens, kscale, vscale, page)
    for name, y in (("dynamic", y_dyn), ("static", y_sta)):
        err = (y.float() - ref).abs()
        print(f"[check] {name}: max_abs={err.max().item():.4f} mean_abs={err.mean().item():.5f} "
              f"ref_absmean={ref.abs().mean().item():.4f}")

    if a.bench:
        def t(fn, n=200):
            for _ in range(20):
                fn()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(True), torch.cuda.Event(True)
            s.record()
            for _ in range(n):
                g.replay()
            e.record()
            torch.cuda.synchronize()
            return s.elapsed_time(e) * 1000 / n

        f_dyn = lambda: hpc_decode_fp8(q8, qscale, kc64, vc64, bt64, kv_lens, kscale, vscale, task_map, out)
        f_dyn_tm = lambda: (assign_attention_decode_task(kv_lens, task_map, Hkv, 1, True, a.min_process_len), f_dyn())
        f_sta = lambda: hpc_decode_fp8(q8, qscale, kc64, vc64, bt64, kv_lens, kscale, vscale, None, out)
        for name, fn in (("dynamic", f_dyn), ("dynamic+assign", f_dyn_tm), ("static", f_sta)):
            print(f"[bench] {name}: {t(fn):.2f} us/call (CUDA graph)")


if __name__ == "__main__":
    main()
