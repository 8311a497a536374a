"""Seeded random-weight checkpoints for the GPU server runs (test-only), with SmolLM2's real tokenizer.

Models (all bf16, vocab 49152 = the tokenizer's, max positions 40960 so 32k contexts fit):
- ``llama-gqa4``: LlamaForCausalLM, 8 query / 2 KV heads (GQA 4), head_dim 128, 4 layers;
- ``llama-gqa4-l16``: the same with 16 layers (for decode-speed runs: attention is a larger share of a decode step
  at long contexts; not made unless named in ``--models``);
- ``gemma3-swa``: Gemma3ForCausalLM, 4 query / 1 KV head, head_dim 256, 6 layers (5 sliding : 1 full),
  sliding window 256;
- ``inkling-swa``: SGLang's in-tree Inkling model (``inkling_config``);
- ``llama-gqa4-eagle``, ``llama-gqa4-eagle3``: EAGLE and EAGLE3 draft models for ``llama-gqa4``
  (``eagle_draft_config``, ``eagle3_draft_config``; run_parity.sh's eagle tags);
- ``<model>-rank2`` for the three above: one rank's heads at tp 2 (``rank_shape``), for tp 2's per-rank geometry
  on one GPU at tp 1.

Greedy decoding made more decisive: the argmax is decided among ``STRONG_TOKENS`` output-embedding rows scaled by
``STRONG_SCALE`` (the other rows keep the init scale), so the top-2 gap is the spacing of the maximum of 512
Gaussians instead of 49152 (wider relative to the top logit, which is what a bf16 step is relative to); near-ties
that remain are counted from the returned top-2 logprobs, never hidden. Measured on the H200
(bench/results/history/2026-12-01-sglang-h200-harness/): enough for gemma3-swa (6 near-ties in 544 tokens), not for llama-gqa4
(53 in 544: SGLang's logits are bf16, llama-gqa4's top logits lie in [8, 16) where a bf16 step is 0.0625, and many
top-2 pairs are exact ties), where a 1% softmax-scale bug went unseen; fewer strong tokens (--strong-tokens 16)
widen the gaps for a next run. More to the point, with the init's q/k scale the attention of these random models is
nearly uniform, so attention bugs barely move the argmax; ``--qk-scale`` sharpens it (q_proj/k_proj for Llama,
q_norm/k_norm for Gemma-3). Teacher-forced on the CPU in HF transformers (4 x 384 random tokens, bf16), the share
of positions whose argmax a softmax scale x1.01 flips away from a near-tie (top-2 within two bf16 steps):
llama-gqa4 0.13% as run, 9.1% with ``--strong-tokens 64 --qk-scale 3``; gemma3-swa 0.26% as run, 26% with
``--strong-tokens 64 --qk-scale 3``. Untied output embedding: tied ones would make "repeat the input token" the answer
whatever attention does.

    python gpu_tests/sglang/make_models.py --tokenizer DIR --out DIR [--models llama-gqa4,gemma3-swa,llama-gqa4-l16]
        [--tiny]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

VOCAB = 49152
STRONG_TOKENS = 512
STRONG_SCALE = 8.0
SEED = 20261201


def llama_config(tiny: bool, layers: int = 4) -> dict:
    return dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=VOCAB,
                hidden_size=256 if tiny else 1024, intermediate_size=512 if tiny else 2816,
                num_hidden_layers=2 if tiny else layers, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                max_position_embeddings=40960, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                hidden_act="silu", bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16", attention_bias=False)


def gemma3_config(tiny: bool) -> dict:
    layers = 6
    return dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", vocab_size=VOCAB,
                hidden_size=256 if tiny else 1024, intermediate_size=512 if tiny else 2048,
                num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                query_pre_attn_scalar=256, sliding_window=256,
                layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)],
                max_position_embeddings=40960, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_activation="gelu_pytorch_tanh",
                bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="bfloat16",
                attn_logit_softcapping=None, final_logit_softcapping=None)


def inkling_config(tiny: bool) -> dict:
    """SGLang's in-tree Inkling model (``InklingForConditionalGeneration``), text only, dense MLPs: short-conv K/V,
    q/k RMSNorm, learned relative bias, softmax scale 1/D, log-length temperature from position 512 (so the
    workload's longer prompts use it), 5 local (window 256) : 1 full layers."""
    layers = 6
    text = dict(vocab_size=VOCAB, hidden_size=256 if tiny else 1024, intermediate_size=512 if tiny else 2816,
                num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                swa_num_attention_heads=8, swa_num_key_value_heads=2, swa_head_dim=128,
                local_layer_ids=[i for i in range(layers) if (i + 1) % 6], sliding_window_size=256,
                d_rel=16, rel_extent=1024, use_sconv=True, sconv_kernel_size=4, dense_mlp_idx=layers,
                n_routed_experts=0, log_scaling_n_floor=512, log_scaling_alpha=0.1, rms_norm_eps=1e-6,
                max_position_embeddings=40960, tie_word_embeddings=False, num_nextn_predict_layers=0,
                bos_token_id=1, eos_token_id=2)
    return dict(architectures=["InklingForConditionalGeneration"], model_type="inkling_mm_model",
                text_config=text, tie_word_embeddings=False, torch_dtype="bfloat16", max_position_embeddings=40960,
                bos_token_id=1, eos_token_id=2)


def eagle_draft_config(tiny: bool) -> dict:
    """An EAGLE draft for ``llama-gqa4`` (SGLang's ``LlamaForCausalLMEagle``: one decoder layer over
    ``fc(cat(embedding, target hidden))``, the target's embedding and output head): the target's widths and context
    length (SGLang runs the draft at the target's), untied so SGLang's ``set_embed_and_head`` replaces two
    parameters. Served with ``--speculative-draft-load-format dummy`` and the seeded initializer."""
    return dict(architectures=["LlamaForCausalLMEagle"], model_type="llama", vocab_size=VOCAB,
                hidden_size=256 if tiny else 1024, intermediate_size=512 if tiny else 2816, num_hidden_layers=1,
                num_attention_heads=8, num_key_value_heads=2, head_dim=128, max_position_embeddings=40960,
                rope_theta=10000.0, rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False,
                attention_bias=False, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")


def eagle3_draft_config(tiny: bool) -> dict:
    """An EAGLE3 draft for ``llama-gqa4`` (SGLang's ``LlamaForCausalLMEagle3``: its layer reads the target's hidden
    states after layers 1-3, ``eagle_aux_hidden_state_layer_ids`` [0, 1, 2] stated because the default for 4 layers
    repeats one; ``draft_vocab_size`` null shares the target's output head)."""
    config = eagle_draft_config(tiny)
    config.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=None,
                  target_hidden_size=config["hidden_size"],
                  eagle_config={"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": [0, 1, 2]})
    return config


def rank_shape(config: dict, tp: int) -> dict:
    """One tensor-parallel rank's attention heads of ``config`` at ``tp`` ranks, as SGLang splits them: query heads
    divided by tp, KV heads divided by tp, or one (replicated) where tp exceeds them. Served at tp 1 on one GPU,
    this is the per-rank geometry of a tp run (a different model: its weights are drawn for these shapes)."""
    config = json.loads(json.dumps(config))
    inner = config.get("text_config", config)
    keys = [("num_attention_heads", "num_key_value_heads")]
    if "swa_num_attention_heads" in inner:
        keys.append(("swa_num_attention_heads", "swa_num_key_value_heads"))
    for q_key, kv_key in keys:
        if inner[q_key] % tp:
            raise ValueError(f"{q_key}={inner[q_key]} does not split over tp={tp}")
        inner[q_key] //= tp
        inner[kv_key] = max(1, inner[kv_key] // tp)
    return config


def rank2_name(model: str) -> str:
    """The name of ``model``'s configuration with one rank's heads at tp 2."""
    return f"{model}-rank2"


CONFIGS = {"llama-gqa4": llama_config, "gemma3-swa": gemma3_config,
           "llama-gqa4-l16": lambda tiny: llama_config(tiny, layers=16), "inkling-swa": inkling_config,
           "llama-gqa4-eagle": eagle_draft_config, "llama-gqa4-eagle3": eagle3_draft_config}
# tp 2's per-rank shapes: llama 4 query / 1 KV head, gemma3 2 / 1 (its one KV head replicated), inkling 4 / 1
CONFIGS.update({rank2_name(name): (lambda tiny, make=CONFIGS[name]: rank_shape(make(tiny), 2))
                for name in ("llama-gqa4", "gemma3-swa", "inkling-swa")})
# Served with --load-format dummy: weights come from sitecustomize.py's seeded initializer (INKLING_TEST_SEEDED_INIT),
# so only the config and the tokenizer are written.
DUMMY_LOAD = {"inkling-swa", rank2_name("inkling-swa"), "llama-gqa4-eagle", "llama-gqa4-eagle3"}
DEFAULT_MODELS = ("llama-gqa4", "gemma3-swa")


def make(name: str, out: Path, tokenizer: Path, tiny: bool, device: str, strong_tokens: int = STRONG_TOKENS,
         strong_scale: float = STRONG_SCALE, qk_scale: float = 1.0) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    target = out / name
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(CONFIGS[name](tiny), indent=1))
    if name in DUMMY_LOAD:
        copy_tokenizer(tokenizer, target)
        return target
    config = AutoConfig.from_pretrained(target)
    torch.manual_seed(SEED)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    generator = torch.Generator(device="cpu").manual_seed(SEED)
    with torch.no_grad():
        for param_name, param in model.named_parameters():  # seeded on the CPU: the same weights on any machine
            if param.dim() >= 2:
                scale = 0.02 * (qk_scale if param_name.endswith(("q_proj.weight", "k_proj.weight")) else 1.0)
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
        for param_name, param in model.named_parameters():
            # Gemma-3 normalizes q and k per head (q_norm/k_norm, weight w acts as 1 + w), which would undo a
            # larger q_proj/k_proj: scale the normalized q and k instead (qk_scale 1: the init's zeros).
            if param_name.endswith(("q_norm.weight", "k_norm.weight")):
                param.fill_(qk_scale - 1.0)
        strong = torch.randperm(VOCAB, generator=generator)[:strong_tokens]
        model.lm_head.weight[strong.to(model.lm_head.weight.device)] *= strong_scale
    model.save_pretrained(target)
    copy_tokenizer(tokenizer, target)
    return target


def seeded_dummy_weights(model, qk_scale: float = 3.0) -> None:
    """Weights for a model served with ``--load-format dummy`` (patches/sitecustomize.py, INKLING_TEST_SEEDED_INIT):
    each parameter from a generator seeded by its name, so every backend and process gets the same values.
    Matrices N(0, 0.02); short-conv taps N(0, 0.3) (the conv a visible part of K and V); the relative-bias projection
    N(0, 0.5) (a bias of about one logit); RMSNorm weights 1, q/k norms ``qk_scale`` (attention logits x qk_scale**2,
    so attention bugs move the argmax); other vectors 0; ``STRONG_TOKENS`` output rows x``STRONG_SCALE`` as above."""
    import zlib

    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if not torch.is_floating_point(param):
                continue
            if param.dim() == 1:
                norm = name.endswith("norm.weight")
                qk = name.endswith(("q_norm.weight", "k_norm.weight"))
                param.fill_(qk_scale if qk else 1.0 if norm else 0.0)
                continue
            std = 0.3 if "sconv" in name else 0.5 if "rel_logits_proj" in name else 0.02
            generator = torch.Generator().manual_seed(SEED ^ zlib.crc32(name.encode()))
            param.copy_(torch.randn(param.shape, generator=generator) * std)
            if name.endswith("lm_head.weight"):
                rows = torch.randperm(param.shape[0], generator=generator)[:STRONG_TOKENS]
                param[rows.to(param.device)] *= STRONG_SCALE


def copy_tokenizer(tokenizer: Path, target: Path) -> None:
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer / f).exists():
            shutil.copy(tokenizer / f, target / f)
    (target / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="folder with tokenizer.json")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"comma-separated, of {list(CONFIGS)}")
    parser.add_argument("--tiny", action="store_true", help="small widths, for a CPU check of this script")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--strong-tokens", type=int, default=STRONG_TOKENS,
                        help="output rows scaled up (fewer: larger top-2 gaps, fewer distinct answers)")
    parser.add_argument("--strong-scale", type=float, default=STRONG_SCALE)
    parser.add_argument("--qk-scale", type=float, default=1.0,
                        help="q_proj/k_proj init x this: sharper attention, so attention bugs move the argmax")
    args = parser.parse_args(argv)
    if not (args.tokenizer / "tokenizer.json").is_file():
        parser.error(f"--tokenizer {args.tokenizer}: no tokenizer.json")
    names = args.models.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"--models: unknown {unknown}; known {list(CONFIGS)}")
    if not 1 <= args.strong_tokens <= VOCAB:
        parser.error(f"--strong-tokens must be in 1..{VOCAB}, got {args.strong_tokens}")
    for name in names:
        print("made", make(name, args.out, args.tokenizer, args.tiny, args.device, args.strong_tokens,
                                  args.strong_scale, args.qk_scale), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
