"""One whole decode step of a hybrid model's attention (sliding-window and full layers), ours next to the peers.

A Gemma-3-style layer mix: 5 layers with a 1024-key window, then 1 full layer (``--layers``), batch 32, 32k keys per
request (``--batch``, ``--ctx``), page size 128, softmax scale 1/D, random data. Every layer has its own pool, as
in a real model; a windowed layer's pool holds only the pages its window touches (the page table's entries before
them point at page 0, SGLang's padding page, which no correct kernel reads: a kernel that ignores the window reads
it and fails the check). The step, all layers one after the other, is captured in one CUDA graph per kernel and
timed from its replays (``bench_decode.bench_graph``: L2 cleared between replays).

Kernels (each with its own window argument):
  - ``ours_mxfp8`` / ``ours_bf16``: ``plan_decode(window=..., kv_format=...)`` per layer, page table, as the route
    serves it (each row's ``layer_kernels``); ``ours_mxfp8_triton``, where the route took the Hopper kernel for a
    layer: every layer on the Triton kernels;
  - ``flashinfer_bf16`` / ``flashinfer_fp8``: FlashInfer's FA2 decode wrapper, ``window_left = window - 1``;
  - ``flashinfer_xqa_bf16`` / ``flashinfer_xqa_fp8`` (FlashInfer >= 0.7): XQA, ``window_left = window - 1``;
  - ``sdpa_bf16``: torch SDPA over each layer's visible keys, contiguous (what an unpaged cache would read).
Every layer's output is checked against float64 attention over the values that kernel reads, for the first
``bench_decode.CHECK_REQUESTS`` requests, with ``bench_decode.tolerance`` (XQA's fp8 kernel rounds Q and P to e4m3).

``BENCH_PEERS`` (bench_decode.wanted) keeps only the peers it names; ``BENCH_HOPPER_VARIANTS`` adds rows of the
Hopper kernel's variants.

Bytes per step: each layer's visible keys (window or whole context) x KV heads x (K + V) in the format's bytes.

    python bench/bench_hybrid_step.py --out $OUT        # writes $OUT/hybrid-step.json and prints the table
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import bench_decode as bd  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.reference.attention import attend  # noqa: E402
from sglang_inkling_backend.triton import DecodeWorkspace, plan_decode, run_decode  # noqa: E402

PAGE = bd.PAGE
SHAPES = {"gemma3-27b-tp2": (16, 8, 128), "gemma3-270m": (4, 1, 256), "gemma3-12b-tp1": (16, 8, 256)}


class LayerPool:
    """One layer's pools (bf16, fp8, MXFP8) and page table for B requests of ``ctx`` keys; ``window``: only the
    pages the window touches are allocated (the others map to page 0)."""

    def __init__(self, Hq, Hkv, D, B, ctx, window, dev):
        self.window, self.B, self.ctx, self.Hkv, self.D = window, B, ctx, Hkv, D
        pages_per = math.ceil(ctx / PAGE)
        first = 0 if window is None else max(0, ctx - window) // PAGE  # the first page the window touches
        owned = pages_per - first
        npages = B * owned + 1
        slots = npages * PAGE
        self.k = torch.randn(slots, Hkv, D, device=dev, dtype=torch.bfloat16)
        self.v = torch.randn(slots, Hkv, D, device=dev, dtype=torch.bfloat16)
        ids = (torch.randperm(npages - 1, device=dev, dtype=torch.int32) + 1).view(B, owned)
        self.page_table = torch.zeros(B, pages_per, device=dev, dtype=torch.int32)
        self.page_table[:, first:] = ids
        self.seq_lens = torch.full((B,), ctx, device=dev, dtype=torch.int32)
        self.mx = bd.mxfp8_copy(self.k, self.v)
        self.bf = PagedKV(self.k, self.v)
        self.k8, self.v8 = self.k.to(torch.float8_e4m3fn), self.v.to(torch.float8_e4m3fn)
        self.params = AttentionParams(softmax_scale=1.0 / D, window=window)
        self.visible = ctx if window is None else min(ctx, window)
        # FlashInfer's paged arguments: every request's pages from position 0 (page 0 where not owned)
        self.page_indptr = torch.arange(B + 1, device=dev, dtype=torch.int32) * pages_per
        self.page_indices = self.page_table.reshape(-1).contiguous()
        self.last_page_len = torch.full((B,), ctx - (pages_per - 1) * PAGE, device=dev, dtype=torch.int32)

    def slots(self, b):
        pos = torch.arange(self.ctx, device=self.k.device)
        return (self.page_table[b, pos // PAGE].long() * PAGE + pos % PAGE)

    def reference(self, q, read):
        """float64 attention of the first requests over ``read(slots)`` -> (k, v) ([ctx, Hkv, D])."""
        refs = []
        for b in range(min(self.B, bd.CHECK_REQUESTS)):
            k, v = read(self.slots(b))
            refs.append(attend(q[b:b + 1].double(), torch.tensor([self.ctx - 1], device=q.device), k.double(),
                               v.double(), self.params))
        return torch.cat(refs)

    def visible_rows(self):
        """[B, Hkv, visible, D] contiguous K and V of the visible keys (SDPA's input)."""
        pos = torch.arange(self.ctx - self.visible, self.ctx, device=self.k.device)
        idx = (self.page_table[:, pos // PAGE].long() * PAGE + pos % PAGE)  # [B, visible]
        return (self.k[idx].transpose(1, 2).contiguous(), self.v[idx].transpose(1, 2).contiguous())


def step_bytes(layers, per_elem):
    return sum(layer.B * layer.visible * layer.Hkv * 2 * per_elem(layer.D) for layer in layers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shapes", default="gemma3-27b-tp2,gemma3-270m", help=f"comma-separated, of {list(SHAPES)}")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--layers", default="5:1", help="windowed:full layers of the step")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke run of the script under TRITON_INTERPRET=1 (wall times, meaningless)")
    args = ap.parse_args()
    n_win, n_full = (int(x) for x in args.layers.split(":"))
    dev = args.device
    if dev == "cpu":
        def wall_ms(fn, label=""):
            tic = time.perf_counter()
            fn()
            return 1000 * (time.perf_counter() - tic), "eager"
        bd.bench_graph = wall_ms
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    try:
        import flashinfer
        fi_version = flashinfer.__version__
    except Exception as e:  # noqa: BLE001
        flashinfer, fi_version = None, None
        print("flashinfer import failed:", repr(e)[:300], flush=True)
    meta = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
            "flashinfer": fi_version, "batch": args.batch, "ctx": args.ctx, "window": args.window, "layers": args.layers}
    rows = []
    ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=dev) if flashinfer else None
    xqa_ws = torch.zeros(256 * 1024 * 1024, dtype=torch.uint8, device=dev) if flashinfer else None
    for shape in args.shapes.split(","):
        Hq, Hkv, D = SHAPES[shape]
        B, ctx = args.batch, args.ctx
        layers = [LayerPool(Hq, Hkv, D, B, ctx, args.window, dev) for _ in range(n_win)]
        layers += [LayerPool(Hq, Hkv, D, B, ctx, None, dev) for _ in range(n_full)]
        q = torch.randn(B, Hq, D, device=dev, dtype=torch.bfloat16)
        bytes_of = {"bf16": step_bytes(layers, lambda d: 2 * d), "fp8": step_bytes(layers, lambda d: d),
                    "mxfp8": step_bytes(layers, lambda d: d + d // 32)}
        refs = {"mxfp8": [lay.reference(q, lay.mx.read) for lay in layers],
                "bf16": [lay.reference(q, lay.bf.read) for lay in layers],
                "fp8": [lay.reference(q, lambda s, lay=lay: (lay.k8[s].float(), lay.v8[s].float())) for lay in layers]}
        outs = [torch.empty_like(q) for _ in layers]

        def record(kernel, fmt, step, library, backend, **extra):
            step()
            checks = [bd.check(o, r, kernel) for o, r in zip(outs, refs[fmt])]  # (rel_err, correct) per layer
            errs = [err for err, _ in checks]
            ok = all(passed for _, passed in checks)
            ms, timing = bd.bench_graph(step, kernel)
            rows.append({"kernel": kernel, "shape": shape, "Hq": Hq, "Hkv": Hkv, "D": D, "B": B, "ctx": ctx,
                         "window": args.window, "layers": args.layers, "ms": ms,
                         "GBps": bytes_of[fmt] / (ms * 1e-3) / 1e9, "bytes": bytes_of[fmt], "timing": timing,
                         "library": library, "backend": backend, "rel_err_max": max(errs), "correct": ok,
                         "tol": bd.tolerance(kernel), **extra})
            print(f"{shape} {kernel}: {ms:.4f} ms, {rows[-1]['GBps']:.0f} GB/s, rel_err max {max(errs):.2e}"
                  f"{'' if ok else ' WRONG'}", flush=True)

        # ours as the route serves each layer (plan_decode(kv_format=): on an H100/H200 the Gluon Hopper kernel
        # where plan.hopper_decode_fits, the Triton kernels elsewhere); where it took the Hopper kernel for a layer,
        # also ours_mxfp8_triton: every layer on the Triton kernels, the same run
        # BENCH_HOPPER_VARIANTS (bench_decode.py's): rows ours_mxfp8_<name>, routed, with the Hopper kernel's variant
        # constexprs set while they are captured
        variants = [("ours_mxfp8", "mxfp8", True, {}), ("ours_bf16", "bf16", True, {}),
                    ("ours_mxfp8_triton", "mxfp8", False, {})]
        for vname, fields in json.loads(os.environ.get("BENCH_HOPPER_VARIANTS", "{}")).items():
            if set(fields) - {"constexprs"}:  # the route plans each layer: DecodeConfig fields would not apply
                print(f"variant {vname}: left out, it sets {sorted(set(fields) - {'constexprs'})} (the hybrid step "
                      "takes constexprs only)", flush=True)
                continue
            variants.append((f"ours_mxfp8_{vname}", "mxfp8", True, fields.get("constexprs", {})))
        took_hopper = False
        for kernel, fmt, routed, consts in variants:
            if kernel == "ours_mxfp8_triton" and not took_hopper:
                continue
            if consts:
                from sglang_inkling_backend.triton import decode_hopper
                decode_hopper.EXTRA_CONSTEXPRS.update(consts)
            try:
                calls, kernels = [], []
                for lay, out in zip(layers, outs):
                    kv = lay.mx if fmt == "mxfp8" else lay.bf
                    work = DecodeWorkspace.for_max_context(B, Hq, Hkv, D, ctx, dev)
                    plan = plan_decode(B, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, max_seq_len=ctx,
                                       window=lay.window, page_size=PAGE, kv_dtype=kv.k_buffer.dtype,
                                       workspace=work, kv_format=kv.kv_format if routed else None)
                    calls.append((plan, kv, lay, out, work))
                    kernels.append(plan.kernel)
                took_hopper = took_hopper or "hopper" in kernels

                def step(calls=calls):
                    for plan, kv, lay, out, _ in calls:
                        run_decode(plan, q, kv, params=lay.params, page_table=lay.page_table,
                                   seq_lens=lay.seq_lens, out=out, check=False)
                record(kernel, fmt, step, bd.OURS, "+".join(dict.fromkeys(kernels)), layer_kernels=kernels,
                       constexprs=consts or None)
            except Exception as e:  # noqa: BLE001
                print(f"{kernel} {shape} failed: {repr(e)[:300]}", flush=True)
            finally:
                if consts:
                    decode_hopper.EXTRA_CONSTEXPRS.clear()
        if flashinfer is not None:
            fi = f"flashinfer {fi_version}"
            for kernel, dtype, fmt in (("flashinfer_bf16", torch.bfloat16, "bf16"),
                                       ("flashinfer_fp8", torch.float8_e4m3fn, "fp8")):
                if not bd.wanted(kernel):
                    continue
                try:
                    wrappers = []
                    for lay in layers:
                        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
                        w.plan(lay.page_indptr, lay.page_indices, lay.last_page_len, Hq, Hkv, D, PAGE,
                               window_left=-1 if lay.window is None else lay.window - 1,
                               q_data_type=torch.bfloat16, kv_data_type=dtype, sm_scale=1.0 / D)
                        kvs = ((lay.k, lay.v) if fmt == "bf16" else (lay.k8, lay.v8))
                        wrappers.append((w, tuple(t.view(-1, PAGE, Hkv, D) for t in kvs)))
                    kw = {} if fmt == "bf16" else dict(k_scale=1.0, v_scale=1.0)

                    def step(wrappers=wrappers, kw=kw):
                        for (w, kvs), out in zip(wrappers, outs):
                            w.run(q, kvs, out=out, **kw)
                    record(kernel, fmt, step, fi, "fa2")
                except Exception as e:  # noqa: BLE001
                    print(f"{kernel} {shape} failed: {repr(e)[:300]}", flush=True)
            xqa = getattr(getattr(flashinfer, "decode", None), "trtllm_batch_decode_with_kv_cache", None)
            if xqa is not None:
                for kernel, fmt in (("flashinfer_xqa_bf16", "bf16"), ("flashinfer_xqa_fp8", "fp8")):
                    if not bd.wanted(kernel):
                        continue
                    try:
                        args_per = []
                        for lay in layers:
                            kvs = ((lay.k, lay.v) if fmt == "bf16" else (lay.k8, lay.v8))
                            args_per.append((tuple(t.view(-1, PAGE, Hkv, D) for t in kvs), lay,
                                             lay.seq_lens.to(torch.uint32)))

                        def step(args_per=args_per):
                            for (kvs, lay, lens), out in zip(args_per, outs):
                                xqa(q, kvs, xqa_ws, lay.page_table, lens, ctx, bmm1_scale=1.0 / D, bmm2_scale=1.0,
                                    kv_layout="NHD", backend="xqa", out=out,
                                    window_left=-1 if lay.window is None else lay.window - 1)
                        record(kernel, fmt, step, fi, "xqa")
                    except Exception as e:  # noqa: BLE001
                        print(f"{kernel} {shape} failed: {repr(e)[:300]}", flush=True)
        if bd.wanted("sdpa_bf16"):
            try:
                dense = [lay.visible_rows() for lay in layers]
                q4 = q[:, :, None, :]

                def step(dense=dense):
                    for (kc, vc), out in zip(dense, outs):
                        out.copy_(torch.nn.functional.scaled_dot_product_attention(q4, kc, vc, scale=1.0 / D,
                                                                                   enable_gqa=True)[:, :, 0])
                record("sdpa_bf16", "bf16", step, f"torch {torch.__version__}", "sdpa")
                del dense
            except Exception as e:  # noqa: BLE001
                print(f"sdpa_bf16 {shape} failed: {repr(e)[:300]}", flush=True)
        del layers
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "hybrid-step.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print_table(rows, meta)


def print_table(rows, meta):
    """Ours (MXFP8) against the fastest correct bf16 and fp8 peers per shape; the issue's target: 1.7x bf16."""
    print(f"\n{meta}")
    by_shape = {(r["kernel"], r["shape"]): r for r in rows}
    for shape in dict.fromkeys(r["shape"] for r in rows):
        by = {r["kernel"]: r for r in rows if r["shape"] == shape}
        mx = by.get("ours_mxfp8")
        if mx is None:
            continue
        bf, f8 = bd.fastest(by_shape, bd.BF16_PEERS, (shape,)), bd.fastest(by_shape, bd.FP8_PEERS, (shape,))
        xb = bf["ms"] / mx["ms"] if bf else float("nan")
        x8 = f8["ms"] / mx["ms"] if f8 else float("nan")
        print(f"{shape}: ours MXFP8 {mx['ms']:.4f} ms ({mx['GBps']:.0f} GB/s) | fastest bf16 "
              f"{bf['kernel'] if bf else '-'} {bf['ms'] if bf else float('nan'):.4f} ms: {xb:.2f}x | fastest fp8 "
              f"{f8['kernel'] if f8 else '-'} {f8['ms'] if f8 else float('nan'):.4f} ms: {x8:.2f}x | target 1.7x bf16: "
              f"{'met' if xb >= 1.7 else 'missed'}")
        for r in sorted(by.values(), key=lambda r: r["ms"]):
            print(f"    {r['kernel']:22} {r['ms']:8.4f} ms {r['GBps']:6.0f} GB/s  rel_err {r['rel_err_max']:.2e}"
                  f" (tol {r['tol']:.0e}){'' if r['correct'] else ' WRONG'}")


if __name__ == "__main__":
    main()
