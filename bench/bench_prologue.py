"""Benchmark: the fused Triton Inkling decode prologue against the unfused chain of separate torch ops (short conv,
conv-cache update, RMSNorm, tau, MXFP8 quantize, paged store), at Inkling's per-rank shapes (Hq 16, Hkv 2, D 128,
W 4; TP4 of 64/8 heads) and batch 1, 8, 64, 128, in MXFP8 and bf16 pool modes.

Each is timed two ways, medians of ``triton.testing.do_bench``: eager (a Python call per step, what runs without
CUDA graphs) and replayed from a CUDA graph (what SGLang's decode runs: launch gaps gone, GPU time only). The fused
eager call skips the slot-value checks (``check_values=False``, as under capture); their cost is timed on its own.
The inputs are a few hundred KB and stay in L2 (so are they in serving: the prologue follows the qkvr GEMM).

    python bench/bench_prologue.py [--out-dir bench/results] [--batches 1 8 64 128]

Prints a table and writes ``<out-dir>/<date>-<gpu>-prologue.json``: a list of rows
``{"kernel", "mode", "timing", "Hq", "Hkv", "D", "W", "B", "ms"}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend.reference.prologue import log_scaling_tau  # noqa: E402
from sglang_inkling_backend.triton.prologue import inkling_attn_prologue_decode  # noqa: E402

HQ, HKV, D, W, D_REL = 16, 2, 128, 4, 16
EPS = 1e-6


def make_inputs(batch: int, mx: bool, device="cuda"):
    g = torch.Generator(device="cpu").manual_seed(batch)
    dq, dkv = HQ * D, HKV * D
    cache_slots, kv_slots = 4 * batch + 8, 128 * (batch // 128 + 4)
    packed = torch.randn(batch, dq + 2 * dkv + HQ * D_REL, generator=g).bfloat16().to(device)
    kv_dtype = torch.float8_e4m3fn if mx else torch.bfloat16
    args = dict(
        qkvr=packed[:, :dq],
        k_cache=torch.randn(cache_slots, W - 1, dkv, generator=g).bfloat16().to(device),
        v_cache=torch.randn(cache_slots, W - 1, dkv, generator=g).bfloat16().to(device),
        cache_indices=torch.arange(1, batch + 1, dtype=torch.int32, device=device),
        cache_mask=torch.ones(batch, dtype=torch.bool, device=device),
        k_weight=(torch.randn(dkv, W, generator=g) * 0.5).bfloat16().to(device),
        v_weight=(torch.randn(dkv, W, generator=g) * 0.5).bfloat16().to(device),
        q_gamma=(1 + 0.1 * torch.randn(D, generator=g)).bfloat16().to(device),
        k_gamma=(1 + 0.1 * torch.randn(D, generator=g)).bfloat16().to(device),
        eps=EPS,
        loc=(torch.randperm(kv_slots - 1, generator=g)[:batch] + 1).long().to(device),
        k_buf=torch.zeros(kv_slots, HKV, D, dtype=kv_dtype, device=device),
        v_buf=torch.zeros(kv_slots, HKV, D, dtype=kv_dtype, device=device),
        q_off=0, k_off=dq, v_off=dq + dkv, dq=dq, dkv=dkv,
        track_mask=(torch.arange(batch) % 4 == 0).to(device),
        track_indices=torch.arange(cache_slots - batch, cache_slots, device=device),  # apart from working slots
        log_scaling_tau=log_scaling_tau(torch.randint(0, 1 << 20, (batch,), generator=g), 128000, 0.1).to(device),
    )
    if mx:
        shape = (kv_slots // 128, HKV, 32, 4, 4)
        args.update(mxfp8_quant=True, sfk=torch.zeros(shape, dtype=torch.uint8, device=device),
                    sfv=torch.zeros(shape, dtype=torch.uint8, device=device))
    return args


def interleaved_scale_index(loc: torch.Tensor, hkv: int, page: int = 128) -> torch.Tensor:
    """sf[page, h, po % 32, po // 32, b] as flat offsets [N, Hkv, 4] (torch ops, no host sync)."""
    s = loc.view(-1, 1, 1)
    head = torch.arange(hkv, device=loc.device).view(1, hkv, 1)
    block = torch.arange(4, device=loc.device).view(1, 1, 4)
    p, po = s // page, s % page
    return (((p * hkv + head) * 32 + po % 32) * (page // 32) + po // 32) * 4 + block


def unfused_chain(a):
    """The same step as separate torch ops, written the plain way (no fusion, no host syncs)."""
    T, dq, dkv = a["qkvr"].shape[0], a["dq"], a["dkv"]
    rows = torch.as_strided(a["qkvr"], (T, dq + 2 * dkv), (a["qkvr"].stride(0), 1))
    q, k_x, v_x = rows[:, :dq], rows[:, dq:dq + dkv], rows[:, dq + dkv:]
    ci = a["cache_indices"].long()
    real = (ci >= 0).view(-1, 1, 1)
    slot = ci.clamp(min=0)
    cm = a["cache_mask"].view(-1, 1, 1)
    convs = []
    for x, cache, weight in ((k_x, a["k_cache"], a["k_weight"]), (v_x, a["v_cache"], a["v_weight"])):
        hist = cache[slot]  # 1. gather the window
        hist = torch.where(cm, hist, torch.zeros_like(hist))
        window = torch.cat([hist, x.unsqueeze(1)], dim=1)  # [T, W, C]
        conv = (window.float() * weight.t().float().unsqueeze(0)).sum(dim=1) + x.float()  # 2. conv + residual
        convs.append(conv)
        new = window[:, 1:]  # 3. shift update (+ track)
        cache[slot] = torch.where(real, new, cache[slot])
        tracked = (a["track_mask"].view(-1, 1, 1) & real)
        dst = a["track_indices"]
        cache[dst] = torch.where(tracked, new, cache[dst])
    k_conv, v_conv = convs
    # 4. RMSNorm (q, k) with the bf16 rounding points, tau on q
    qn = F.rms_norm(q.float().view(T, HQ, D), (D,), a["q_gamma"].float(), EPS).bfloat16()
    qn = (qn.float() * a["log_scaling_tau"].view(-1, 1, 1)).bfloat16()
    kn = F.rms_norm(k_conv.bfloat16().float().view(T, HKV, D), (D,), a["k_gamma"].float(), EPS).bfloat16()
    vn = v_conv.bfloat16().view(T, HKV, D)
    loc = a["loc"]
    if a.get("mxfp8_quant"):
        # 5. quantize q, k, v; 6. store data and interleaved scales
        q8, q_scales = mxfp8.quantize(qn)
        k8, k_scales = mxfp8.quantize(kn)
        v8, v_scales = mxfp8.quantize(vn)
        a["k_buf"][loc] = k8
        a["v_buf"][loc] = v8
        idx = interleaved_scale_index(loc, HKV).reshape(-1)
        a["sfk"].view(-1)[idx] = k_scales.reshape(-1)
        a["sfv"].view(-1)[idx] = v_scales.reshape(-1)
        return q8, kn, vn, q_scales
    a["k_buf"][loc] = kn
    a["v_buf"][loc] = vn
    return qn, kn, vn, None


def graph_of(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def main():
    import triton.testing

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 128])
    opts = parser.parse_args()

    gpu = torch.cuda.get_device_name()
    gpu_slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower().replace("nvidia", "")).strip("-")
    rows, table = [], []

    def bench(fn):
        return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")

    def record(kernel, mode, timing, batch, ms):
        rows.append({"kernel": kernel, "mode": mode, "timing": timing, "Hq": HQ, "Hkv": HKV, "D": D, "W": W,
                     "B": batch, "ms": ms})
        return ms

    for mode in ("mxfp8", "bf16"):
        for batch in opts.batches:
            mx = mode == "mxfp8"
            fused_args = make_inputs(batch, mx)
            chain_args = make_inputs(batch, mx)

            def fused_call():
                return inkling_attn_prologue_decode(**fused_args, check_values=False)

            def checked_call():
                return inkling_attn_prologue_decode(**fused_args, check_values=True)

            def chain_call():
                return unfused_chain(chain_args)

            fused_call()
            chain_call()
            torch.cuda.synchronize()
            f_eager = record("fused_prologue", mode, "eager", batch, bench(fused_call))
            f_checked = record("fused_prologue_checked", mode, "eager", batch, bench(checked_call))
            c_eager = record("unfused_torch_chain", mode, "eager", batch, bench(chain_call))
            f_graph = record("fused_prologue", mode, "graph", batch, bench(graph_of(fused_call).replay))
            c_graph = record("unfused_torch_chain", mode, "graph", batch, bench(graph_of(chain_call).replay))
            table.append((mode, batch, f_graph, c_graph, f_eager, f_checked, c_eager))

    print(f"\nInkling decode prologue on {gpu}: Hq {HQ}, Hkv {HKV}, D {D}, W {W} (microseconds, medians)")
    print(f"{'mode':6} {'B':>4} | {'fused graph':>11} {'chain graph':>11} {'x':>6} | {'fused eager':>11} "
          f"{'+checks':>8} {'chain eager':>11} {'x':>6}")
    for mode, batch, fg, cg, fe, fc, ce in table:
        print(f"{mode:6} {batch:4d} | {fg * 1e3:11.1f} {cg * 1e3:11.1f} {cg / fg:6.1f} | {fe * 1e3:11.1f} "
              f"{fc * 1e3:8.1f} {ce * 1e3:11.1f} {ce / fe:6.1f}")

    os.makedirs(opts.out_dir, exist_ok=True)
    path = os.path.join(opts.out_dir, f"{datetime.date.today().isoformat()}-{gpu_slug}-prologue.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
