"""The natural range of a model's K and V on ~1k tokens of integration/data/long_text.txt, and the exponents of
integration/rescale_checkpoint.py that move V into per-tensor fp8's clipping range (max |V| in [1000, 2000], past
e4m3's 448 at scale 1.0) or below e4m3's smallest normal (2**-6).

    .venv/bin/python integration/kv_ranges.py gemma-3-270m smollm2-135m-instruct [--tokens 1024] [--json FILE]

HF transformers, bf16 (the checkpoints' dtype), eager attention, CPU. V is v_proj's output; K is k_norm's output
where the model has one (what is cached, before RoPE, which keeps magnitudes), else k_proj's, and k_proj's output is
also given for a model with a k_norm.
"""
import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # the checkout (demo/): a script run lacks it
from rescale_checkpoint import outlier_channels  # noqa: E402

from demo.cpu_host import cpu_env  # noqa: E402
from demo.models import cache_dir  # noqa: E402

E4M3_MAX, E4M3_MIN_NORMAL = 448.0, 2.0 ** -6


def capture(model_dir: Path, tokens: int) -> tuple[dict[str, list[torch.Tensor]], int]:
    """{"v", "k", "k_proj"}: per layer [tokens, kv_heads * d] float32 (from bf16), and head_dim."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="eager").eval()
    text = (HERE / "data" / "long_text.txt").read_text(encoding="utf-8")
    ids = tok(text, return_tensors="pt").input_ids[:, :tokens]
    caught: dict[str, list[torch.Tensor]] = {"v": [], "k": [], "k_proj": []}

    def keep(which):
        def hook(mod, inp, out):
            x = out.detach().float()[0]  # [tokens, heads * d], or k_norm's [heads, tokens, d]
            caught[which].append(x.transpose(0, 1).reshape(x.shape[1], -1) if x.dim() == 3 else x)
        return hook

    for layer in model.model.layers:
        attn = layer.self_attn
        attn.v_proj.register_forward_hook(keep("v"))
        attn.k_proj.register_forward_hook(keep("k_proj"))
        if hasattr(attn, "k_norm"):
            attn.k_norm.register_forward_hook(keep("k"))
    with torch.no_grad():
        model(ids)
    if not caught["k"]:
        caught["k"] = caught["k_proj"]
    cfg = model.config
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return caught, d


def _summary(layers: list[torch.Tensor]) -> dict:
    a = torch.cat([x.flatten() for x in layers]).abs()
    no_first = torch.cat([x[1:].flatten() for x in layers]).abs()  # without the first (BOS) position
    per_layer = [x.abs().max().item() for x in layers]
    q = torch.quantile(a[torch.randperm(a.numel(), generator=torch.Generator().manual_seed(0))[:1 << 24]],
                       torch.tensor([0.5, 0.99, 0.999]))
    return {"max": a.max().item(), "max_without_first_token": no_first.max().item(),
            "max_layer": max(range(len(per_layer)), key=per_layer.__getitem__),
            "p50": q[0].item(), "p99": q[1].item(), "p99.9": q[2].item(),
            "below_2^-6": (a < E4M3_MIN_NORMAL).float().mean().item(),
            "above_448": (a > E4M3_MAX).float().mean().item()}


def measure(model: str, tokens: int) -> dict:
    caught, d = capture(cache_dir() / model, tokens)
    v = torch.cat([x.flatten() for x in caught["v"]]).abs()
    vmax = v.max().item()
    # --v-log2 A with max |V| * 2**A in [1000, 2000] (the interval spans a factor of 2: one or two A)
    up = [a for a in range(0, 40) if 1000 <= vmax * 2 ** a <= 2000]
    down = {f"{a}": (v * 2.0 ** a < E4M3_MIN_NORMAL).float().mean().item() for a in range(0, -21, -1)}
    channels = outlier_channels(d)
    k_out = max(x.reshape(x.shape[0], -1, d)[:, :, channels].abs().max().item() for x in caught["k"])
    return {"model": model, "tokens": caught["v"][0].shape[0], "head_dim": d, "layers": len(caught["v"]),
            "v": _summary(caught["v"]), "k": _summary(caught["k"]), "k_proj": _summary(caught["k_proj"]),
            "k_outlier_channels": channels, "k_outlier_channels_max": k_out,
            "v_log2_max_in_1000_2000": up,
            "v_above_448_fraction_at_those": [(v * 2.0 ** a > E4M3_MAX).float().mean().item() for a in up],
            "v_log2_fraction_below_2^-6": down,
            "v_log2_most_below_2^-6": next(int(a) for a, f in down.items() if f > 0.5),
            "v_log2_90pct_below_2^-6": next(int(a) for a, f in down.items() if f > 0.9),
            "log2_max_v": math.log2(vmax)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=["gemma-3-270m", "smollm2-135m-instruct"])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--json", type=Path, help="write the numbers here")
    args = parser.parse_args()
    results = [measure(m, args.tokens) for m in args.models]
    for r in results:
        print(f"{r['model']}: {r['tokens']} tokens, max |V| {r['v']['max']:.4g} (layer {r['v']['max_layer']}), "
              f"max |K| {r['k']['max']:.4g}, max |k_proj| {r['k_proj']['max']:.4g}; --v-log2 "
              f"{r['v_log2_max_in_1000_2000']} puts max |V| in [1000, 2000]; {r['v_log2_most_below_2^-6']} puts "
              f"most V below 2**-6 ({r['v_log2_90pct_below_2^-6']}: 90%)")
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    if os.environ.get("SGLANG_USE_CPU_ENGINE") != "1":  # the torchvision work-around must load at start-up
        os.execve(sys.executable, [sys.executable, *sys.argv], cpu_env())
    main()
