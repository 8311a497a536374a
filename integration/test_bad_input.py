"""Unsupported combinations stop the server at start-up with a message naming the flag and the allowed values."""
import json
import re
import shutil

import pytest
import torch

save_file = pytest.importorskip("safetensors.torch", reason="safetensors is not installed (scripts/setup.sh "
                                                           "installs it with SGLang's dependencies)").save_file


def error_lines(log: str) -> list[str]:
    """The log's exception / error lines (not the echo of the server arguments, which names every flag)."""
    return [line for line in log.splitlines() if "Error" in line and "server_args=" not in line]


def test_mxfp8_with_forced_page_size_other_than_128(model_dir, failed_startup):
    log = failed_startup(model_dir("smollm2-135m-instruct"), "inkling", "mxfp8", extra_args=("--page-size", "64"))
    lines = [line for line in error_lines(log) if "--page-size" in line]
    assert any("128" in line and "64" in line for line in lines), log[-3000:]


def _tiny_llama_with_head_dim_48(source_dir, target_dir):
    """SmolLM2's tokenizer and a 2-layer random Llama whose head_dim (48) is not a multiple of 32."""
    target_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(source_dir / name, target_dir / name)
    config = json.loads((source_dir / "config.json").read_text())
    hidden, heads, kv_heads, head_dim, inter, layers = 96, 2, 1, 48, 128, 2
    config.update(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                  intermediate_size=inter, num_hidden_layers=layers, tie_word_embeddings=True)
    (target_dir / "config.json").write_text(json.dumps(config))
    generator = torch.Generator().manual_seed(0)

    def weight(*shape):
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)
    tensors = {"model.embed_tokens.weight": weight(config["vocab_size"], hidden),
               "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
                    p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
                    p + "self_attn.q_proj.weight": weight(heads * head_dim, hidden),
                    p + "self_attn.k_proj.weight": weight(kv_heads * head_dim, hidden),
                    p + "self_attn.v_proj.weight": weight(kv_heads * head_dim, hidden),
                    p + "self_attn.o_proj.weight": weight(hidden, heads * head_dim),
                    p + "mlp.gate_proj.weight": weight(inter, hidden),
                    p + "mlp.up_proj.weight": weight(inter, hidden),
                    p + "mlp.down_proj.weight": weight(hidden, inter)}
    save_file(tensors, str(target_dir / "model.safetensors"))
    return target_dir


def test_mxfp8_with_head_dim_not_a_multiple_of_32(model_dir, failed_startup, tmp_path):
    tiny = _tiny_llama_with_head_dim_48(model_dir("smollm2-135m-instruct"), tmp_path / "tiny-llama-hd48")
    log = failed_startup(tiny, "inkling", "mxfp8")
    lines = [line for line in error_lines(log) if "head_dim" in line and "48" in line]
    assert any("--kv-cache-dtype" in line and "32" in line for line in lines), log[-3000:]


def test_tp_size_that_does_not_split_the_heads(model_dir, failed_startup):
    # Gemma-3-270M has 4 query heads (1 KV head): 3 ranks cannot split them.
    log = failed_startup(model_dir("gemma-3-270m"), "inkling", tp=3)
    lines = [line for line in error_lines(log) if re.search(r"tp[-_ ]size", line, re.IGNORECASE)]
    assert any(re.search(r"\b3\b", line) and re.search(r"\b4\b", line) for line in lines), log[-3000:]
