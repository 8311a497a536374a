"""Compare two decode grids of ``bench/bench_decode.py`` point by point: for each (Hq, Hkv, D, B, ctx), our MXFP8
time against each peer's in the same run ("x peer" = peer ms / ours ms), and the ratio of those ratios between the
two grids (a change of our kernels shows there; a change of the machine cancels out). Prints a table, writes JSON.

    python3 bench/compare_grids.py NEW.json OLD.json [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics

PEERS = ("flashinfer_bf16", "flashinfer_fp8", "sdpa_bf16")


def ratios(path: str) -> dict:
    times = {}
    for row in json.load(open(path)):
        if row["kernel"] != "copy":
            times[(row["kernel"], row["Hq"], row["Hkv"], row["D"], row["B"], row["ctx"])] = row["ms"]
    out = {}
    for (kernel, *point), ms in times.items():
        if kernel == "ours_mxfp8":
            point = tuple(point)
            out[point] = {"ms": ms, **{p: times[(p, *point)] / ms for p in PEERS if (p, *point) in times}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("new")
    ap.add_argument("old")
    ap.add_argument("--json")
    args = ap.parse_args()
    new, old = ratios(args.new), ratios(args.old)
    points = sorted(set(new) & set(old))
    print(f"{'Hq/Hkv/D':10s} {'B':>4s} {'ctx':>6s} | {'ours ms new':>11s} {'old':>8s} | "
          + " | ".join(f"x {p} new / old (change)" for p in PEERS[:2]))
    rows = []
    for pt in points:
        hq, hkv, d, b, ctx = pt
        row = {"Hq": hq, "Hkv": hkv, "D": d, "B": b, "ctx": ctx, "ms_new": new[pt]["ms"], "ms_old": old[pt]["ms"]}
        cells = []
        for p in PEERS[:2]:
            row[f"x_{p}_new"], row[f"x_{p}_old"] = new[pt][p], old[pt][p]
            row[f"change_{p}"] = new[pt][p] / old[pt][p]
            cells.append(f"{new[pt][p]:5.2f} / {old[pt][p]:5.2f} ({row[f'change_{p}']:.3f})")
        rows.append(row)
        print(f"{hq}/{hkv}/{d:<6} {b:4d} {ctx:6d} | {new[pt]['ms']:11.4f} {old[pt]['ms']:8.4f} | " + " | ".join(cells))
    summary = {}
    for p in PEERS[:2]:
        change = [r[f"change_{p}"] for r in rows]
        big = [r for r in rows if r["B"] * r["ctx"] >= 512 * 1024]
        summary[p] = {"change_min": min(change), "change_median": statistics.median(change), "change_max": max(change),
                      "x_new_at_512k": [min(r[f"x_{p}_new"] for r in big), max(r[f"x_{p}_new"] for r in big)],
                      "x_old_at_512k": [min(r[f"x_{p}_old"] for r in big), max(r[f"x_{p}_old"] for r in big)]}
        s = summary[p]
        print(f"{p}: change over {len(rows)} points {s['change_min']:.3f}-{s['change_max']:.3f} (median "
              f"{s['change_median']:.3f}); B x ctx >= 512k: new {s['x_new_at_512k'][0]:.2f}-{s['x_new_at_512k'][1]:.2f}x,"
              f" old {s['x_old_at_512k'][0]:.2f}-{s['x_old_at_512k'][1]:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"new": args.new, "old": args.old, "summary": summary, "points": rows}, f, indent=1)


if __name__ == "__main__":
    main()
