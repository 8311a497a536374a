"""MXFP8 against per-tensor fp8 on the model's own K/V: every layer's K (after k_norm where the model has one) and V
on the long integration prompt, captured from HF transformers on the CPU, quantized both ways.

    .venv/bin/python integration/kv_format_error.py gemma-3-270m [--json FILE]     # or smollm2-135m-instruct

Three data sets, each quantized as MXFP8 and as per-tensor fp8 with scale 1.0 (the scale SGLang uses when the
checkpoint gives none) and with a calibrated scale (amax / 448):
- ``model``: the K/V as the checkpoint makes them;
- ``k_outlier_channels``: K with two rotary channel pairs per head multiplied by 2**8, the K that a
  function-preserving reparametrization of the same model caches (those rows of k_proj times 2**8, the matching
  rows of q_proj times 2**-8: q.k and so the output are unchanged; powers of two are exact in bf16, and a rotary
  pair scaled as one commutes with RoPE). LLM K caches show outlier channels like these;
- ``v_scaled_down``: V times 2**-8 (v_proj times 2**-8, o_proj times 2**8: the output is unchanged), values
  that per-tensor fp8 at scale 1.0 stores as subnormals.

Errors are relative, in the model's original units (a rescaled tensor is read back divided by its factor, as the
reparametrized attention effectively does), so the three data sets measure the same function's error.

(K is taken before RoPE; a rotation keeps magnitudes, so the range figures hold for the cached K.)
"""
import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # the checkout (demo/): a script run lacks it
from workloads import SEQUENTIAL_PROMPTS  # noqa: E402

from sglang_inkling_backend import mxfp8  # noqa: E402
from demo.cpu_host import cpu_env  # noqa: E402

OUTLIER_FACTOR = 2.0 ** 8
V_FACTOR = 2.0 ** -8


def capture_kv(model_dir: Path) -> tuple[list[dict[str, torch.Tensor]], int]:
    """Per layer {"k": [tokens * heads, d], "v": ...} in float32, and head_dim."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    caught: dict[int, dict[str, torch.Tensor]] = {}

    def hook(layer_idx, which):
        def record(mod, inp, out):
            caught.setdefault(layer_idx, {})[which] = out.detach().float()
        return record

    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        (attn.k_norm if hasattr(attn, "k_norm") else attn.k_proj).register_forward_hook(hook(i, "k"))
        attn.v_proj.register_forward_hook(hook(i, "v"))
    with torch.no_grad():
        model(**tok(SEQUENTIAL_PROMPTS["long"], return_tensors="pt"))
    cfg = model.config
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    layers = [{w: x.reshape(-1, d) for w, x in caught[i].items()} for i in sorted(caught)]
    return layers, d


def outlier_channels(d: int) -> list[int]:
    """Two rotary pairs (i, i + d/2), in different 32-channel blocks: channels 3 and 3 + d/2, 37 and 37 + d/2."""
    return [c for i in (3, 37) for c in (i % (d // 2), i % (d // 2) + d // 2)]


def round_trips(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """x [rows, d] float32 -> each format's dequantized values."""
    x16 = x.to(torch.bfloat16)
    amax = x16.float().abs().max().item()
    return {"mxfp8": mxfp8.dequantize(*mxfp8.quantize(x16), torch.float32),
            "fp8_scale_1": mxfp8.quantize_per_tensor(x16, 1.0).float(),
            "fp8_calibrated": mxfp8.quantize_per_tensor(x16, amax / mxfp8.E4M3_MAX).float() * (amax / mxfp8.E4M3_MAX)}


def _errors(tensors: list[torch.Tensor], factor: torch.Tensor | float = 1.0) -> dict[str, float]:
    """Relative error of each format over all values of all tensors (each tensor quantized on its own), in the
    model's original units: ``tensors`` are stored as ``x * factor`` and read back divided by ``factor``, which is
    what a reparametrized model's attention sees (q.k and p.V undo the factor exactly)."""
    err2: dict[str, float] = {}
    norm2 = 0.0
    for x in tensors:
        for name, y in round_trips(x * factor).items():
            err2[name] = err2.get(name, 0.0) + (y / factor - x).pow(2).sum().item()
        norm2 += x.pow(2).sum().item()
    return {name: (e / norm2) ** 0.5 for name, e in err2.items()}


def measure(layers: list[dict[str, torch.Tensor]], d: int) -> dict:
    tensors = [x for layer in layers for x in layer.values()]
    same = 0
    for x in tensors:
        trips = round_trips(x)
        same += (trips["mxfp8"] == trips["fp8_scale_1"]).sum().item()
    n = sum(x.numel() for x in tensors)
    channels = outlier_channels(d)
    k_factor = torch.ones(d)
    k_factor[channels] = OUTLIER_FACTOR
    keys, values = [layer["k"] for layer in layers], [layer["v"] for layer in layers]
    return {
        "model": _errors(tensors) | {
            "same_value_fraction": same / n, "values": n,
            "below_2^-6_fraction": sum((x.abs() < 2 ** -6).sum().item() for x in tensors) / n,
            "above_448_fraction": sum((x.abs() > mxfp8.E4M3_MAX).sum().item() for x in tensors) / n},
        "model_k": _errors(keys),
        "model_v": _errors(values),
        "k_outlier_channels": _errors(keys, k_factor) | {"factor": OUTLIER_FACTOR, "channels": channels},
        "v_scaled_down": _errors(values, V_FACTOR) | {"factor": V_FACTOR},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default="gemma-3-270m")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    args = parser.parse_args()
    from demo.models import prepare_model

    layers, d = capture_kv(prepare_model(args.model))
    result = {"model": args.model, "head_dim": d, "layers": len(layers)} | measure(layers, d)
    for data in ("model", "model_k", "k_outlier_channels", "model_v", "v_scaled_down"):
        numbers = result[data]
        print(f"{args.model} {data}: relative error MXFP8 {numbers['mxfp8']:.4f}, per-tensor fp8 scale 1 "
              f"{numbers['fp8_scale_1']:.4f}, calibrated {numbers['fp8_calibrated']:.4f}")
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    if os.environ.get("SGLANG_USE_CPU_ENGINE") != "1":  # the torchvision work-around must load at start-up
        os.execve(sys.executable, [sys.executable, *sys.argv], cpu_env())
    main()
