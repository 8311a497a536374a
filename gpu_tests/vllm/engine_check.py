"""One real vLLM engine (offline ``vllm.LLM``, or ``vllm serve`` with the OpenAI client), the parity workload, every
request's greedy tokens with top-2 logprobs as JSON in ``gpu_tests/sglang/compare.py``'s record format (test-only).

Workload (seeded, the same for every backend; the prompts are ``gpu_tests/sglang/serve_check.py``'s):
``concurrent``: ``len(PROMPT_LENS)`` prompts of random token ids (40-2000 tokens) submitted together, 48 greedy
tokens each; with ``max_num_batched_tokens`` 512 the long prompts are prefilled in chunks while the short ones
decode, so steps mix decodes and prefill chunks (``mixed_steps`` counts them where the engine runs in-process);
``text``: a text prompt through the real tokenizer; ``prefix_hit``: the first ``PREFIX_TOKENS`` tokens of a
concurrent prompt and a new tail (vLLM's prefix cache hands back whole blocks: ``cached_tokens``);
``teacher_forced`` (offline): the concurrent prompts scored with ``prompt_logprobs``, the same token ids for every
engine, for the parity rule (``parity.py``). Every request records its ``prompt_ids``.

    python gpu_tests/vllm/engine_check.py --model DIR --backend CUSTOM --kv-cache-dtype mxfp8 --out run.json
    python gpu_tests/vllm/engine_check.py --serve --model DIR --backend FLASHINFER --out run.json --log server.log
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sglang"))
from serve_check import PROMPT_LENS, NEW_TOKENS, TEXT_PROMPT, free_port, prompts  # noqa: E402

PREFIX_TOKENS = 1024  # whole blocks at block size 16 and 128 (MXFP8)
MAX_BATCHED_TOKENS = 512
CAPTURE_SIZES = [1, 2, 4, 8, 16]
TOP = 2


def engine_kwargs(args) -> dict:
    kwargs = dict(model=str(args.model), dtype=args.dtype, max_model_len=args.max_model_len, seed=0,
                  gpu_memory_utilization=args.gpu_memory_utilization, max_num_seqs=16,
                  max_num_batched_tokens=MAX_BATCHED_TOKENS, enable_prefix_caching=True,
                  enforce_eager=args.eager, kv_cache_dtype=args.kv_cache_dtype,
                  kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30))
    if args.backend != "auto":
        kwargs["attention_backend"] = args.backend
    if not args.eager:
        # vLLM's default compilation and graph mode (FULL_AND_PIECEWISE); fewer capture sizes, so a start is shorter
        kwargs["compilation_config"] = {"cudagraph_capture_sizes": CAPTURE_SIZES, **json.loads(args.compilation)}
    return kwargs


def top_of(position: dict) -> list[list]:
    """One position's ``TOP`` most likely tokens, ``[[token, logprob], ...]`` by vLLM's rank (the position's dict
    also holds the chosen token, whatever its rank)."""
    ranked = sorted(position.items(), key=lambda kv: kv[1].rank)
    return [[t, lp.logprob] for t, lp in ranked if lp.rank is not None and lp.rank <= TOP][:TOP]


def record_of(output) -> dict:
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    chosen, top2 = [], []
    for token, position in zip(ids, completion.logprobs or []):
        chosen.append(position[token].logprob)
        top2.append(top_of(position))
    prompt_ids = list(output.prompt_token_ids or [])
    return {"output_ids": ids, "logprobs": chosen, "top2": top2, "cached_tokens": output.num_cached_tokens,
            "prompt_len": len(prompt_ids), "prompt_ids": prompt_ids}


def teacher_forced_of(output) -> dict:
    """A prompt scored with ``prompt_logprobs``: the logprob of each prompt token after the ones before it (from the
    second token on) and the top-2 there."""
    ids = list(output.prompt_token_ids)
    logprobs, top2 = [], []
    for token, position in zip(ids[1:], (output.prompt_logprobs or [None])[1:]):
        logprobs.append(position[token].logprob)
        top2.append(top_of(position))
    return {"prompt_ids": ids, "logprobs": logprobs, "top2": top2}


def workload() -> tuple[list[list[int]], list[int]]:
    concurrent = prompts()
    base = next(p for p in concurrent if len(p) > PREFIX_TOKENS)
    return concurrent, base[:PREFIX_TOKENS] + [1000 + i for i in range(37)]


def run_offline(args) -> dict:
    from vllm import LLM, SamplingParams

    started = time.time()
    llm = LLM(**engine_kwargs(args))
    start_s = time.time() - started
    config = llm.llm_engine.vllm_config
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, logprobs=TOP, ignore_eos=True)
    concurrent, prefix_prompt = workload()
    t0 = time.time()
    outs = llm.generate([{"prompt_token_ids": p} for p in concurrent], params, use_tqdm=False)
    concurrent_s = time.time() - t0
    text = llm.generate([TEXT_PROMPT], params, use_tqdm=False)[0]
    hit = llm.generate([{"prompt_token_ids": prefix_prompt}], params, use_tqdm=False)[0]
    # teacher-forced: every engine scores the same token ids, so the parity rule compares them position by position
    # (chunked prefill, extends reading the cache); after the rest, so the greedy requests saw the same cache states
    scoring = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=TOP)
    scored = llm.generate([{"prompt_token_ids": p} for p in concurrent], scoring, use_tqdm=False)
    return {"concurrent": [record_of(o) for o in outs], "text": record_of(text), "prefix_hit": record_of(hit),
            "teacher_forced": [teacher_forced_of(o) for o in scored],
            "engine": {"start_s": start_s, "concurrent_s": concurrent_s,
                       "num_gpu_blocks": config.cache_config.num_gpu_blocks,
                       "block_size": config.cache_config.block_size,
                       "cache_dtype": str(config.cache_config.cache_dtype),
                       "cudagraph_mode": str(config.compilation_config.cudagraph_mode),
                       "compilation_mode": str(config.compilation_config.mode),
                       "attention_backend": str(config.attention_config.backend)}}


def serve_args(args) -> list[str]:
    kw = engine_kwargs(args)
    out = [str(args.model), "--dtype", args.dtype, "--max-model-len", str(kw["max_model_len"]), "--seed", "0",
           "--gpu-memory-utilization", str(kw["gpu_memory_utilization"]), "--max-num-seqs", "16",
           "--max-num-batched-tokens", str(MAX_BATCHED_TOKENS), "--enable-prefix-caching",
           "--kv-cache-dtype", args.kv_cache_dtype, "--max-logprobs", str(TOP),
           "--enable-prompt-tokens-details", "--kv-cache-memory-bytes", str(kw["kv_cache_memory_bytes"])]
    if args.backend != "auto":
        out += ["--attention-backend", args.backend]
    if args.eager:
        out.append("--enforce-eager")
    else:
        out += ["--compilation-config", json.dumps(kw["compilation_config"])]
    return out


def run_served(args) -> dict:
    from openai import OpenAI

    port = free_port()
    log = open(args.log or os.devnull, "w")
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *serve_args(args), "--port", str(port)]
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=False)
    started = time.time()
    try:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {server.returncode} (log: {args.log})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() - started > args.startup_s:
                raise TimeoutError(f"vllm serve not healthy after {args.startup_s} s (log: {args.log})")
            time.sleep(2)
        start_s = time.time() - started
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        model = client.models.list().data[0].id

        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model)

        def complete(prompt):
            response = client.completions.create(
                model=model, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0.0, logprobs=TOP,
                extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True})
            choice = response.choices[0]
            lp = choice.logprobs
            ids = [int(t.split(":", 1)[1]) for t in lp.tokens]
            top2 = [sorted(([int(k.split(":", 1)[1]), v] for k, v in (d or {}).items()), key=lambda kv: -kv[1])[:TOP]
                    for d in lp.top_logprobs]
            details = getattr(response.usage, "prompt_tokens_details", None)
            # the parity rule's oracle scores the prompt's ids: a text prompt is tokenized here as the server does
            # (the completions API's default, special tokens added), and kept only where the counts agree
            prompt_ids = list(prompt) if isinstance(prompt, list) else tokenizer(prompt)["input_ids"]
            return {"output_ids": ids, "logprobs": list(lp.token_logprobs), "top2": top2,
                    "cached_tokens": getattr(details, "cached_tokens", None) if details else None,
                    "prompt_len": response.usage.prompt_tokens,
                    "prompt_ids": prompt_ids if len(prompt_ids) == response.usage.prompt_tokens else None}

        concurrent, prefix_prompt = workload()
        results = [None] * len(concurrent)

        def one(i):
            results[i] = complete(concurrent[i])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(concurrent))]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        concurrent_s = time.time() - t0
        return {"concurrent": results, "text": complete(TEXT_PROMPT), "prefix_hit": complete(prefix_prompt),
                "engine": {"start_s": start_s, "concurrent_s": concurrent_s, "served": True}}
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def leave_checkout(args) -> None:
    """Resolve the path arguments (``model``, ``out``, ``log``: given relative to the checkout), then run from the
    temporary directory. vLLM inspects models in ``python -m`` subprocesses, which put their cwd first on sys.path:
    in the checkout, its sglang_inkling_backend/ would shadow the package the run loads (the carried snapshot, or the
    bundle's wheel)."""
    for name in ("model", "out", "log"):
        if getattr(args, name, None):
            setattr(args, name, Path(getattr(args, name)).resolve())
    os.chdir(tempfile.gettempdir())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--backend", default="CUSTOM", help="vLLM's --attention-backend (CUSTOM is this backend)")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"],
                        help="the model's dtype (float16: the parity rule's engines, gpu_tests/vllm/parity.py)")
    parser.add_argument("--eager", action="store_true", help="enforce_eager: no torch.compile, no CUDA graphs")
    parser.add_argument("--compilation", default="{}", help="more compilation_config keys, as JSON")
    parser.add_argument("--serve", action="store_true", help="vllm serve and the OpenAI client")
    parser.add_argument("--max-model-len", type=int, default=4096)
    # a fixed pool (no profiling-based sizing), so engines can share the GPU and every backend gets the same bytes
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.2)
    parser.add_argument("--kv-cache-gib", type=float, default=4.0)
    parser.add_argument("--startup-s", type=float, default=300)
    parser.add_argument("--label")
    parser.add_argument("--log")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    leave_checkout(args)
    record = run_served(args) if args.serve else run_offline(args)
    record["label"] = args.label or args.out.stem
    record["args"] = {k: str(v) for k, v in vars(args).items()}
    record["broken_scale"] = os.environ.get("INKLING_TEST_BREAK_SCALE")
    args.out.write_text(json.dumps(record))
    e = record["engine"]
    print(f"{record['label']}: start {e['start_s']:.0f} s, concurrent {e['concurrent_s']:.2f} s, "
          f"{sum(len(r['output_ids']) for r in record['concurrent'])} tokens, prefix hit cached "
          f"{record['prefix_hit']['cached_tokens']}; {json.dumps(e)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
