"""Convert a GGUF checkpoint into a plain Hugging Face safetensors directory that SGLang can load on a CPU.

SGLang 0.5.23's GGUF load format does not run on CPU (``NameError: ggml_dequantize`` in
srt/layers/quantization/gguf.py: only CUDA/MUSA/NPU import the ggml kernels), so the models shipped on PyPI as GGUF
are converted once. transformers dequantizes the GGUF (to fp32) when loading with ``gguf_file=``; it then refuses to
save a model "quantized with gguf", so the weights are copied into a fresh model built from the same config without
its quantization_config and saved in ``dtype`` (bf16 by default), with the tokenizer and generation config.

Needs transformers + accelerate + gguf; with the PyPI torchvision on a CPU torch, run it with the same environment
as the server (SGLANG_USE_CPU_ENGINE=1, PYTHONPATH=<this dir>/pythonpath).

    python convert_gguf.py GGUF_FILE OUT_DIR [--dtype bfloat16]
"""
import argparse
import os
import sys
import time
from pathlib import Path


def convert(gguf_file: Path, out_dir: Path, dtype_name: str = "bfloat16") -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from the GGUF file
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, dtype_name)
    gguf_dir, gguf_name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    dequantized = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
    config = dequantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = {name: tensor.to(dtype) for name, tensor in dequantized.state_dict().items()}
    result = model.load_state_dict(state, strict=False)
    # Tied embeddings may show up as "missing" lm_head; anything else means the architectures differ.
    missing = [k for k in result.missing_keys if k != "lm_head.weight"]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"GGUF weights do not match {type(model).__name__}: missing {missing}, "
                           f"unexpected {result.unexpected_keys}")
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    if getattr(dequantized.generation_config, "eos_token_id", None) is not None:
        dequantized.generation_config.save_pretrained(out_dir)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf_file", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args(argv)
    if not args.gguf_file.is_file():
        parser.error(f"gguf_file: no such file {args.gguf_file}")
    start = time.time()
    convert(args.gguf_file, args.out_dir, args.dtype)
    print(f"converted {args.gguf_file.name} -> {args.out_dir} in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
