"""The parity rule (``parity.py``) tried on a CPU before a GPU call spends minutes on it (test-only): HF transformers
plays the engines on the call's models (``parity.MODEL_ARGS``) and workload, and the rule must pass correct
implementations and fail a softmax scale x1.01.

Engines, each answering ``engine_check.py``'s workload in its record format (10 random-token prompts of 40-2000
tokens, the text prompt, the prefix hit: 48 greedy tokens each with top-2 logprobs; the 10 prompts teacher-forced):
- ``TRITON_ATTN_auto``, the reference: ``fused_attention`` below, a stand-in for a fused kernel (QK^T and softmax in
  float32, P rounded to the model's 16-bit dtype before PV, PV accumulated in float32, the output rounded);
- ``TRITON_ATTN_auto_again``: the reference again (the engine against itself);
- ``FLASHINFER_auto``, a floor run: the same with P kept in float32 (another correct rounding);
- ``CUSTOM_auto``, the candidate: HF's SDPA attention (another kernel);
- ``CUSTOM_auto_broken``: the reference with every layer's softmax scale x(1 + ``--break-scale``).
With ``--dtype float16`` the run names carry the ``fp16`` tag, as run_call.sh's entries do.

    python gpu_tests/vllm/parity_rule_cpu.py --tokenizer DIR --work /tmp/parity-cpu --dtype float16 --json out.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import parity  # noqa: E402
from engine_check import NEW_TOKENS, TOP, workload  # noqa: E402  (puts gpu_tests/sglang on the path)
from serve_check import TEXT_PROMPT  # noqa: E402

_ATTENTION = {"p_dtype": None, "scale_factor": 1.0}


def fused_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """HF's attention-function contract. The causal and sliding-window mask is built here from the positions (the
    query rows are the last ones of the keys), so it does not depend on which mask HF prepares for a custom name."""
    import torch
    from transformers.models.llama.modeling_llama import repeat_kv

    k = repeat_kv(key, module.num_key_value_groups).float()
    v = repeat_kv(value, module.num_key_value_groups).float()
    scores = torch.matmul(query.float(), k.transpose(2, 3)) * (scaling * _ATTENTION["scale_factor"])
    q_len, k_len = scores.shape[-2], scores.shape[-1]
    q_pos = torch.arange(k_len - q_len, k_len)[:, None]
    k_pos = torch.arange(k_len)[None, :]
    allowed = k_pos <= q_pos
    window = getattr(module, "sliding_window", None)
    if window:
        allowed &= k_pos > q_pos - window
    p = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    p_dtype = _ATTENTION["p_dtype"] or query.dtype
    out = torch.matmul(p.to(p_dtype).float(), v)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def greedy(model, prompt_ids: list[int]) -> dict:
    """48 greedy tokens with top-2 logprobs: one forward over the prompt, then one per token (KV cache)."""
    import torch

    out = model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
    tokens, chosen, top2 = [], [], []
    for _ in range(NEW_TOKENS):
        values, indices = torch.log_softmax(out.logits[0, -1].float(), dim=-1).topk(TOP)
        token = int(indices[0])
        tokens.append(token)
        chosen.append(float(values[0]))
        top2.append([[int(t), float(v)] for t, v in zip(indices, values)])
        out = model(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
    return {"output_ids": tokens, "logprobs": chosen, "top2": top2, "cached_tokens": 0,
            "prompt_len": len(prompt_ids), "prompt_ids": list(prompt_ids)}


def teacher_forced(model, prompt_ids: list[int]) -> dict:
    import torch

    logprobs = torch.log_softmax(model(input_ids=torch.tensor([prompt_ids])).logits[0, :-1].float(), dim=-1)
    chosen = logprobs.gather(1, torch.tensor(prompt_ids[1:])[:, None])[:, 0]
    values, indices = logprobs.topk(TOP)
    return {"prompt_ids": list(prompt_ids), "logprobs": chosen.tolist(),
            "top2": [[[int(t), float(v)] for t, v in zip(i, vs)] for i, vs in zip(indices, values)]}


def engine_record(model_dir: Path, label: str, dtype: str, attention: str, p_dtype: str | None,
                  scale_factor: float, with_greedy: bool = True) -> dict:
    import torch
    from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer

    AttentionInterface.register("inkling_test_fused", fused_attention)
    _ATTENTION.update(p_dtype=getattr(torch, p_dtype) if p_dtype else None, scale_factor=scale_factor)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype),
                                                 attn_implementation=attention).eval()
    text_ids = AutoTokenizer.from_pretrained(model_dir)(TEXT_PROMPT)["input_ids"]
    concurrent, prefix_prompt = workload()
    t0 = time.time()
    answer = greedy if with_greedy else (lambda model, ids: {"output_ids": [], "logprobs": [], "top2": [],
                                                            "prompt_ids": list(ids)})
    with torch.no_grad():
        record = {"label": label, "concurrent": [answer(model, p) for p in concurrent],
                  "text": answer(model, text_ids), "prefix_hit": answer(model, prefix_prompt),
                  "teacher_forced": [teacher_forced(model, p) for p in concurrent]}
    record["engine"] = {"dtype": dtype, "attention": attention, "p_dtype": p_dtype, "scale_factor": scale_factor,
                        "seconds": round(time.time() - t0, 1)}
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True, help="checkpoints and runs go here (kept between runs)")
    parser.add_argument("--models", default="llama-gqa4,gemma3-swa")
    parser.add_argument("--dtype", default="float16", choices=["bfloat16", "float16"])
    parser.add_argument("--break-scale", type=float, default=0.01)
    parser.add_argument("--no-greedy", action="store_true",
                        help="teacher-forced only (a 2-core CPU spends most of a run on the 12 x 48 greedy steps)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import subprocess

    import torch

    torch.manual_seed(0)
    names = args.models.split(",")
    models_dir, runs_dir = args.work / "models", args.work / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    missing = [m for m in names if not (models_dir / m / "config.json").is_file()]
    if missing:
        subprocess.run([sys.executable, str(HERE.parent / "sglang" / "make_models.py"), "--tokenizer",
                        str(args.tokenizer), "--out", str(models_dir), "--models", ",".join(missing),
                        *parity.MODEL_ARGS], check=True)
    tag = "fp16" if args.dtype == "float16" else ""
    plus = lambda *tags: "_" + "+".join(t for t in (tag, *tags) if t) if (tag or tags) else ""  # noqa: E731
    engines = [(f"TRITON_ATTN_auto{plus()}", "inkling_test_fused", None, 1.0),
               (f"TRITON_ATTN_auto{plus('again')}", "inkling_test_fused", None, 1.0),
               (f"FLASHINFER_auto{plus()}", "inkling_test_fused", "float32", 1.0),
               (f"CUSTOM_auto{plus()}", "sdpa", None, 1.0),
               (f"CUSTOM_auto{plus('broken')}", "inkling_test_fused", None, 1.0 + args.break_scale)]
    runs = {}
    for model in names:
        for suffix, attention, p_dtype, factor in engines:
            name = f"{model}_{suffix}"
            path = runs_dir / f"{name}.json"
            if not path.is_file():
                path.write_text(json.dumps(engine_record(models_dir / model, name, args.dtype, attention, p_dtype,
                                                         factor, with_greedy=not args.no_greedy)))
            runs[name] = json.loads(path.read_text())
            print(f"{name}: {runs[name]['engine']}", flush=True)
    groups = parity.judge_all(runs)
    print(parity.report(groups))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model_args": list(parity.MODEL_ARGS), "dtype": args.dtype,
                                         "break_scale": args.break_scale, "greedy": not args.no_greedy,
                                         "groups": groups}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
