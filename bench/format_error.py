"""Format error of MXFP8 against per-tensor fp8 (e4m3, scale = amax / 448) for decode attention, measured against
the unquantized bf16 K/V: float64 attention on the dequantized values versus float64 attention on the bf16 values.

Kernel-free on purpose: through the Triton kernel the error differs from the format-only error by 1e-5 or less
(bench/results/current/gpu_checks.log, "format error vs bf16 KV", MXFP8: Gaussian 0.038637 against 0.038638
format-only, outlier channels x1e4 0.032879 against 0.032890), so the format is the whole difference.
Data: Gaussian K/V, and Gaussian with 4 of 128 channels scaled by 60, 1000 and 10000 (outlier channels, as LLM
keys have). Errors are relative Frobenius norms over the whole output and over the 124 non-outlier channels (the
outliers dominate the whole-output norm, and e4m3 keeps ~2**-4 relative precision on them in either format; what a
per-tensor scale loses is the ordinary channels, pushed toward e4m3's subnormals and zero). CPU, a few seconds:

    python bench/format_error.py [out.json]

The committed run: bench/results/history/2026-11-29-format-error-cpu/.
"""

import json
import sys

import torch

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])

from sglang_inkling_backend import mxfp8  # noqa: E402


def attention64(q, k, v, scale):
    """q [B, Hq, D], k/v [B, L, Hkv, D] -> [B, Hq, D], float64."""
    group = q.shape[1] // k.shape[2]
    k = k.double().repeat_interleave(group, dim=2)
    v = v.double().repeat_interleave(group, dim=2)
    logits = torch.einsum("bhd,blhd->bhl", q.double(), k) * scale
    return torch.einsum("bhl,blhd->bhd", torch.softmax(logits, -1), v)


def rel(a, b):
    return float((a - b).norm() / b.norm())


def main():
    torch.manual_seed(0)
    b, length, hq, hkv, d = 4, 4096, 16, 2, 128
    rows = []
    for outlier in (None, 60.0, 1000.0, 10000.0):
        k = torch.randn(b, length, hkv, d)
        v = torch.randn(b, length, hkv, d)
        if outlier:
            ch = torch.randperm(d)[:4]
            k[..., ch] *= outlier
            v[..., ch] *= outlier
        k, v = k.bfloat16(), v.bfloat16()
        q = torch.randn(b, hq, d).bfloat16()
        scale = d ** -0.5 if outlier is None else 1.0 / (d * outlier)  # keep the softmax away from one-hot
        ref = attention64(q, k, v, scale)
        km, vm = (mxfp8.dequantize(*mxfp8.quantize(t), dtype=torch.float32) for t in (k, v))
        ks, vs = float(k.float().abs().max()) / 448, float(v.float().abs().max()) / 448
        kf = (k.float() / ks).to(torch.float8_e4m3fn).float() * ks
        vf = (v.float() / vs).to(torch.float8_e4m3fn).float() * vs
        # scale 1.0: what a pool uses when the checkpoint ships no calibrated scale (values past 448 saturate)
        k1 = k.float().clamp(-448, 448).to(torch.float8_e4m3fn).float()
        v1 = v.float().clamp(-448, 448).to(torch.float8_e4m3fn).float()
        out_m, out_f = attention64(q, km, vm, scale), attention64(q, kf, vf, scale)
        normal = torch.ones(d, dtype=torch.bool)
        if outlier:
            normal[ch] = False
        row = {"data": "gaussian" if outlier is None else f"4 outlier channels x{outlier:g}",
               "mxfp8_rel_err": rel(out_m, ref), "fp8_per_tensor_rel_err": rel(out_f, ref),
               # the outlier channels dominate the output's norm: the other 124 channels on their own
               "mxfp8_rel_err_normal_channels": rel(out_m[..., normal], ref[..., normal]),
               "fp8_per_tensor_rel_err_normal_channels": rel(out_f[..., normal], ref[..., normal]),
               "fp8_scale_1_rel_err": rel(attention64(q, k1, v1, scale), ref)}
        rows.append(row)
        print(row, flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
