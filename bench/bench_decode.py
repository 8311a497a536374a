"""Paged decode attention on one GPU, ours next to the peers, in one run.

Measures, on the grid Hq/Hkv/D in {16/2/128, 64/8/128, 4/1/256} x batch {1, 8, 32, 128} x context {1k, 4k, 16k,
32k}, page size 128, softmax scale 1/D, random data:
  - ``copy``: the device copy ceiling (bytes read + written per second of a 2 GiB device-to-device copy),
  - ``ours_mxfp8``: this package's Triton decode over an MXFP8 pool (interleaved scales),
  - ``ours_bf16``: the same kernel over a bf16 pool,
  - ``flashinfer_bf16`` / ``flashinfer_fp8``: FlashInfer's BatchDecodeWithPagedKVCacheWrapper (tensor cores) over
    bf16 KV and over fp8 e4m3 KV with a per-tensor scale (FlashInfer's only fp8 KV decode),
  - ``sdpa_bf16``: torch SDPA over contiguous (unpaged) bf16 KV.
GB/s = bytes of KV (+ MXFP8 scale bytes) that must be read / median time of one call replayed from a CUDA graph
(as SGLang runs decode; ``triton.testing.do_bench`` around the replay, which clears the L2 between runs), so no
kernel is charged for Python launch overhead; a kernel that cannot be captured is timed eagerly and its row says
``"timing": "eager"``. ``ours_mxfp8_eager`` is ours without a graph, for reference. The same page table (a random
permutation of pages) feeds every paged kernel.

Writes ``<out>/<date>-<gpu>.json`` (a list of rows {"kernel","shape","Hq","Hkv","D","B","ctx","ms","GBps"}),
``<out>/<date>-<gpu>.png`` (GB/s against context per kernel) and prints a table with our ratios to FlashInfer.
Ours reads the page table (``run_decode(..., page_table=, seq_lens=)``) with ``plan_decode(page_size=128,
kv_dtype=...)``'s own configuration (``choose_config``) and split buffers in a ``DecodeWorkspace``; kernel variants
are compared in ``bench/sweep_decode_variants.py``.

Run on the GPU machine (FlashInfer 0.5.3 from carried wheels, see bench/results/current/README.md):
    python bench/bench_decode.py --out $OUT
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sglang_inkling_backend.reference.attention import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402
from sglang_inkling_backend.triton import DecodeWorkspace, plan_decode, run_decode  # noqa: E402
from sglang_inkling_backend.triton.kv_store import store_kv_mxfp8  # noqa: E402

PAGE = 128
SHAPES = [("inkling-tp4", 16, 2, 128), ("gqa8-tp1", 64, 8, 128), ("gemma3-270m", 4, 1, 256)]
BATCHES = [1, 8, 32, 128]
CTXS = [1024, 4096, 16384, 32768]


def bench(fn, warm=5, rep=30):
    return triton.testing.do_bench(fn, warmup=warm, rep=rep, return_mode="median")


def bench_graph(fn, label=""):
    """Median time of one replay of ``fn`` captured in a CUDA graph (as SGLang runs decode), with do_bench's L2
    clearing between replays: kernel time without Python launch overhead. Falls back to plain do_bench (and says
    so) when ``fn`` cannot be captured. Returns (ms, method)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return bench(graph.replay), "cuda_graph"
    except Exception as e:  # noqa: BLE001
        print(f"{label}: CUDA graph capture failed ({repr(e)[:200]}); timing without a graph", flush=True)
        torch.cuda.synchronize()
        return bench(fn), "eager"


def copy_ceiling(dev):
    n = 2 * 1024**3
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    a.random_(0, 255)
    b = torch.empty_like(a)
    ms = bench(lambda: b.copy_(a), rep=50)
    del a, b
    return 2 * n / (ms * 1e-3) / 1e9


class Case:
    """One grid point's data: a bf16 page pool, its MXFP8 and fp8 copies, one page table."""

    def __init__(self, Hq, Hkv, D, B, ctx, dev, with_fp8=True):
        self.Hq, self.Hkv, self.D, self.B, self.ctx = Hq, Hkv, D, B, ctx
        pages_per = math.ceil(ctx / PAGE)
        npages = B * pages_per + 1  # page 0 holds slot 0, SGLang's padding sink: never used
        slots = npages * PAGE
        self.q = torch.randn(B, Hq, D, device=dev, dtype=torch.bfloat16)
        self.k = torch.randn(slots, Hkv, D, device=dev, dtype=torch.bfloat16)
        self.v = torch.randn(slots, Hkv, D, device=dev, dtype=torch.bfloat16)
        page_ids = torch.randperm(npages - 1, device=dev, dtype=torch.int32) + 1
        self.page_table = page_ids.view(B, pages_per)
        # per-token slots, position order: page_table[b, i // 128] * 128 + i % 128
        pos = torch.arange(ctx, device=dev, dtype=torch.int32)
        self.kv_indices = (self.page_table[:, pos // PAGE] * PAGE + pos % PAGE).reshape(-1).contiguous()
        self.kv_indptr = torch.arange(B + 1, device=dev, dtype=torch.int32) * ctx
        self.seq_lens = torch.full((B,), ctx, device=dev, dtype=torch.int32)
        self.page_indptr = torch.arange(B + 1, device=dev, dtype=torch.int32) * pages_per
        self.last_page_len = torch.full((B,), ctx - (pages_per - 1) * PAGE, device=dev, dtype=torch.int32)
        self.page_indices = self.page_table.reshape(-1).contiguous()
        layout = ScaleLayout.for_pool(slots, Hkv, D, PAGE)
        self.mx = PagedKV(torch.empty(slots, Hkv, D, device=dev, dtype=torch.float8_e4m3fn),
                          torch.empty(slots, Hkv, D, device=dev, dtype=torch.float8_e4m3fn),
                          layout.empty(dev), layout.empty(dev), layout)
        chunk = 1 << 20  # quantize in chunks: the store kernel's grid has one program per token
        for s0 in range(0, slots, chunk):
            loc = torch.arange(s0, min(slots, s0 + chunk), device=dev, dtype=torch.int32)
            store_kv_mxfp8(self.mx, loc, self.k[s0:s0 + chunk], self.v[s0:s0 + chunk], validate=False)
        self.bf = PagedKV(self.k, self.v)
        self.k8 = self.k.to(torch.float8_e4m3fn) if with_fp8 else None
        self.v8 = self.v.to(torch.float8_e4m3fn) if with_fp8 else None
        self.params = AttentionParams(softmax_scale=1.0 / D)
        tokens = B * ctx * Hkv
        self.bytes_bf16 = tokens * D * 2 * 2
        self.bytes_fp8 = tokens * D * 2
        self.bytes_mxfp8 = tokens * (D + D // 32) * 2


def time_ours(case, kv, nbytes, eager=False):
    workspace = DecodeWorkspace.for_max_context(case.B, case.Hq, case.Hkv, case.D, case.ctx, case.q.device)
    plan = plan_decode(case.B, num_q_heads=case.Hq, num_kv_heads=case.Hkv, head_dim=case.D, max_seq_len=case.ctx,
                       page_size=PAGE, kv_dtype=kv.k_buffer.dtype, workspace=workspace)
    out = torch.empty_like(case.q)
    fn = lambda: run_decode(plan, case.q, kv, params=case.params, page_table=case.page_table,
                            seq_lens=case.seq_lens, out=out, check=False)
    fn()
    if eager:
        ms = bench(fn)
    else:
        ms, _ = bench_graph(fn, "ours")
    return ms, nbytes / (ms * 1e-3) / 1e9, plan


def row(kernel, name, case, ms, gbps, **extra):
    r = {"kernel": kernel, "shape": name, "Hq": case.Hq, "Hkv": case.Hkv, "D": case.D, "B": case.B,
         "ctx": case.ctx, "ms": ms, "GBps": gbps}
    r.update(extra)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/results/current"))
    ap.add_argument("--no-grid", action="store_true")
    ap.add_argument("--quick", action="store_true", help="a few grid points only")
    args = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(int(time.time()))
    gpu = torch.cuda.get_device_name().replace("NVIDIA ", "").replace(" ", "-").lower()
    stamp = datetime.date.today().isoformat()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    copy = copy_ceiling(dev)
    rows.append({"kernel": "copy", "shape": "-", "Hq": 0, "Hkv": 0, "D": 0, "B": 0, "ctx": 0, "ms": 0.0,
                 "GBps": copy})
    print(f"copy ceiling {copy:.0f} GB/s", flush=True)
    try:
        import flashinfer
        meta["flashinfer"] = flashinfer.__version__
    except Exception as e:  # noqa: BLE001
        flashinfer = None
        meta["flashinfer_error"] = repr(e)[:300]
        print("flashinfer import failed:", repr(e)[:300], flush=True)
    meta["config"] = ("plan_decode(page_size=128, kv_dtype=pool dtype) defaults (choose_config), page table, "
                      "DecodeWorkspace")
    grid = [(s, b, c) for s in SHAPES for b in BATCHES for c in CTXS]
    if args.quick:
        grid = [(SHAPES[0], 1, 1024), (SHAPES[0], 128, 32768), (SHAPES[1], 32, 16384), (SHAPES[2], 8, 32768)]
    if args.no_grid:
        grid = []
    ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=dev) if flashinfer else None
    for (name, Hq, Hkv, D), B, ctx in grid:
        try:
            case = Case(Hq, Hkv, D, B, ctx, dev)
        except torch.OutOfMemoryError:
            print(f"skip {name} B={B} ctx={ctx}: out of memory", flush=True)
            torch.cuda.empty_cache()
            continue
        got = {}
        for kernel, kv, nbytes, eager in (("ours_mxfp8", case.mx, case.bytes_mxfp8, False),
                                          ("ours_bf16", case.bf, case.bytes_bf16, False),
                                          ("ours_mxfp8_eager", case.mx, case.bytes_mxfp8, True)):
            try:
                ms, gbps, plan = time_ours(case, kv, nbytes, eager=eager)
                rows.append(row(kernel, name, case, ms, gbps, num_splits=plan.num_splits, variant=plan.kernel,
                                block_n=plan.block_n, num_warps=plan.num_warps, num_stages=plan.num_stages,
                                load_v_transposed=plan.kernel == "blocks",  # the block kernel loads V^T
                                timing="eager" if eager else "cuda_graph"))
                got[kernel] = ms
            except Exception as e:  # noqa: BLE001
                print(f"{kernel} {name} B={B} ctx={ctx} failed: {repr(e)[:300]}", flush=True)
        if flashinfer is not None:
            kv_bf = (case.k.view(-1, PAGE, Hkv, D), case.v.view(-1, PAGE, Hkv, D))
            kv_f8 = (case.k8.view(-1, PAGE, Hkv, D), case.v8.view(-1, PAGE, Hkv, D))
            for kernel, dtype, kvs, nbytes, kw in (
                    ("flashinfer_bf16", torch.bfloat16, kv_bf, case.bytes_bf16, {}),
                    ("flashinfer_fp8", torch.float8_e4m3fn, kv_f8, case.bytes_fp8, dict(k_scale=1.0, v_scale=1.0))):
                try:
                    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
                    w.plan(case.page_indptr, case.page_indices, case.last_page_len, Hq, Hkv, D, PAGE,
                           q_data_type=torch.bfloat16, kv_data_type=dtype, sm_scale=1.0 / D)
                    ms, method = bench_graph(lambda: w.run(case.q, kvs, **kw), kernel)
                    rows.append(row(kernel, name, case, ms, nbytes / (ms * 1e-3) / 1e9, timing=method))
                    got[kernel] = ms
                except Exception as e:  # noqa: BLE001
                    print(f"{kernel} {name} B={B} ctx={ctx} failed: {repr(e)[:300]}", flush=True)
        try:
            kc = case.k[PAGE:PAGE + B * ctx].view(B, ctx, Hkv, D).transpose(1, 2).contiguous()
            vc = case.v[PAGE:PAGE + B * ctx].view(B, ctx, Hkv, D).transpose(1, 2).contiguous()
            q4 = case.q[:, :, None, :]
            ms, method = bench_graph(lambda: torch.nn.functional.scaled_dot_product_attention(
                q4, kc, vc, scale=1.0 / D, enable_gqa=True), "sdpa")
            rows.append(row("sdpa_bf16", name, case, ms, case.bytes_bf16 / (ms * 1e-3) / 1e9, timing=method))
            got["sdpa_bf16"] = ms
            del kc, vc
        except Exception as e:  # noqa: BLE001
            print(f"sdpa {name} B={B} ctx={ctx} failed: {repr(e)[:300]}", flush=True)
        line = " ".join(f"{k}={v:.4f}" for k, v in got.items())
        print(f"{name} B={B} ctx={ctx}: {line}", flush=True)
        with open(os.path.join(args.out, f"{stamp}-{gpu}.json"), "w") as f:  # kept current if the run is cut
            json.dump(rows, f, indent=1)
        del case
        torch.cuda.empty_cache()

    path = os.path.join(args.out, f"{stamp}-{gpu}.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(args.out, f"{stamp}-{gpu}-meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"wrote {path}", flush=True)
    try:
        plot(rows, os.path.join(args.out, f"{stamp}-{gpu}.png"), copy)
    except Exception as e:  # noqa: BLE001
        print("plot failed:", repr(e)[:300], flush=True)
    print_table(rows, copy, meta)


def plot(rows, path, copy):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kernels = ["ours_mxfp8", "ours_bf16", "flashinfer_bf16", "flashinfer_fp8", "sdpa_bf16"]
    fig, axes = plt.subplots(len(SHAPES), len(BATCHES), figsize=(4 * len(BATCHES), 3.2 * len(SHAPES)),
                             sharex=True, sharey=True, squeeze=False)
    for i, (name, Hq, Hkv, D) in enumerate(SHAPES):
        for j, B in enumerate(BATCHES):
            ax = axes[i][j]
            for kern in kernels:
                pts = sorted((r["ctx"], r["GBps"]) for r in rows
                             if r["kernel"] == kern and r["shape"] == name and r["B"] == B)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=kern)
            ax.axhline(copy, color="gray", ls="--", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{Hq}/{Hkv}/{D} B={B}", fontsize=9)
            if i == len(SHAPES) - 1:
                ax.set_xlabel("context")
            if j == 0:
                ax.set_ylabel("GB/s (bytes that must be read)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Paged decode attention, page 128 (dashed: device copy ceiling)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", flush=True)


def print_table(rows, copy, meta):
    by = {}
    for r in rows:
        by[(r["kernel"], r["shape"], r["B"], r["ctx"])] = r
    print(f"\n{meta}\ncopy ceiling {copy:.0f} GB/s")
    hdr = (f"{'shape':12} {'B':>4} {'ctx':>6} | {'mx ms':>7} {'mx GB/s':>7} | {'ourbf ms':>8} | {'fi bf ms':>8} "
           f"{'fi8 ms':>7} {'sdpa ms':>7} | {'x fibf':>6} {'x fi8':>6} {'x sdpa':>6} {'x ourbf':>7} | target")
    print(hdr)
    for (name, Hq, Hkv, D) in SHAPES:
        for B in BATCHES:
            for ctx in CTXS:
                mx = by.get(("ours_mxfp8", name, B, ctx))
                if mx is None:
                    continue
                def ms(k):
                    r = by.get((k, name, B, ctx))
                    return r["ms"] if r else float("nan")
                fb, f8, sd, ob = ms("flashinfer_bf16"), ms("flashinfer_fp8"), ms("sdpa_bf16"), ms("ours_bf16")
                m = mx["ms"]
                big = B * ctx >= 512 * 1024
                verdict = "ok"
                if fb / m < 1.0:
                    verdict = "SLOWER than fi bf16"
                elif big and (fb / m < 1.7 or f8 / m < 1.3):
                    verdict = "miss (>=512k: 1.7x/1.3x)"
                print(f"{name:12} {B:>4} {ctx:>6} | {m:7.4f} {mx['GBps']:7.0f} | {ob:8.4f} | {fb:8.4f} {f8:7.4f} "
                      f"{sd:7.4f} | {fb / m:6.2f} {f8 / m:6.2f} {sd / m:6.2f} {ob / m:7.2f} | {verdict}")


if __name__ == "__main__":
    main()
