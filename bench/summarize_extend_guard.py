"""The extend guard's cost from ``bench/extend_guard_call.sh``'s ``$OUT``: per shape and format, the Triton extend
kernel's time with the non-finite guard (``new``) over its time without it (``old``), each the mean of its repeats,
next to the spread between one side's repeats (the noise a difference has to exceed to count).

    python bench/summarize_extend_guard.py <the call's files> --out bench/results/current/<date>-extend-guard
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics


def load(root, side):
    runs = []
    for path in sorted(glob.glob(os.path.join(root, f"{side}-*", "extend.json"))):
        with open(path) as f:
            runs.append(json.load(f))
    if not runs:
        raise SystemExit(f"no {side}-*/extend.json under {root}")
    return runs


def times(runs, shape, name):
    return [r["ms"][name] for run in runs for r in run["rows"] if r["shape"] == shape and name in r["ms"]]


def summarize(root):
    new, old = load(root, "new"), load(root, "old")
    shapes = [r["shape"] for r in new[0]["rows"]]
    rows = []
    for shape in shapes:
        for fmt in ("mxfp8", "bf16"):
            name = f"ours_{fmt}_triton"
            t_new, t_old = times(new, shape, name), times(old, shape, name)
            if not t_new or not t_old:
                continue
            spread = max((max(t) - min(t)) / min(t) for t in (t_new, t_old))
            ratio = statistics.mean(t_new) / statistics.mean(t_old)
            rows.append({"shape": shape, "format": fmt, "old_ms": t_old, "new_ms": t_new,
                         "new_over_old": round(ratio, 4), "repeat_spread": round(spread, 4),
                         "beyond_noise": abs(ratio - 1) > spread})
    geo = math.exp(statistics.mean(math.log(r["new_over_old"]) for r in rows))
    return {"device": new[0]["device"], "triton": new[0]["triton"], "new_package": new[0]["package"],
            "old_package": old[0]["package"], "repeats": {"new": len(new), "old": len(old)},
            "geomean_new_over_old": round(geo, 4), "rows": rows}


def table(summary):
    lines = [f"{summary['device']}, triton {summary['triton']}; repeats new {summary['repeats']['new']}, "
             f"old {summary['repeats']['old']}; geometric mean new/old {summary['geomean_new_over_old']:.3f}", "",
             "| shape | format | old ms | new ms | new / old | repeat spread |", "|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        mark = " *" if r["beyond_noise"] else ""
        lines.append(f"| {r['shape']} | {r['format']} | {statistics.mean(r['old_ms']):.3f} | "
                     f"{statistics.mean(r['new_ms']):.3f} | {r['new_over_old']:.3f}{mark} | {r['repeat_spread']:.3f} |")
    lines.append("")
    lines.append("`*`: the difference exceeds the larger spread between one side's repeats.")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    summary = summarize(args.root)
    text = table(summary)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "extend_guard.json"), "w") as f:
            json.dump(summary, f, indent=1)
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
