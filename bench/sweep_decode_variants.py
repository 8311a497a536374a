"""Kernel-variant sweep for MXFP8 decode on the GPU: every variant next to FlashInfer bf16 / fp8 at the same points.

Each variant's output is compared with the default plan's (relative Frobenius difference; the default is checked
against float64 by gpu_tests/check_triton_gpu.py). Timing as bench_decode.py (one call replayed from a CUDA graph,
L2 cleared between replays). Prints a table per point and writes ``<out>/variants.json``.

    python bench/sweep_decode_variants.py --out $OUT            # the sweep
    python bench/sweep_decode_variants.py --ncu-target           # one launch per named variant, for ncu

Variants with whole pages read the Case's page table (``run_decode(..., page_table=...)``); "default" reads the
per-token CSR. The variants of options the kernels no longer have (the block kernel with V loaded untransposed,
``b*``; register caps through Triton's ``maxnreg``, ``*r144`` / ``*r128``; the tile kernel's register prefetch and
float32 dequantization) and the per-launch register report are in commit 77424c7 (their rows stay in the results
they wrote, bench/results/history/2026-11-29-decode-v-transposed/ and later); ``tools/compile_sm90.py`` reports
registers and spills.
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
from sglang_inkling_backend.triton import DecodeConfig, plan_decode, run_decode  # noqa: E402

POINTS = [("inkling-tp4", 16, 2, 128, 128, 32768), ("gqa8-tp1", 64, 8, 128, 32, 16384),
          ("gemma3-270m", 4, 1, 256, 128, 16384), ("inkling-tp4", 16, 2, 128, 8, 32768),
          ("inkling-tp4", 16, 2, 128, 1, 32768), ("gemma3-270m", 4, 1, 256, 8, 32768),
          ("inkling-tp4", 16, 2, 128, 32, 4096), ("gemma3-270m", 4, 1, 256, 1, 4096),
          # 8..16: the grid's middle and small points
          ("inkling-tp4", 16, 2, 128, 8, 4096), ("gqa8-tp1", 64, 8, 128, 8, 1024),
          ("inkling-tp4", 16, 2, 128, 32, 1024),
          ("gqa8-tp1", 64, 8, 128, 128, 1024), ("gemma3-270m", 4, 1, 256, 32, 4096),
          ("gemma3-270m", 4, 1, 256, 128, 1024), ("inkling-tp4", 16, 2, 128, 1, 16384),
          ("gemma3-270m", 4, 1, 256, 1, 16384), ("gemma3-270m", 4, 1, 256, 8, 16384),
          # 17..19: more of the small and middle points
          ("inkling-tp4", 16, 2, 128, 8, 1024), ("gemma3-270m", 4, 1, 256, 8, 4096),
          ("gemma3-270m", 4, 1, 256, 32, 1024),
          # 20..27: the other single requests
          ("inkling-tp4", 16, 2, 128, 1, 1024), ("inkling-tp4", 16, 2, 128, 1, 4096),
          ("gqa8-tp1", 64, 8, 128, 1, 1024), ("gqa8-tp1", 64, 8, 128, 1, 4096),
          ("gqa8-tp1", 64, 8, 128, 1, 16384), ("gqa8-tp1", 64, 8, 128, 1, 32768),
          ("gemma3-270m", 4, 1, 256, 1, 1024), ("gemma3-270m", 4, 1, 256, 1, 32768)]

P = dict(page_size=PAGE)
V = dict(P, kernel="blocks", block_n=32, num_warps=1)  # the block kernel (V loaded transposed)
VARIANTS = {
    "default": {},  # per-token indices (the CSR)
    "planned": dict(P),  # choose_config's choice for whole pages
    "planned/pdl": dict(P, pdl_merge=True),  # the same, the merge launched early (sm_90+: DecodeConfig.pdl_merge)
    "t64/2/3w32": dict(P, block_n=64, num_warps=2, num_stages=3, waves=32),
    "t32/1/3w32": dict(P, block_n=32, num_warps=1, num_stages=3, waves=32),
    "t32/1/3w16": dict(P, block_n=32, num_warps=1, num_stages=3, waves=16),
    "t32/1/3w64": dict(P, block_n=32, num_warps=1, num_stages=3, waves=64),
    "t16/1/3w32": dict(P, block_n=16, num_warps=1, num_stages=3, waves=32),
    "t32/2/3w32": dict(P, block_n=32, num_warps=2, num_stages=3, waves=32),
    "t64/4/3w32": dict(P, block_n=64, num_warps=4, num_stages=3, waves=32),
    # V loaded as [channels, keys]: streamed through shared memory, far fewer registers
    # (offline, triton 3.6: 158 against 249 at head_dim 128 on one warp; 240 without spills at head_dim 256)
    "v32/1/3w64": dict(V, num_stages=3, waves=64),
    "v32/1/3w32": dict(V, num_stages=3, waves=32),
    "v32/1/5w64": dict(V, num_stages=5, waves=64),
    "v32/1/2w32": dict(V, num_stages=2, waves=32),
    "v64/1/3w64": dict(V, block_n=64, num_stages=3, waves=64),
    "v64/2/3w64": dict(V, block_n=64, num_warps=2, num_stages=3, waves=64),
    "v64/4/3w32": dict(V, block_n=64, num_warps=4, num_stages=3, waves=32),
    "v32/1/4w64": dict(V, num_stages=4, waves=64),
    "v32/1/3w96": dict(V, num_stages=3, waves=96),
    "v32/1/5w96": dict(V, num_stages=5, waves=96),
    "v32/2/3w64": dict(V, num_warps=2, num_stages=3, waves=64),
}
# Split counts by whole rounds of resident programs: "rounds" r gives num_splits = r * resident * SMs // pairs
# (then rounded by plan_decode to whole 32-key tiles), resident = programs per SM at that head_dim (registers)
for _st in (2, 3, 4, 5):
    for _r in (1, 2, 3, 4):
        VARIANTS[f"v32/1/{_st}r{_r}"] = dict(V, num_stages=_st, rounds=_r)
for _m in (64, 128, 256):  # one round, splits of at least _m keys
    VARIANTS[f"v32/1/3r1m{_m}"] = dict(V, num_stages=3, rounds=1, min_split=_m)
# Removed after they timed slower than the planned kernel at equal splits
# (bench/results/history/2026-11-30-decode-merge-channel-blocks, -decode-single-requests, -decode-v-words; the code
# is in git history at 31e060a): p32/* (V rows permuted), k32/*, kp32/* (K loaded as whole rows), w32/* (V loaded as
# 32-bit words)
VARIANTS["v64/1/3r1"] = dict(V, block_n=64, num_stages=3, rounds=1)
VARIANTS["v64/1/3r2"] = dict(V, block_n=64, num_stages=3, rounds=2)
# (block_n, head_dim): programs per SM, from registers (65536 per SM) and shared memory (227 KB)
RESIDENT = {(32, 128): 12, (32, 256): 8, (64, 128): 8, (64, 256): 4}
SMALL = {  # small batches: shorter splits, more programs
    "t32/1/3m64": dict(P, block_n=32, num_warps=1, num_stages=3, waves=32, min_split=64),
    "t64/4/3m64": dict(P, block_n=64, num_warps=4, num_stages=3, waves=32, min_split=64),
    "v32/2/3m64": dict(V, num_warps=2, num_stages=3, waves=32, min_split=64),
    "v32/2/3m128": dict(V, num_warps=2, num_stages=3, waves=32, min_split=128),
    "t64/4/3m128": dict(P, block_n=64, num_warps=4, num_stages=3, waves=32, min_split=128),
    # single requests: the planned tile kernel's split counts, and the merge over whole heads (merge_block_d = D,
    # the merge before choose_merge_block_d) against the planned one over channel blocks
    "planned/mD": dict(P, merge_whole=True),
    "t64/4/3w1m64": dict(P, block_n=64, num_warps=4, num_stages=3, waves=1, min_split=64),
    "t64/4/3w2m64": dict(P, block_n=64, num_warps=4, num_stages=3, waves=2, min_split=64),
    "t64/4/3w4m64": dict(P, block_n=64, num_warps=4, num_stages=3, waves=4, min_split=64),
    "t64/4/3w4m64/mD": dict(P, block_n=64, num_warps=4, num_stages=3, waves=4, min_split=64, merge_whole=True),
    "t32/2/3w4m32": dict(P, block_n=32, num_warps=2, num_stages=3, waves=4, min_split=32),
}
NCU_VARIANTS = ["t32/1/3w32", "v32/2/3w64", "v32/1/3w32"]


def make_plan(case, cfg):
    cfg = dict(cfg)
    if cfg.pop("merge_whole", False):
        cfg["merge_block_d"] = case.D
    if "rounds" in cfg:
        resident = RESIDENT[(cfg["block_n"], case.D)] * torch.cuda.get_device_properties(0).multi_processor_count
        cap = -(-case.ctx // cfg.pop("min_split", 1))
        cfg["num_splits"] = max(1, min(cap, cfg.pop("rounds") * resident // (case.B * case.Hkv)))
    page_size = cfg.pop("page_size", None)
    return plan_decode(case.B, num_q_heads=case.Hq, num_kv_heads=case.Hkv, head_dim=case.D, max_seq_len=case.ctx,
                       page_size=page_size, config=DecodeConfig(**cfg))


def run_variant(plan, case, kv, out=None):
    if plan.paged:
        return run_decode(plan, case.q, kv, params=case.params, page_table=case.page_table, seq_lens=case.seq_lens,
                          out=out, check=False)
    return run_decode(plan, case.q, kv, case.kv_indptr, case.kv_indices, case.params, out=out, check=False)


def time_variant(case, kv, cfg):
    plan = make_plan(case, cfg)
    out = torch.empty_like(case.q)
    fn = lambda: run_variant(plan, case, kv, out)
    fn()
    torch.cuda.synchronize()
    res = {"num_splits": plan.num_splits}
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
    ap.add_argument("--ncu-variants", help="with --ncu-target: comma-separated variant names (default: %s)"
                    % ",".join(NCU_VARIANTS))
    ap.add_argument("--ncu-point", type=int, default=0, help="with --ncu-target: index into POINTS")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    if args.ncu_target:
        name, Hq, Hkv, D, B, ctx = POINTS[args.ncu_point]
        case = Case(Hq, Hkv, D, B, ctx, dev, with_fp8=False)
        for v in args.ncu_variants.split(",") if args.ncu_variants else NCU_VARIANTS:
            plan = make_plan(case, VARIANTS[v])
            for _ in range(2):  # first launch compiles; ncu is told to skip it
                run_variant(plan, case, case.mx)
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
                         f"splits {res['num_splits']}")
            print(f"{name} B={B} ctx={ctx}:" + lines[-1], flush=True)
        try:
            ms, _, _ = time_variant(case, case.bf, dict(P, block_n=64, num_warps=2, num_stages=2))
            lines.append(f"  ours_bf16 paged64/2/2 {ms:.4f} ms")
        except Exception as e:  # noqa: BLE001
            lines.append(f"  ours_bf16 failed {repr(e)[:200]}")
        print(f"== {name} B={B} ctx={ctx} peers " + " ".join(f"{k} {v:.4f} ms" for k, v in peers.items()))
        print("\n".join(lines), flush=True)
        os.makedirs(args.out, exist_ok=True)  # written after every point, so a cut run keeps what it timed
        with open(os.path.join(args.out, "variants.json"), "w") as f:
            json.dump(rows, f, indent=1)
        del case
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
