"""One layer's extend (prefill, chunked prefill over a cached prefix) on a GPU: ours next to FlashInfer, each output
checked against float64.

Per shape (heads Hq/Hkv/D, B requests of ``prefix`` cached keys and ``new`` new tokens, optional window), one pool
per format with the batch's keys in randomly ordered 128-slot pages (as a serving pool holds them), and:
  - ``flashinfer_bf16``: FlashInfer's ragged prefill (FA3 on Hopper) over the batch's bf16 K/V already contiguous,
    one call: the least a FlashInfer-bf16 server spends on the layer (SGLang's flashinfer backend runs the new
    tokens ragged and the prefix paged, then merges the two);
  - ``ours_mxfp8`` / ``ours_bf16``: the route's extend (``gpu.route.GpuRoute.extend`` with the FlashInfer family:
    gather the rail's slots, dequantized, then FlashInfer's ragged prefill), timed per layer (the step's plan is
    made once, outside the timing, as every layer after the first shares it);
  - ``ours_mxfp8_triton`` / ``ours_bf16_triton``: the Triton extend kernel (``INKLING_EXTEND_KERNEL=triton``).
Check: ``CHECK_ROWS`` query rows of every request (its first, middle and last and some random ones), float64
attention over the values that pool holds, relative Frobenius error below ``TOL`` (bf16 Q, K, P: ~4e-3 seen).

    python bench/bench_extend.py --out $OUT       # prints the table, writes $OUT/extend.json
    BENCH_PACKAGE_ROOT=old python bench/bench_extend.py --kernels triton --out $OUT/old
                                                  # the Triton rows only (no FlashInfer), from another copy of the
                                                  # package (bench/extend_guard_call.sh)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import triton

# The package this bench times: this checkout's, or another copy's (an older commit's, for a before/after in one call).
PACKAGE_ROOT = os.path.abspath(os.environ.get("BENCH_PACKAGE_ROOT")
                               or os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, PACKAGE_ROOT)

from sglang_inkling_backend import triton as kernels  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.flashinfer.extend import FlashInferExtend  # noqa: E402
from sglang_inkling_backend.flashinfer.install import load_flashinfer  # noqa: E402
from sglang_inkling_backend.rails import KVRails  # noqa: E402
from sglang_inkling_backend.step_plans import DecodePlanCache  # noqa: E402
from sglang_inkling_backend.gpu.route import GpuRoute  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402

PAGE = 128
TOL = 2e-2
CHECK_ROWS = 8
# (label, Hq, Hkv, D, B, prefix, new, window)
SHAPES = [
    ("gqa4 prefill 4x4k", 32, 8, 128, 4, 0, 4096, None),
    ("gqa4 prefill 1x16k", 32, 8, 128, 1, 0, 16384, None),
    ("gqa4 chunk 8x512 on 4k", 32, 8, 128, 8, 4096, 512, None),
    ("gqa4 chunk 1x4k on 32k", 32, 8, 128, 1, 32768, 4096, None),
    ("gqa4 chunk 1x16k on 32k", 32, 8, 128, 1, 32768, 16384, None),
    ("gqa8 prefill 2x8k", 32, 4, 128, 2, 0, 8192, None),
    ("d256 prefill 2x8k", 16, 8, 256, 2, 0, 8192, None),
    ("gqa4 window 4k, 1x4k on 16k", 32, 8, 128, 1, 16384, 4096, 4096),
    ("l16 model 8/2 prefill 32x1k", 8, 2, 128, 32, 0, 1024, None),
    ("l16 model 8/2 prefill 4x32k", 8, 2, 128, 4, 0, 32768, None),
]


def make_case(Hq, Hkv, D, B, prefix, new, dev, gen):
    kvlen = prefix + new
    pages_per = math.ceil(kvlen / PAGE)
    npages = B * pages_per + 1  # page 0: padding, never read
    order = torch.randperm(npages - 1, generator=gen)[: B * pages_per] + 1
    slots = (order.view(B, pages_per, 1) * PAGE + torch.arange(PAGE).view(1, 1, PAGE)).view(B, -1)[:, :kvlen]
    indices = slots.reshape(-1).to(dev)
    indptr = torch.arange(B + 1, device=dev) * kvlen
    qo = torch.arange(B + 1, device=dev) * new
    nslots = npages * PAGE
    k = torch.randn(nslots, Hkv, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(nslots, Hkv, D, device=dev, dtype=torch.bfloat16)
    layout = ScaleLayout.for_pool(nslots, Hkv, D, PAGE)
    data = lambda: torch.empty(nslots, Hkv, D, dtype=torch.float8_e4m3fn, device=dev)
    mx = PagedKV(data(), data(), layout.empty(dev), layout.empty(dev), layout)
    kernels.store_kv_mxfp8(mx, torch.arange(nslots, device=dev), k, v)
    q = torch.randn(B * new, Hq, D, device=dev, dtype=torch.bfloat16)
    return q, {"mxfp8": mx, "bf16": PagedKV(k, v)}, KVRails(indptr, indices), qo


def check(out, q, kv, rails, qo, params, gen):
    """Relative error of ``out`` against float64 on CHECK_ROWS rows of every request."""
    errs_num = errs_den = 0.0
    B = qo.numel() - 1
    group = q.shape[1] // kv.num_kv_heads
    for b in range(B):
        q0, q1 = int(qo[b]), int(qo[b + 1])
        k0, k1 = int(rails.indptr[b]), int(rails.indptr[b + 1])
        n, m = k1 - k0, q1 - q0
        rows = sorted({0, m // 2, m - 1, *torch.randint(0, m, (CHECK_ROWS - 3,), generator=gen).tolist()})
        k, v = kv.read(rails.indices[k0:k1])
        k = k.double().repeat_interleave(group, 1)
        v = v.double().repeat_interleave(group, 1)
        for r in rows:
            pos = n - m + r
            lo = 0 if params.window is None else max(0, pos - params.window + 1)
            logits = torch.einsum("hd,khd->hk", q[q0 + r].double(), k[lo:pos + 1]) * params.softmax_scale
            want = torch.einsum("hk,khd->hd", torch.softmax(logits, -1), v[lo:pos + 1])
            errs_num += float((out[q0 + r].double() - want).norm() ** 2)
            errs_den += float(want.norm() ** 2)
    return math.sqrt(errs_num / errs_den)


def time_ms(fn, rep=20):
    return triton.testing.do_bench(fn, warmup=3, rep=rep, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--shapes", default="", help="comma-separated indices into SHAPES (default: all)")
    ap.add_argument("--budget-s", type=float, default=520)
    ap.add_argument("--kernels", choices=("all", "triton"), default="all",
                    help="triton: only the Triton extend kernel's rows, FlashInfer not needed")
    args = ap.parse_args()
    dev = torch.device("cuda")
    package = os.path.dirname(os.path.dirname(os.path.abspath(kernels.__file__)))
    print(f"package: {package}", flush=True)
    with_flashinfer = args.kernels == "all"
    flashinfer = None
    if with_flashinfer:
        flashinfer, why = load_flashinfer(dev, "BatchPrefillWithRaggedKVCacheWrapper")
        if flashinfer is None:
            raise SystemExit(f"FlashInfer is needed: {why}")
        family = FlashInferExtend(flashinfer, dev)
        ours = GpuRoute(kernels, family)
        peer = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(family.workspace, "NHD")
    fi_version = flashinfer.__version__ if flashinfer else None
    print(f"{torch.cuda.get_device_name()}, FlashInfer {fi_version}, triton {triton.__version__}", flush=True)
    triton_only = GpuRoute(kernels, None)
    picked = [SHAPES[int(i)] for i in args.shapes.split(",")] if args.shapes else SHAPES
    start, rows = time.time(), []
    for label, Hq, Hkv, D, B, prefix, new, window in picked:
        if time.time() - start > args.budget_s:
            print(f"skip {label}: budget", flush=True)
            continue
        gen = torch.Generator().manual_seed(0)
        q, pools, rails, qo = make_case(Hq, Hkv, D, B, prefix, new, dev, gen)
        params = AttentionParams(D ** -0.5, window=window)
        row = {"shape": label, "Hq": Hq, "Hkv": Hkv, "D": D, "B": B, "prefix": prefix, "new": new,
               "window": window, "ms": {}, "rel_err": {}}
        runs = {}
        k_contig = v_contig = None
        if with_flashinfer:
            # The peer: FlashInfer on the batch's bf16 K/V, contiguous.
            k_contig, v_contig = pools["bf16"].k_buffer[rails.indices], pools["bf16"].v_buffer[rails.indices]
            peer.plan(qo.to(torch.int32), rails.indptr.to(torch.int32), Hq, Hkv, D, causal=True,
                      window_left=window - 1 if window else -1, sm_scale=params.softmax_scale,
                      q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
            runs["flashinfer_bf16"] = (lambda: peer.run(q, k_contig, v_contig), pools["bf16"])
        for fmt in ("mxfp8", "bf16"):
            kv = pools[fmt]
            if with_flashinfer:
                step = DecodePlanCache()
                ours.extend(q, kv, rails, qo, params, plans=step)  # the step's plan, made once
                runs[f"ours_{fmt}"] = (lambda kv=kv, step=step: ours.extend(q, kv, rails, qo, params, plans=step),
                                       kv)
            runs[f"ours_{fmt}_triton"] = (lambda kv=kv: triton_only.extend(q, kv, rails, qo, params), kv)
        for name, (fn, kv) in runs.items():
            t0 = time.time()
            out = fn()
            torch.cuda.synchronize()
            row["rel_err"][name] = check(out, q, kv, rails, qo, params, gen)
            row["ms"][name] = time_ms(fn)
            row.setdefault("first_call_s", {})[name] = round(time.time() - t0, 1)
        row["correct"] = all(e < TOL for e in row["rel_err"].values())
        if with_flashinfer:
            base = row["ms"]["flashinfer_bf16"]
            row["time_vs_flashinfer_bf16"] = {k: round(v / base, 3) for k, v in row["ms"].items()}
        rows.append(row)
        cells = "  ".join(f"{k} {v:.3f}ms (err {row['rel_err'][k]:.1e})" for k, v in row["ms"].items())
        print(f"{label}: {cells}  correct={row['correct']}", flush=True)
        runs = k_contig = v_contig = pools = None
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "extend.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "flashinfer": fi_version, "package": package,
                   "kernels": args.kernels, "triton": triton.__version__, "tol": TOL, "rows": rows}, f, indent=1)
    if not with_flashinfer:
        print("\n| shape | Triton MXFP8 ms | Triton bf16 ms | max err |\n|---|---|---|---|")
        for r in rows:
            print(f"| {r['shape']} | {r['ms']['ours_mxfp8_triton']:.3f} | {r['ms']['ours_bf16_triton']:.3f} | "
                  f"{max(r['rel_err'].values()):.1e} |")
    else:
        print_flashinfer_table(rows)
    if not all(r["correct"] for r in rows):
        raise SystemExit("some output failed its float64 check")


def print_flashinfer_table(rows):
    print("\n| shape | FI bf16 ms | ours MXFP8 | ours bf16 | Triton MXFP8 | Triton bf16 | max err |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        t = r["time_vs_flashinfer_bf16"]
        print(f"| {r['shape']} | {r['ms']['flashinfer_bf16']:.3f} | {t['ours_mxfp8']:.2f}x | {t['ours_bf16']:.2f}x | "
              f"{t['ours_mxfp8_triton']:.2f}x | {t['ours_bf16_triton']:.2f}x | {max(r['rel_err'].values()):.1e} |")


if __name__ == "__main__":
    main()
