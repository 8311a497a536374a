"""The decode grid as the route serves it on an H200: at each point, the kernel ``plan_decode`` picks for an MXFP8
pool on sm_90 (``plan.hopper_decode_fits``: the Gluon Hopper kernel, row ``ours_mxfp8_hopper``; else the Triton
kernels, row ``ours_mxfp8``) against the fastest correct bf16 and fp8 peer of the same run. No GPU: it reads a run
of ``bench/bench_decode.py`` made on an sm_90 GPU (which times both rows).

    python bench/hopper_route_table.py bench/results/current/2026-12-02-h200.json [--json OUT]

Prints one line per point and, over the points with B x ctx >= 512k and over all, the range of each ratio (peer
time / ours: above 1 means ours is faster) and of ours' MXFP8 bytes read per second."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sglang_inkling_backend.triton.plan import hopper_config, hopper_decode_fits  # noqa: E402

BF16_PEERS = ("flashinfer_bf16", "flashinfer_xqa_bf16", "sdpa_bf16", "ours_bf16")
FP8_PEERS = ("flashinfer_fp8", "flashinfer_xqa_fp8", "hpcops_fp8")


def hopper_row(rows, shape, b, ctx, head_dim):
    """The run's Hopper-kernel row at a point in the configuration the route launches (``plan.hopper_config``: its
    kernel, tiles and stages, no variant constexprs), whichever variant name it was timed under; None if the run
    has none. (A row without ``variant`` predates the warp-specialized kernel: the one-warpgroup kernel's.)"""
    want = hopper_config(head_dim)
    for r in rows:
        if (r["kernel"].startswith("ours_mxfp8_hopper") and (r["shape"], r["B"], r["ctx"]) == (shape, b, ctx)
                and r.get("variant", "hopper") == want["kernel"]
                and (r.get("block_n"), r.get("num_stages")) == (want["block_n"], want["num_stages"])
                and not r.get("constexprs") and r.get("correct", True)):
            return r
    return None


def route_rows(rows):
    by = {(r["kernel"], r["shape"], r["B"], r["ctx"]): r for r in rows}
    points = sorted({(r["shape"], r["Hq"], r["Hkv"], r["D"], r["B"], r["ctx"]) for r in rows
                     if r["kernel"] == "ours_mxfp8"})
    out = []
    for shape, hq, hkv, d, b, ctx in points:
        fast = hopper_row(rows, shape, b, ctx, d) if hopper_decode_fits(b, hq, hkv, d, ctx) else None
        hopper = fast is not None
        ours = fast if hopper else by[("ours_mxfp8", shape, b, ctx)]

        def fastest(names):
            got = [by[(n, shape, b, ctx)] for n in names if (n, shape, b, ctx) in by and by[(n, shape, b, ctx)].get(
                "correct", True)]
            return min(got, key=lambda r: r["ms"]) if got else None

        bf, f8 = fastest(BF16_PEERS), fastest(FP8_PEERS)
        xqa = by.get(("flashinfer_xqa_fp8", shape, b, ctx))
        out.append({"shape": shape, "B": b, "ctx": ctx, "kernel": "hopper" if hopper else "triton",
                    "ms": ours["ms"], "GBps": ours["GBps"], "rel_err": ours.get("rel_err"),
                    "triton_ms": by[("ours_mxfp8", shape, b, ctx)]["ms"],
                    "bf16_peer": bf["kernel"] if bf else None, "x_bf16": bf["ms"] / ours["ms"] if bf else None,
                    "fp8_peer": f8["kernel"] if f8 else None, "x_fp8": f8["ms"] / ours["ms"] if f8 else None,
                    "x_xqa_fp8": xqa["ms"] / ours["ms"] if xqa else None})
    return out


def span(values):
    values = [v for v in values if v is not None]
    return f"{min(values):.2f}-{max(values):.2f}" if values else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("grid")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = json.load(open(a.grid))
    table = route_rows(rows)
    print(f"{'shape':12} {'B':>4} {'ctx':>6} | {'kernel':6} {'ms':>7} {'GB/s':>5} | {'x triton':>8} | "
          f"{'bf16 peer':>19} {'x':>5} | {'fp8 peer':>18} {'x':>5}")
    for r in table:
        print(f"{r['shape']:12} {r['B']:4} {r['ctx']:6} | {r['kernel']:6} {r['ms']:7.4f} {r['GBps']:5.0f} | "
              f"{r['triton_ms'] / r['ms']:8.2f} | {r['bf16_peer']:>19} {r['x_bf16']:5.2f} | {r['fp8_peer']:>18} "
              f"{r['x_fp8']:5.2f}")
    for label, sel in ((">=512k", [r for r in table if r["B"] * r["ctx"] >= 512 * 1024]), ("all", table)):
        print(f"\n{label} ({len(sel)} points, {sum(r['kernel'] == 'hopper' for r in sel)} on the Hopper kernel): "
              f"x fastest bf16 {span([r['x_bf16'] for r in sel])}, x fastest fp8 {span([r['x_fp8'] for r in sel])}, "
              f"x XQA fp8 {span([r['x_xqa_fp8'] for r in sel])}, x Triton kernel "
              f"{span([r['triton_ms'] / r['ms'] for r in sel])}, MXFP8 GB/s {span([r['GBps'] for r in sel])}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
