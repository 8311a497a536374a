"""MXFP8 round-trip error next to per-tensor fp8 e4m3, on Gaussian data and on data with outlier channels, and the
KV bytes per token per layer. CPU, a few seconds:

    python bench/bench_mxfp8_error.py [--out OUT.json]

The committed run: bench/results/history/2026-11-29-format-error-cpu/mxfp8-error.json.

Per-tensor fp8 uses the scale amax / 448 over the whole tensor (the best a single calibrated scale can do; SGLang's
default scale of 1.0 is worse whenever amax is not near 448)."""

import argparse
import json
from pathlib import Path

import torch

from sglang_inkling_backend import kv_formats, mxfp8


def per_tensor_fp8_round_trip(x: torch.Tensor, scale=None) -> torch.Tensor:
    """scale=None: the calibrated amax / 448; a number: a fixed scale (SGLang's default without checkpoint scales
    is 1.0: values past 448 saturate, values under 2**-9 flush to zero)."""
    if scale is None:
        scale = x.abs().amax().float() / mxfp8.E4M3_MAX
    return (x.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """Mean over (token, head) rows of ||approx - exact|| / ||exact||: every key counts, small ones too."""
    err = (approx.float() - exact.float()).norm(dim=-1) / exact.float().norm(dim=-1).clamp(min=1e-30)
    return float(err.mean())


def datasets(tokens=4096, heads=8, d=128, seed=0):
    """(name, data, mask of the ordinary channels). Outliers: 4 channels per head 100x or 1000x larger, as K caches
    show; the error on the other 124 channels is where a shared scale hurts."""
    g = torch.Generator().manual_seed(seed)
    ordinary = torch.ones(d, dtype=torch.bool)
    yield "gaussian", torch.randn(tokens, heads, d, generator=g).bfloat16(), ordinary
    channels = torch.randperm(d, generator=g)[:4]
    ordinary = ordinary.clone()
    ordinary[channels] = False
    for factor in (100.0, 1000.0):
        x = torch.randn(tokens, heads, d, generator=g)
        x[..., channels] *= factor
        yield f"outliers_x{int(factor)}", x.bfloat16(), ordinary
    # tokens whose magnitudes span 2^-12 .. 2^12 (what one per-tensor scale cannot cover; e4m3 spans ~2^-9 .. 2^8.8)
    x = torch.randn(tokens, heads, d, generator=g) * torch.exp2(torch.linspace(-12, 12, tokens)).view(-1, 1, 1)
    yield "wide_range", x.bfloat16(), torch.ones(d, dtype=torch.bool)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for name, x, ordinary in datasets():
        data, scales = mxfp8.quantize(x)
        mx = mxfp8.dequantize(data, scales, torch.float32)
        fp8 = per_tensor_fp8_round_trip(x)
        fp8_unit = per_tensor_fp8_round_trip(x, 1.0)
        rows.append({"data": name, "mxfp8_rel_err": relative_error(mx, x),
                     "fp8_scale_1_rel_err": relative_error(fp8_unit, x),
                     "fp8_per_tensor_rel_err": relative_error(fp8, x),
                     "mxfp8_rel_err_ordinary_channels": relative_error(mx[..., ordinary], x[..., ordinary]),
                     "fp8_per_tensor_rel_err_ordinary_channels": relative_error(fp8[..., ordinary], x[..., ordinary])})
    sizes = [{"Hkv": h, "D": d,
              **{k: kv_formats.bytes_per_token_per_layer(h, d, k) for k in ("bf16", "fp8_e4m3", "mxfp8")}}
             for h, d in ((2, 128), (8, 128), (1, 256), (3, 64))]
    print("mean per-(token, head) relative L2 round-trip error (all channels | ordinary channels only); fp8/tensor uses amax/448")
    print(f"{'data':15s} {'MXFP8':>8s} {'fp8/tensor':>11s} {'fp8 scale 1':>12s} | {'MXFP8':>8s} {'fp8/tensor':>11s}")
    for r in rows:
        print(f"{r['data']:15s} {r['mxfp8_rel_err']:8.5f} {r['fp8_per_tensor_rel_err']:11.5f} "
              f"{r['fp8_scale_1_rel_err']:12.5f} | "
              f"{r['mxfp8_rel_err_ordinary_channels']:8.5f} {r['fp8_per_tensor_rel_err_ordinary_channels']:11.5f}")
    print(f"\n{'Hkv':>4s} {'D':>4s} {'bf16 B/tok/layer':>17s} {'fp8':>6s} {'mxfp8':>6s} {'mxfp8/bf16':>10s}")
    for s in sizes:
        print(f"{s['Hkv']:4d} {s['D']:4d} {s['bf16']:17d} {s['fp8_e4m3']:6d} {s['mxfp8']:6d} "
              f"{s['mxfp8'] / s['bf16']:10.4f}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"round_trip": rows, "bytes_per_token_per_layer": sizes}, indent=1))


if __name__ == "__main__":
    main()
