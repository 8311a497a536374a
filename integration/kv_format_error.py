"""Why MXFP8 and per-tensor fp8 (scale 1.0) drift alike on Gemma-3-270M: the real K (after k_norm) and V of every
layer on the long integration prompt, quantized both ways, with their relative error, how often the two formats
store the same value, and how much of the data lies outside e4m3's normal range. CPU, HF transformers:

    .venv/bin/python integration/kv_format_error.py gemma-3-270m      # or smollm2-135m-instruct

(K is taken before RoPE; a rotation keeps magnitudes, so the range figures hold for the cached K.)"""
import os
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import SEQUENTIAL_PROMPTS  # noqa: E402

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend.demo.cpu_host import cpu_env  # noqa: E402
from sglang_inkling_backend.demo.models import prepare_model  # noqa: E402


def main(name: str) -> None:
    path = prepare_model(name)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    caught: dict[int, dict[str, torch.Tensor]] = {}

    def hook(layer_idx, which):
        def record(mod, inp, out):
            caught.setdefault(layer_idx, {})[which] = out.detach()
        return record

    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        (attn.k_norm if hasattr(attn, "k_norm") else attn.k_proj).register_forward_hook(hook(i, "k"))
        attn.v_proj.register_forward_hook(hook(i, "v"))
    with torch.no_grad():
        model(**tok(SEQUENTIAL_PROMPTS["long"], return_tensors="pt"))
    cfg = model.config
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    err2 = {"mxfp8": 0.0, "fp8": 0.0}
    norm2 = small = big = same = n = 0
    for i, tensors in caught.items():
        for which, x in tensors.items():
            x = x.float().reshape(-1, d)
            mx = mxfp8.dequantize(*mxfp8.quantize(x.to(torch.bfloat16)), torch.float32)
            f8 = mxfp8.quantize_per_tensor(x.to(torch.bfloat16), 1.0).float()
            err2["mxfp8"] += (mx - x).pow(2).sum().item()
            err2["fp8"] += (f8 - x).pow(2).sum().item()
            norm2 += x.pow(2).sum().item()
            small += (x.abs() < 2 ** -6).sum().item()
            big += (x.abs() > mxfp8.E4M3_MAX).sum().item()
            same += (mx == f8).sum().item()
            n += x.numel()
            if i in (0, 5, len(caught) - 1):
                print(f"layer {i} {which}: amax {x.abs().max():.3g}, same value stored {(mx == f8).float().mean():.3f}")
    print(f"{name}: relative error MXFP8 {(err2['mxfp8'] / norm2) ** .5:.4f}, per-tensor fp8 (scale 1) "
          f"{(err2['fp8'] / norm2) ** .5:.4f}; same value stored {same / n:.3f}; "
          f"|x| < 2^-6: {small / n:.4f}, |x| > 448: {big / n:.6f}")


if __name__ == "__main__":
    if os.environ.get("SGLANG_USE_CPU_ENGINE") != "1":  # the torchvision work-around must load at start-up
        os.execve(sys.executable, [sys.executable, *sys.argv], cpu_env())
    main(sys.argv[1] if len(sys.argv) > 1 else "gemma-3-270m")
