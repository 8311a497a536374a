"""Tables of run_speed.sh's results: one per device call (a folder holding its speed.json), so every ratio is
between two backends of the same call; then each backend's KV pool and its spread across calls.

    python gpu_tests/sglang/speed_table.py DIR [DIR ...] [--json summary.json]

Per call: median decode step (ms) per backend and point, decode tokens/s, and each ``inkling_*`` entry's speed-up
over each SGLang entry (their step time / ours: > 1 means ours is faster); the prefill time of each point; and the
GPU time of a whole request (``REQUEST_MIXES``: prompt / output tokens) at each point whose context is the mix's
prompt: ``prefill_s / B + output x step_ms / B`` (the decode step measured at the prompt's context, so a long output's
growing context is not counted: 6% more keys at the end of 32k/2k). An entry that failed is listed with the last line
of its log that names an error; the points it finished before stopping (its lines in the call's speed.log) are used.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


POINT_LINE = re.compile(r"^(?P<label>\S+) B=(?P<batch>\d+) ctx=(?P<context>\d+): step (?P<step_ms>[\d.]+) ms .*?, "
                        r"(?P<tok_s>\d+) decode tok/s, graph (?P<graph>\d+)/(?P<steps>\d+), prefill (?P<prefill>[\d.]+) s")


def points_from_log(folder: Path, label: str) -> list[dict]:
    """The points an entry printed before it stopped (a per-entry timeout kills it before its JSON is written):
    its lines of ``speed.log``, as ``one_batch_speed.py`` prints them (prefill to 0.01 s)."""
    log = folder / "speed.log"
    if not log.exists():
        return []
    points = []
    for line in log.read_text(errors="replace").splitlines():
        m = POINT_LINE.match(line)
        if m and m["label"] == label:
            points.append({"batch": int(m["batch"]), "context": int(m["context"]), "step_ms": float(m["step_ms"]),
                           "decode_tok_s": float(m["tok_s"]), "graph_steps": int(m["graph"]),
                           "steps": int(m["steps"]), "prefill_s": float(m["prefill"])})
    return points


def load(folder: Path) -> list[dict]:
    """The call's records; an entry that stopped without writing its JSON gets the points its log shows, marked
    ``recovered_from_log`` (its rc stays, so the tables say it stopped)."""
    records = json.loads((folder / "speed.json").read_text())
    for r in records:
        if r.get("rc", 0) != 0 and not r.get("points"):
            points = points_from_log(folder, r["label"])
            if points:
                backend = r["label"].split("_")[0]
                r.update(points=points, recovered_from_log=True, attention_backend=backend)
    return records


def usable(r: dict) -> bool:
    """An entry with measured points: a completed one, the points a stopped one printed, or those a failed one
    wrote to its JSON before failing (one_batch_speed.py writes it after every point)."""
    return bool(r.get("points"))


def error_line(record: dict) -> str:
    lines = [ln for ln in record.get("log_tail", []) if "Error" in ln]
    return lines[-1].strip() if lines else f"rc={record.get('rc')}"


def call_table(name: str, records: list[dict]) -> tuple[list[str], dict]:
    ok = [r for r in records if usable(r)]
    ours = [r for r in ok if r["attention_backend"] == "inkling"]
    peers = [r for r in ok if r["attention_backend"] != "inkling"]
    points = sorted({(p["batch"], p["context"]) for r in ok for p in r["points"]}, key=lambda bc: (bc[1], bc[0]))
    step = {(r["label"], p["batch"], p["context"]): p for r in ok for p in r["points"]}
    cols = [f"{r['label']} ms" for r in ok] + [f"{p['label']} / {o['label']}" for o in ours for p in peers] + \
        [f"{r['label']} tok/s" for r in ok]
    out = [f"### {name}", "", "| B | ctx | " + " | ".join(cols) + " |", "|" + "---|" * (2 + len(cols))]
    summary = {"call": name, "entries": {}, "points": []}
    for b, c in points:
        cells = []
        row = {"batch": b, "context": c, "step_ms": {}, "speedup": {}}
        for r in ok:
            p = step.get((r["label"], b, c))
            cells.append(f"{p['step_ms']:.2f}" if p else "-")
            if p:
                row["step_ms"][r["label"]] = p["step_ms"]
        for o in ours:
            for peer in peers:
                po, pp = step.get((o["label"], b, c)), step.get((peer["label"], b, c))
                if po and pp:
                    x = pp["step_ms"] / po["step_ms"]
                    cells.append(f"{x:.2f}x")
                    row["speedup"][f"{peer['label']}/{o['label']}"] = x
                else:
                    cells.append("-")
        for r in ok:
            p = step.get((r["label"], b, c))
            cells.append(f"{p['decode_tok_s']:.0f}" if p else "-")
        out.append(f"| {b} | {c} | " + " | ".join(cells) + " |")
        summary["points"].append(row)
    out.append("")
    for r in records:
        if r in ok and r.get("recovered_from_log"):
            summary["entries"][r["label"]] = {"stopped": error_line(r), "points_recovered_from_log": len(r["points"])}
            out.append(f"- {r['label']}: stopped (`{error_line(r)}`) after {len(r['points'])} points; those points "
                       "are from its lines in speed.log")
        elif r in ok and r.get("rc", 0) != 0:
            summary["entries"][r["label"]] = {"failed": error_line(r), "points_before_failing": len(r["points"]),
                                              "kv_tokens": r.get("max_total_num_tokens")}
            out.append(f"- {r['label']}: failed after {len(r['points'])} points (`{error_line(r)}`); those points "
                       "are in the tables")
        elif r in ok:
            summary["entries"][r["label"]] = {"kv_tokens": r["max_total_num_tokens"], "kv_pool": r["kv_pool"],
                                              "page_size": r["page_size"], "server_args": r["server_args"],
                                              "graph_steps_all": all(p["graph_steps"] == p["steps"]
                                                                     for p in r["points"])}
            out.append(f"- {r['label']}: {r['kv_pool']}, page size {r['page_size']}, KV tokens "
                       f"{r['max_total_num_tokens']:,}, every timed step through the decode CUDA graph: "
                       f"{summary['entries'][r['label']]['graph_steps_all']}")
        else:
            summary["entries"][r["label"]] = {"failed": error_line(r)}
            out.append(f"- {r['label']}: failed: `{error_line(r)}`")
    out.append("")
    return out, summary


REQUEST_MIXES = [(1024, 128), (4096, 512), (32768, 256), (32768, 2048)]


def prefill_and_request_tables(records: list[dict]) -> tuple[list[str], list[dict]]:
    """The prefill time per point and the whole-request GPU time per mix, every entry; ratios to the first
    ``flashinfer`` entry of the call (> 1: slower than it)."""
    ok = [r for r in records if usable(r) and all("prefill_s" in p for p in r["points"])]
    if not ok:
        return [], []
    base = next((r for r in ok if r["attention_backend"] == "flashinfer"), None)
    pts = {(r["label"], p["batch"], p["context"]): p for r in ok for p in r["points"]}
    points = sorted({(p["batch"], p["context"]) for r in ok for p in r["points"]}, key=lambda bc: (bc[1], bc[0]))
    ratio = (lambda v, b: f" ({v / b:.2f}x)" if b else "")
    out = ["Prefill (s" + (f"; x {base['label']}" if base else "") + ")", "",
           "| B | ctx | " + " | ".join(r["label"] for r in ok) + " |", "|" + "---|" * (2 + len(ok))]
    for b, c in points:
        ref = pts.get((base["label"], b, c)) if base else None
        cells = []
        for r in ok:
            p = pts.get((r["label"], b, c))
            cells.append(f"{p['prefill_s']:.2f}" + ratio(p["prefill_s"], ref and ref["prefill_s"]) if p else "-")
        out.append(f"| {b} | {c} | " + " | ".join(cells) + " |")
    out += ["", "GPU time per request (ms; prompt/output; from the point B x prompt)", "",
            "| prompt/output | B | " + " | ".join(r["label"] for r in ok) + " |", "|" + "---|" * (2 + len(ok))]
    rows = []
    for prompt, output in REQUEST_MIXES:
        for b, c in points:
            if c != prompt:
                continue
            ms = {}
            for r in ok:
                p = pts.get((r["label"], b, c))
                if p:
                    ms[r["label"]] = 1000 * p["prefill_s"] / b + output * p["step_ms"] / b
            ref = ms.get(base["label"]) if base else None
            out.append(f"| {prompt}/{output} | {b} | " + " | ".join(
                f"{ms[r['label']]:.1f}" + ratio(ms[r["label"]], ref) if r["label"] in ms else "-" for r in ok) + " |")
            rows.append({"prompt": prompt, "output": output, "batch": b, "request_ms": ms})
    return out + [""], rows


def step_parts_table(records: list[dict]) -> list[str]:
    """Where each decode step's time goes, per entry and point: the step, the forward inside it (CUDA events around
    the graph replay and the host work before it) and the attention backend's graph metadata on the host (points
    that recorded them)."""
    ok = [r for r in records if usable(r) and any(p.get("forward_ms") is not None for p in r["points"])]
    if not ok:
        return []
    out = ["Decode step parts (step ms / forward ms / the backend's graph metadata on the host, us)", "",
           "| B | ctx | " + " | ".join(r["label"] for r in ok) + " |", "|" + "---|" * (2 + len(ok))]
    points = sorted({(p["batch"], p["context"]) for r in ok for p in r["points"]}, key=lambda bc: (bc[1], bc[0]))
    for b, c in points:
        cells = []
        for r in ok:
            p = next((p for p in r["points"] if (p["batch"], p["context"]) == (b, c)), None)
            if p is None or p.get("forward_ms") is None:
                cells.append("-")
                continue
            host = p.get("graph_metadata_us")
            host_text = f"{host:.0f}" if host is not None else "-"
            cells.append(f"{p['step_ms']:.2f} / {p['forward_ms']:.2f} / {host_text}")
        out.append(f"| {b} | {c} | " + " | ".join(cells) + " |")
    return out + [""]


def spread(summaries: list[dict]) -> list[str]:
    """Each backend's step time at each point in every call that ran it: max / min."""
    seen: dict = {}
    for s in summaries:
        for p in s["points"]:
            for label, ms in p["step_ms"].items():
                seen.setdefault((label, p["batch"], p["context"]), []).append(ms)
    repeated = {k: v for k, v in seen.items() if len(v) > 1}
    if not repeated:
        return []
    out = ["### The same backend in more than one call (max / min step time)", "",
           "| backend | B | ctx | ms | spread |",
           "|---|---|---|---|---|"]
    for (label, b, c), v in sorted(repeated.items()):
        out.append(f"| {label} | {b} | {c} | {', '.join(f'{x:.2f}' for x in v)} | {max(v) / min(v):.2f}x |")
    return out + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    lines, summaries = [], []
    for folder in args.folders:
        records = load(folder)
        table, summary = call_table(folder.name, records)
        more, summary["requests"] = prefill_and_request_tables(records)
        lines += table + more + step_parts_table(records)
        summaries.append(summary)
    lines += spread(summaries)
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
