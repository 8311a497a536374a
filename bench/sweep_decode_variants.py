"""Kernel-variant sweep for MXFP8 decode on the GPU: every variant next to FlashInfer bf16 / fp8 at the same points.

Each variant's output is compared with the default plan's (relative Frobenius difference; the default is checked
against float64 by gpu_tests/check_triton_gpu.py). Timing as bench_decode.py (one call replayed from a CUDA graph,
L2 cleared between replays). Prints a table per point and writes ``<out>/variants.json``.

    python bench/sweep_decode_variants.py --out $OUT            # the sweep
    python bench/sweep_decode_variants.py --ncu-target           # one launch per named variant, for ncu
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_decode import PAGE, Case, bench_graph  # noqa: E402
from sglang_inkling_backend.triton.decode_attention import plan_decode, run_decode  # noqa: E402

POINTS = [("inkling-tp4", 16, 2, 128, 128, 32768), ("gqa8-tp1", 64, 8, 128, 32, 16384),
          ("gemma3-270m", 4, 1, 256, 128, 16384), ("inkling-tp4", 16, 2, 128, 8, 32768),
          ("inkling-tp4", 16, 2, 128, 1, 32768), ("gemma3-270m", 4, 1, 256, 8, 32768),
          ("inkling-tp4", 16, 2, 128, 32, 4096), ("gemma3-270m", 4, 1, 256, 1, 4096)]

P = dict(page_size=PAGE)
VARIANTS = {
    "default": {},
    "t64/2/3w32": dict(P, block_n=64, num_warps=2, num_stages=3, waves=32),
    "t32/1/3w32": dict(P, block_n=32, num_warps=1, num_stages=3, waves=32),
    "t32/1/3w16": dict(P, block_n=32, num_warps=1, num_stages=3, waves=16),
    "t32/1/3w64": dict(P, block_n=32, num_warps=1, num_stages=3, waves=64),
    "t16/1/3w32": dict(P, block_n=16, num_warps=1, num_stages=3, waves=32),
    "t32/2/3w32": dict(P, block_n=32, num_warps=2, num_stages=3, waves=32),
    "t64/4/3w32": dict(P, block_n=64, num_warps=4, num_stages=3, waves=32),
    "b32/1/3w32": dict(P, kernel="blocks", block_n=32, num_warps=1, num_stages=3, waves=32),
    "b32/1/2w32": dict(P, kernel="blocks", block_n=32, num_warps=1, num_stages=2, waves=32),
    "b32/2/3w32": dict(P, kernel="blocks", block_n=32, num_warps=2, num_stages=3, waves=32),
    "b32/2/4w32": dict(P, kernel="blocks", block_n=32, num_warps=2, num_stages=4, waves=32),
    "b64/2/3w32": dict(P, kernel="blocks", block_n=64, num_warps=2, num_stages=3, waves=32),
    "b16/1/3w32": dict(P, kernel="blocks", block_n=16, num_warps=1, num_stages=3, waves=32),
    "b64/4/3w32": dict(P, kernel="blocks", block_n=64, num_warps=4, num_stages=3, waves=32),
    "b32/1/4w32": dict(P, kernel="blocks", block_n=32, num_warps=1, num_stages=4, waves=32),
    "b32/1/3w64": dict(P, kernel="blocks", block_n=32, num_warps=1, num_stages=3, waves=64),
    "b32/1/4w64": dict(P, kernel="blocks", block_n=32, num_warps=1, num_stages=4, waves=64),
    "b32/2/3w64": dict(P, kernel="blocks", block_n=32, num_warps=2, num_stages=3, waves=64),
    "m32/1/2w32": dict(P, kernel="blocks_m", block_n=32, num_warps=1, num_stages=2, waves=32),
    # V loaded as [channels, keys] (load_v_transposed): streamed through shared memory, far fewer registers
    # (offline, triton 3.6: 158 against 249 at head_dim 128 on one warp; 240 without spills at head_dim 256)
    "v32/1/3w64": dict(P, kernel="blocks", block_n=32, num_warps=1, num_stages=3, waves=64, load_v_transposed=True),
    "v32/1/3w32": dict(P, kernel="blocks", block_n=32, num_warps=1, num_stages=3, waves=32, load_v_transposed=True),
    "v32/1/5w64": dict(P, kernel="blocks", block_n=32, num_warps=1, num_stages=5, waves=64, load_v_transposed=True),
    "v32/1/2w32": dict(P, kernel="blocks", block_n=32, num_warps=1, num_stages=2, waves=32, load_v_transposed=True),
    "v64/1/3w64": dict(P, kernel="blocks", block_n=64, num_warps=1, num_stages=3, waves=64, load_v_transposed=True),
    "v64/2/3w64": dict(P, kernel="blocks", block_n=64, num_warps=2, num_stages=3, waves=64, load_v_transposed=True),
    "v64/4/3w32": dict(P, kernel="blocks", block_n=64, num_warps=4, num_stages=3, waves=32, load_v_transposed=True),
}
SMALL = {  # small batches: shorter splits, more programs
    "t32/1/3m64": dict(P, block_n=32, num_warps=1, num_stages=3, waves=32, min_split=64),
    "t64/4/3m64": dict(P, block_n=64, num_warps=4, num_stages=3, waves=32, min_split=64),
    "b32/2/3m64": dict(P, kernel="blocks", block_n=32, num_warps=2, num_stages=3, waves=32, min_split=64),
    "b32/2/3m128": dict(P, kernel="blocks", block_n=32, num_warps=2, num_stages=3, waves=32, min_split=128),
    "t64/4/3m128": dict(P, block_n=64, num_warps=4, num_stages=3, waves=32, min_split=128),
}
NCU_VARIANTS = ["t32/1/3w32", "b32/2/3w32", "b32/1/3w32"]


def time_variant(case, kv, cfg):
    plan = plan_decode(case.kv_indptr, num_q_heads=case.Hq, num_kv_heads=case.Hkv, head_dim=case.D,
                       max_seq_len=case.ctx, **cfg)
    out = torch.empty_like(case.q)
    fn = lambda: run_decode(plan, case.q, kv, case.kv_indptr, case.kv_indices, case.params, out=out, check=False)
    fn()
    torch.cuda.synchronize()
    ck = plan.compiled
    res = {"n_regs": getattr(ck, "n_regs", None), "n_spills": getattr(ck, "n_spills", None),
           "shared": getattr(getattr(ck, "metadata", None), "shared", None), "num_splits": plan.num_splits}
    ms, _ = bench_graph(fn)
    out.fill_(float("nan"))
    fn()
    return ms, out.float(), res


def flashinfer_times(case, ws):
    import flashinfer
    got = {}
    Hq, Hkv, D = case.Hq, case.Hkv, case.D
    kv_bf = (case.k.view(-1, PAGE, Hkv, D), case.v.view(-1, PAGE, Hkv, D))
    kv_f8 = (case.k8.view(-1, PAGE, Hkv, D), case.v8.view(-1, PAGE, Hkv, D))
    for kernel, dtype, kvs, kw in (("flashinfer_bf16", torch.bfloat16, kv_bf, {}),
                                   ("flashinfer_fp8", torch.float8_e4m3fn, kv_f8, dict(k_scale=1.0, v_scale=1.0))):
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
        w.plan(case.page_indptr, case.page_indices, case.last_page_len, Hq, Hkv, D, PAGE,
               q_data_type=torch.bfloat16, kv_data_type=dtype, sm_scale=1.0 / D)
        got[kernel] = bench_graph(lambda: w.run(case.q, kvs, **kw), kernel)[0]
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ncu-target", action="store_true")
    ap.add_argument("--only", help="comma-separated variant names")
    ap.add_argument("--points", help="comma-separated indices into POINTS (default: all)")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    if args.ncu_target:
        name, Hq, Hkv, D, B, ctx = POINTS[0]
        case = Case(Hq, Hkv, D, B, ctx, dev, with_fp8=False)
        for v in NCU_VARIANTS:
            plan = plan_decode(case.kv_indptr, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, max_seq_len=ctx,
                               **VARIANTS[v])
            for _ in range(2):  # first launch compiles; ncu is told to skip it
                run_decode(plan, case.q, case.mx, case.kv_indptr, case.kv_indices, case.params)
            torch.cuda.synchronize()
        return
    try:
        ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=dev)
        import flashinfer  # noqa: F401
    except Exception as e:  # noqa: BLE001
        print("flashinfer unavailable:", repr(e)[:200], flush=True)
        ws = None
    only = set(args.only.split(",")) if args.only else None
    rows = []
    points = [POINTS[int(i)] for i in args.points.split(",")] if args.points else POINTS
    for name, Hq, Hkv, D, B, ctx in points:
        case = Case(Hq, Hkv, D, B, ctx, dev, with_fp8=ws is not None)
        peers = flashinfer_times(case, ws) if ws is not None else {}
        variants = dict(VARIANTS)
        if B * ctx <= 256 * 1024:
            variants.update(SMALL)
        ref = None
        lines = []
        for vname, cfg in variants.items():
            if only and vname not in only and vname != "default":
                continue
            try:
                ms, out, res = time_variant(case, case.mx, cfg)
            except Exception as e:  # noqa: BLE001
                print(f"{name} B={B} ctx={ctx} {vname} failed: {repr(e)[:300]}", flush=True)
                continue
            if ref is None:
                ref = out
            diff = float((out - ref).norm() / ref.norm()) if torch.isfinite(out).all() else float("nan")
            r = {"variant": vname, "shape": name, "Hq": Hq, "Hkv": Hkv, "D": D, "B": B, "ctx": ctx, "ms": ms,
                 "GBps": case.bytes_mxfp8 / (ms * 1e-3) / 1e9, "diff_vs_default": diff, **res, **cfg,
                 **{f"{k}_ms": v for k, v in peers.items()}}
            rows.append(r)
            ratio = " ".join(f"x{k.split('_')[1]} {v / ms:.2f}" for k, v in peers.items())
            lines.append(f"  {vname:18s} {ms:.4f} ms {r['GBps']:6.0f} GB/s {ratio}  diff {diff:.1e} "
                         f"regs {res['n_regs']} spills {res['n_spills']} smem {res['shared']} "
                         f"splits {res['num_splits']}")
            print(f"{name} B={B} ctx={ctx}:" + lines[-1], flush=True)
        try:
            ms, _, _ = time_variant(case, case.bf, dict(P, block_n=64, num_warps=2, num_stages=2))
            lines.append(f"  ours_bf16 paged64/2/2 {ms:.4f} ms")
        except Exception as e:  # noqa: BLE001
            lines.append(f"  ours_bf16 failed {repr(e)[:200]}")
        print(f"== {name} B={B} ctx={ctx} peers " + " ".join(f"{k} {v:.4f} ms" for k, v in peers.items()))
        print("\n".join(lines), flush=True)
        with open(os.path.join(args.out, "variants.json"), "w") as f:
            json.dump(rows, f, indent=1)
        del case
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
