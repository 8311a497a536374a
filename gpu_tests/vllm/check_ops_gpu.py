"""vLLM 0.33's compiled ops (``vllm/_C_stable_libtorch.abi3.so``, built on torch 2.14's stable ABI, carried with only
its sm_90 code) on this machine's torch: each op this path can reach, against a torch reference (test-only).

    python gpu_tests/vllm/check_ops_gpu.py --out ops.json
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

import torch


def rms_ref(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def checks():
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(37, 1024, device=dev, dtype=torch.bfloat16, generator=g)
    w = torch.randn(1024, device=dev, dtype=torch.bfloat16, generator=g)

    def rms_norm():
        out = torch.empty_like(x)
        torch.ops._C.rms_norm(out, x, w, 1e-6)
        return (out.float() - rms_ref(x, w, 1e-6).float()).abs().max().item()

    def fused_add_rms_norm():
        inp, res = x.clone(), x.flip(0).clone()
        torch.ops._C.fused_add_rms_norm(inp, res, w, 1e-6)
        want_res = x + x.flip(0)
        return max((res.float() - want_res.float()).abs().max().item(),
                   (inp.float() - rms_ref(want_res, w, 1e-6).float()).abs().max().item())

    def silu_and_mul():
        h = torch.randn(37, 2 * 512, device=dev, dtype=torch.bfloat16, generator=g)
        out = torch.empty(37, 512, device=dev, dtype=torch.bfloat16)
        torch.ops._C.silu_and_mul(out, h)
        want = torch.nn.functional.silu(h[:, :512].float()) * h[:, 512:].float()
        return (out.float() - want).abs().max().item()

    def reshape_and_cache_flash():
        blocks, bs, heads, d = 8, 16, 2, 128
        k = torch.randn(20, heads, d, device=dev, dtype=torch.bfloat16, generator=g)
        v = torch.randn(20, heads, d, device=dev, dtype=torch.bfloat16, generator=g)
        kc = torch.zeros(blocks, bs, heads, d, device=dev, dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        slots = torch.randperm(blocks * bs, device=dev)[:20]
        one = torch.ones((), device=dev)
        torch.ops._C_cache_ops.reshape_and_cache_flash(k, v, kc, vc, slots, "auto", one, one)
        return max((kc.view(-1, heads, d)[slots] - k).abs().max().item(),
                   (vc.view(-1, heads, d)[slots] - v).abs().max().item())

    return {"rms_norm": rms_norm, "fused_add_rms_norm": fused_add_rms_norm, "silu_and_mul": silu_and_mul,
            "reshape_and_cache_flash": reshape_and_cache_flash}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    import vllm._C_stable_libtorch  # noqa: F401  (registers torch.ops._C*)

    results = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    failed = 0
    for name, check in checks().items():
        try:
            err = check()
            torch.cuda.synchronize()
            results[name] = {"max_abs_err": err, "ok": err <= 0.05}
        except Exception as e:  # noqa: BLE001 - every op is tried and reported
            results[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
        failed += not results[name].get("ok", False)
        print(name, results[name])
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
