"""What the e4m3-by-integers path costs (the one GPUs without e4m3 conversions run: NVIDIA before sm_89), measured
on a GPU that has both: the same Triton kernels, the same pool, native e4m3 loads against bytes decoded with integer
operations (``INKLING_E4M3_BY_INTEGERS=1``), with the bf16 pool of the same keys as the bar to beat.

Per shape (Hq/Hkv/D, B requests of ``ctx`` keys in randomly ordered 128-slot pages) and Triton decode kernel
(``blocks``, ``tiles``; the Gluon Hopper kernel is not in this comparison: it only runs on sm_90, which has e4m3):
  - ``mxfp8_native`` / ``mxfp8_integers``, ``fp8_native`` / ``fp8_integers``: ``run_decode`` over a page table;
  - ``bf16``: the same kernel on the bf16 pool;
and one extend shape (``paged_extend_attention``) the same way. Each output is compared bit for bit between the
two paths (they must be identical) and against float64 attention over the pool's values (relative Frobenius error).
Times: median of ``REPEATS`` runs of ``ITERS`` back-to-back launches, CUDA events.

    python bench/bench_e4m3_by_integers.py --out $OUT      # prints the table, writes $OUT/e4m3_by_integers.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend import triton as kernels  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402
from sglang_inkling_backend.triton.plan import E4M3_BY_INTEGERS_ENV, DecodeConfig  # noqa: E402

PAGE, ITERS, REPEATS = 128, 20, 5
# (label, Hq, Hkv, D, B, ctx)
DECODE_SHAPES = [("gqa4 64x8k", 32, 8, 128, 64, 8192), ("gqa8 16x32k", 32, 4, 128, 16, 32768),
                 ("gqa4 128x2k", 32, 8, 128, 128, 2048), ("d64 gqa4 32x16k", 16, 4, 64, 32, 16384)]
EXTEND_SHAPE = ("gqa4 extend 2x1k on 4k", 32, 8, 128, 2, 4096, 1024)  # label, Hq, Hkv, D, B, prefix, new


def make_pools(hkv, d, b, ctx, dev, gen):
    """bf16, MXFP8 and per-tensor fp8 pools of the same keys, and a page table of shuffled pages."""
    pages_per = -(-ctx // PAGE)
    slots = b * pages_per * PAGE
    k = torch.randn(slots, hkv, d, generator=gen, device=dev).bfloat16()
    v = torch.randn(slots, hkv, d, generator=gen, device=dev).bfloat16()
    layout = ScaleLayout.for_pool(slots, hkv, d, PAGE)
    (kd, ks), (vd, vs) = mxfp8.quantize(k), mxfp8.quantize(v)
    k_scales, v_scales = layout.empty(device=dev), layout.empty(device=dev)
    every = torch.arange(slots, device=dev)
    layout.scatter(k_scales, every, ks)
    layout.scatter(v_scales, every, vs)
    pools = {"bf16": PagedKV(k, v), "mxfp8": PagedKV(kd, vd, k_scales, v_scales, layout),
             "fp8": PagedKV((k.float() / 0.05).clamp(-448, 448).to(torch.float8_e4m3fn),
                            (v.float() / 0.05).clamp(-448, 448).to(torch.float8_e4m3fn), k_scale=0.05, v_scale=0.05)}
    table = torch.randperm(b * pages_per, generator=gen, device=dev).view(b, pages_per).int()
    return pools, table


def float64_attention(q, kv, table, lens, scale, qo=None):
    """Causal attention in float64 over the pool's values; one query per request (decode) or ``qo`` rows."""
    outs = []
    for r in range(table.shape[0]):
        n = int(lens[r])
        slots = (table[r].long()[:, None] * PAGE + torch.arange(PAGE, device=q.device)).flatten()[:n]
        k, v = (t.double() for t in kv.read(slots))
        rows = q[r:r + 1] if qo is None else q[qo[r]:qo[r + 1]]
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        logits = torch.einsum("qhd,khd->hqk", rows.double(), k) * scale
        if qo is not None:
            pos = torch.arange(n - rows.shape[0], n, device=q.device)
            logits = logits.masked_fill(torch.arange(n, device=q.device)[None, None, :] > pos[None, :, None],
                                        float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", logits.softmax(-1), v))
    return torch.cat(outs)


def rel_err(got, want):
    return float((got.double() - want).norm() / want.norm())


def timed_ms(fn):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(ITERS):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / ITERS)
    return statistics.median(times)


def with_integers(on: bool):
    if on:
        os.environ[E4M3_BY_INTEGERS_ENV] = "1"
    else:
        os.environ.pop(E4M3_BY_INTEGERS_ENV, None)


def measure_paths(row: dict, fmt: str, call, want) -> None:
    """Time ``call()`` and its error against ``want`` into ``row``: once for a bf16 pool, natively and by integers
    for an 8-bit one, with the two outputs compared bit for bit and their time ratios."""
    outs = {}
    for integers in ((False,) if fmt == "bf16" else (False, True)):
        with_integers(integers)
        name = fmt if fmt == "bf16" else f"{fmt}_{'integers' if integers else 'native'}"
        outs[name] = call()
        row[f"{name}_ms"] = round(timed_ms(call), 4)
        row[f"{name}_err"] = rel_err(outs[name], want)
    with_integers(False)
    if fmt != "bf16":
        row[f"{fmt}_bit_identical"] = bool(torch.equal(outs[f"{fmt}_native"], outs[f"{fmt}_integers"]))
        row[f"{fmt}_integers_over_native"] = round(row[f"{fmt}_integers_ms"] / row[f"{fmt}_native_ms"], 3)
        row[f"{fmt}_integers_over_bf16"] = round(row[f"{fmt}_integers_ms"] / row["bf16_ms"], 3)


def decode_rows(dev, gen):
    rows = []
    for label, hq, hkv, d, b, ctx in DECODE_SHAPES:
        pools, table = make_pools(hkv, d, b, ctx, dev, gen)
        lens = torch.full((b,), ctx, dtype=torch.int32, device=dev)
        q = torch.randn(b, hq, d, generator=gen, device=dev).bfloat16()
        params = AttentionParams(d ** -0.5)
        for kernel in ("blocks", "tiles"):
            row = {"shape": label, "kernel": kernel, "Hq": hq, "Hkv": hkv, "D": d, "B": b, "ctx": ctx}
            for fmt in ("bf16", "mxfp8", "fp8"):
                kv = pools[fmt]
                plan = kernels.plan_decode(b, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, max_seq_len=ctx,
                                           page_size=PAGE, kv_dtype=kv.k_buffer.dtype, device=dev,
                                           config=DecodeConfig(kernel=kernel), kv_format=kv.kv_format)
                want = float64_attention(q, kv, table, lens.tolist(), params.softmax_scale)

                def call(kv=kv, plan=plan):
                    return kernels.run_decode(plan, q, kv, params=params, page_table=table, seq_lens=lens,
                                              check=False)
                measure_paths(row, fmt, call, want)
            rows.append(row)
    return rows


def extend_row(dev, gen):
    label, hq, hkv, d, b, prefix, new = EXTEND_SHAPE
    ctx = prefix + new
    pools, table = make_pools(hkv, d, b, ctx, dev, gen)
    lens = torch.full((b,), ctx, dtype=torch.int32, device=dev)
    qo = torch.arange(0, (b + 1) * new, new, dtype=torch.int32, device=dev)
    q = torch.randn(b * new, hq, d, generator=gen, device=dev).bfloat16()
    params = AttentionParams(d ** -0.5)
    row = {"shape": label, "kernel": "extend", "Hq": hq, "Hkv": hkv, "D": d, "B": b, "ctx": ctx, "new": new}
    for fmt in ("bf16", "mxfp8", "fp8"):
        kv = pools[fmt]
        want = float64_attention(q, kv, table, lens.tolist(), params.softmax_scale, qo=qo.tolist())

        def call(kv=kv):
            return kernels.paged_extend_attention(q, kv, qo_indptr=qo, params=params, page_table=table,
                                                  seq_lens=lens, page_size=PAGE, validate=False)
        measure_paths(row, fmt, call, want)
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = decode_rows(dev, gen) + [extend_row(dev, gen)]
    cols = ["bf16_ms", "mxfp8_native_ms", "mxfp8_integers_ms", "mxfp8_integers_over_native",
            "mxfp8_integers_over_bf16", "fp8_native_ms", "fp8_integers_ms", "fp8_integers_over_native",
            "mxfp8_bit_identical", "fp8_bit_identical", "mxfp8_integers_err"]
    print("| shape | kernel | " + " | ".join(cols) + " |")
    print("|" + "---|" * (len(cols) + 2))
    for r in rows:
        print(f"| {r['shape']} | {r['kernel']} | " + " | ".join(
            f"{r[c]:.2e}" if c.endswith("_err") else str(r[c]) for c in cols) + " |")
    os.makedirs(args.out, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "iters": ITERS, "repeats": REPEATS, "page": PAGE}
    with open(os.path.join(args.out, "e4m3_by_integers.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    bad = [r["shape"] + "/" + r["kernel"] for r in rows
           if not (r["mxfp8_bit_identical"] and r["fp8_bit_identical"]) or r["mxfp8_integers_err"] > 2e-2]
    if bad:
        print("FAILED (not bit-identical or error above 2e-2):", bad)
        sys.exit(1)


if __name__ == "__main__":
    main()
