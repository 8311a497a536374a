"""Convert a GGUF checkpoint into a plain Hugging Face safetensors directory that SGLang can load on a CPU.

SGLang 0.5.23's GGUF load format does not run on CPU (``NameError: ggml_dequantize`` in
srt/layers/quantization/gguf.py: only CUDA/MUSA/NPU import the ggml kernels), so the models shipped on PyPI as GGUF
are converted once. transformers dequantizes the GGUF (to fp32) when loading with ``gguf_file=``; it then refuses to
save a model "quantized with gguf", so the weights are copied into a fresh model built from the same config without
its quantization_config and saved in ``dtype`` (bf16 by default), with the tokenizer and generation config.

Needs transformers + accelerate + gguf; with the PyPI torchvision on a CPU torch, run it with the same environment
as the server (SGLANG_USE_CPU_ENGINE=1, PYTHONPATH=<this dir>/pythonpath).

    python convert_gguf.py GGUF_FILE OUT_DIR [--dtype bfloat16]

The tokenizer adds ``<bos>`` where the GGUF says so (``tokenizer.ggml.add_bos_token``, true for Gemma-3): the
tokenizer transformers builds from a GGUF drops it, and Gemma without ``<bos>`` answers degenerate text
(``'::::::::'``, in HF transformers and vLLM alike; SGLang restores the flag itself).
"""
import argparse
import json
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
    if gguf_adds_bos(gguf_file):
        add_bos_to_saved_tokenizer(out_dir, tokenizer.bos_token, tokenizer.bos_token_id)
    if getattr(dequantized.generation_config, "eos_token_id", None) is not None:
        dequantized.generation_config.save_pretrained(out_dir)


def gguf_adds_bos(gguf_file: Path) -> bool:
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_file)).fields.get("tokenizer.ggml.add_bos_token")
    return bool(field is not None and field.parts[field.data[0]].tolist() == [True])


def add_bos_to_saved_tokenizer(out_dir: Path, bos_token: str, bos_token_id: int) -> None:
    """Make the saved tokenizer prepend ``bos_token`` (its post-processor and the ``add_bos_token`` flag)."""
    if bos_token is None or bos_token_id is None:
        raise RuntimeError("the GGUF asks for a <bos> token but the tokenizer has none")
    path = out_dir / "tokenizer.json"
    spec = json.loads(path.read_text())
    bos = {"SpecialToken": {"id": bos_token, "type_id": 0}}
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos_token: {"id": bos_token, "ids": [bos_token_id], "tokens": [bos_token]}},
    }
    path.write_text(json.dumps(spec, ensure_ascii=False))
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["add_bos_token"] = True
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False))


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
