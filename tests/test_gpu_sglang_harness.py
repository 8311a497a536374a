"""CPU checks of the test-only GPU server harness (gpu_tests/sglang/): the CUDA sgl_kernel stand-in's numbers and
its refusal of what it does not implement, the parity comparison's divergence / near-tie bookkeeping, and the
one-batch speed script's argument handling."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "gpu_tests" / "sglang"

STAND_IN_CHECK = r"""
import torch, sgl_kernel
from sgl_kernel import rmsnorm, fused_add_rmsnorm, gemma_rmsnorm, gemma_fused_add_rmsnorm, silu_and_mul, gelu_and_mul
from sgl_kernel.utils import is_arch_support_pdl
from sgl_kernel.scalar_type import scalar_types
g = torch.Generator().manual_seed(0)
x = torch.randn(5, 64, generator=g).bfloat16(); w = torch.randn(64, generator=g).bfloat16(); r = torch.randn(5, 64, generator=g).bfloat16()
def ref(v, w, eps, gemma):
    v = v.float(); y = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (w.float() + (1.0 if gemma else 0.0))).bfloat16()
assert torch.equal(rmsnorm(x, w, 1e-6), ref(x, w, 1e-6, False))
assert torch.equal(gemma_rmsnorm(x, w, 1e-6), ref(x, w, 1e-6, True))
xi, ri = x.clone(), r.clone(); fused_add_rmsnorm(xi, ri, w, 1e-6)
s = x.float() + r.float()
assert torch.equal(ri, s.bfloat16()) and torch.equal(xi, ref(s, w, 1e-6, False))
xi, ri = x.clone(), r.clone(); gemma_fused_add_rmsnorm(xi, ri, w, 1e-6)
assert torch.equal(ri, s.bfloat16()) and torch.equal(xi, ref(s, w, 1e-6, True))
gu = torch.randn(3, 16, generator=g).bfloat16()
assert torch.equal(silu_and_mul(gu), (torch.nn.functional.silu(gu[:, :8].float()) * gu[:, 8:].float()).bfloat16())
out = torch.empty(3, 8, dtype=torch.bfloat16); assert gelu_and_mul(gu, out) is out
assert is_arch_support_pdl() is False  # no CUDA here
repr(scalar_types.uint4b8)  # import-time constants resolve
for call in (lambda: sgl_kernel.fast_topk_v(1), lambda: scalar_types.uint4b8(), lambda: __import__("sgl_kernel.kvcacheio", fromlist=["x"]).transfer_kv_direct()):
    try:
        call()
    except NotImplementedError as e:
        assert "not implemented by the test-only sgl_kernel stand-in" in str(e), e
    else:
        raise AssertionError("placeholder did not raise")
print("ok")
"""


def test_sgl_kernel_stand_in_numbers_and_refusals():
    pytest.importorskip("torch")
    result = subprocess.run([sys.executable, "-c", STAND_IN_CHECK], capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": str(HARNESS / "pythonpath"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def _harness_module(name):
    spec = importlib.util.spec_from_file_location(f"harness_{name}", HARNESS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compare_module():
    return _harness_module("compare")


def _record(ids, gaps, logprobs=None):
    request = {"output_ids": ids, "logprobs": logprobs or [-0.5] * len(ids),
               "top2": [[[t, -0.5], [t + 1, -0.5 - gap]] for t, gap in zip(ids, gaps)], "cached_tokens": 0}
    return {"label": "x", "concurrent": [request], "text": None, "prefix_hit": None}


def test_compare_tells_near_ties_from_real_divergences():
    compare = _compare_module()
    step = compare.NEAR_TIE_NATS
    ref = _record([1, 2, 3, 4], [1.0, step / 2, 1.0, 1.0])
    same = compare.compare(ref, _record([1, 2, 3, 4], [1.0] * 4))
    assert same["requests_identical"] == 1 and same["tokens_agreeing"] == 4 and same["near_ties_ref"] == 1
    at_tie = compare.compare(ref, _record([1, 9, 9, 9], [1.0] * 4))
    assert at_tie["tokens_agreeing"] == 1 and at_tie["divergences_not_near_tie"] == 0
    real = compare.compare(ref, _record([1, 2, 9, 9], [1.0] * 4, logprobs=[-0.25, -0.5, -0.5, -0.5]))
    assert real["tokens_agreeing"] == 2 and real["divergences_not_near_tie"] == 1
    assert real["mean_abs_dlogprob"] == pytest.approx(0.125)  # over the 2 agreeing tokens: |0.25| and 0
    assert compare.compare(ref, {"concurrent": [None], "text": None, "prefix_hit": None})["missing"] == 3
    json.dumps(real)  # the result is what summarize.py writes


def test_compare_counts_teacher_forced_flips():
    compare = _compare_module()
    big, small = 1.0, compare.NEAR_TIE_NATS / 2

    def record(top_ids, gaps, logprobs):
        return {"prompt_logprobs": [{"logprobs": [None] + logprobs,
                                     "top2": [[]] + [[[t, -0.1], [t + 1, -0.1 - g]] for t, g in zip(top_ids, gaps)]}]}

    ref = record([5, 6, 7], [big, small, big], [-1.0, -2.0, -3.0])
    other = record([5, 9, 9], [big, big, big], [-1.5, -2.0, -3.0])
    result = compare.compare_prompt_logprobs(ref, other)
    assert result == {"positions": 3, "top1_flips": 2, "top1_flips_not_near_tie": 1,
                      "mean_abs_dlogprob": pytest.approx(0.5 / 3)}
    assert compare.compare_prompt_logprobs(ref, {"prompt_logprobs": None}) is None


def test_decode_vs_prefill_lines_up_each_decode_step_with_the_extend_over_prompt_and_output():
    compare = _compare_module()
    # prompt of 3 tokens, 4 greedy tokens; the rescored extend covers prompt + output (7 positions, the first None)
    decode = {"output_ids": [10, 11, 12, 13], "logprobs": [-0.1, -0.2, -0.3, -0.4]}
    rescored = {"logprobs": [None, -5.0, -5.0, -0.1, -0.25, -0.3, -1.4],
                "top2": [[], [[1, -1.0]], [[2, -1.0]], [[10, -0.1]], [[11, -0.25]], [[12, -0.3]], [[99, -0.5]]]}
    result = compare.decode_vs_prefill({"label": "x", "concurrent": [decode], "rescored": [rescored]})
    (row,) = result["rows"]
    # output token 0 comes from the prefill in both and is skipped; tokens 1..3: |0.05|, 0, |1.0|
    assert row["prompt_len"] == 3 and row["tokens"] == 3
    assert row["mean_abs_dlogprob"] == pytest.approx(1.05 / 3) and row["max_abs_dlogprob"] == pytest.approx(1.0)
    assert row["prefill_top1_not_decode_token"] == 1  # position 6: the extend's top-1 is 99, decode chose 13
    assert compare.decode_vs_prefill({"concurrent": [decode]}) is None  # a run without --rescore


def test_summarize_splits_decode_vs_prefill_at_the_window(tmp_path):
    summarize = _harness_module("summarize")
    prompt = list(range(summarize.WINDOW + 4))

    def run(label, delta):
        rescored = {"logprobs": [None] * len(prompt) + [-0.5, -0.5 - delta, -0.5],
                    "top2": [[]] * len(prompt) + [[[7, -0.5]], [[8, -0.5]], [[9, -0.5]]]}
        short = {"logprobs": [None, -1.0, -0.5, -0.5, -0.5], "top2": [[], [], [[7, -0.5]], [[8, -0.5]], [[9, -0.5]]]}
        out = {"output_ids": [7, 8, 9], "logprobs": [-0.5, -0.5, -0.5],
               "top2": [[[t, -0.5], [1, -2.0]] for t in (7, 8, 9)]}
        return {"label": label, "concurrent": [out, out], "rescored": [short, rescored], "text": None,
                "prefix_hit": None}

    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "inkling-swa_inkling_auto.json").write_text(json.dumps(run("ours", 0.0)))
    (folder / "inkling-swa_triton_auto_noprefillgraph.json").write_text(json.dumps(run("peer", 2.0)))
    cmd = [sys.executable, str(HARNESS / "summarize.py"), str(folder), "--json", str(tmp_path / "s.json")]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "| ours | > window (260) | 2 | 0.0000 |" in out
    assert "| peer | > window (260) | 2 | 1.0000 | 2.000 | 0 |" in out and "| peer | < window (2) | 2 | 0.0000 |" in out
    saved = json.loads((tmp_path / "s.json").read_text())
    assert [d["label"] for d in saved["decode_vs_prefill"]] == ["ours", "peer"]


def test_one_batch_speed_points_and_server_args():
    speed = _harness_module("one_batch_speed")  # imports neither torch nor sglang at module level
    assert speed.parse_points("1x4096, 32X32768") == [(1, 4096), (32, 32768)]
    for bad in ("32", "0x4096", "1x", "ax2", "1x2x3"):
        with pytest.raises(ValueError):
            speed.parse_points(bad)
    args, extra = speed.parse_args(["--model", "m", "--attention-backend", "inkling", "--kv-cache-dtype", "mxfp8",
                                    "--points", "1x256,4x128", "--steps", "8", "--out", "o.json", "--", "--foo"])
    argv = speed.server_argv(args, extra)
    assert argv[argv.index("--max-running-requests") + 1] == "4" and argv[-1] == "--foo"
    assert "--disable-cuda-graph" not in argv and "--max-total-tokens" not in argv
    args.device = "cpu"
    argv = speed.server_argv(args, [])
    assert "--disable-cuda-graph" in argv
    assert int(argv[argv.index("--max-total-tokens") + 1]) >= 2 * 4 * (128 + 4 + 8 + 1)
    with pytest.raises(SystemExit):
        speed.parse_args(["--model", "m", "--attention-backend", "inkling", "--points", "4", "--out", "o.json"])
    assert args.prefill_repeats == 1
    with pytest.raises(SystemExit):
        speed.parse_args(["--model", "m", "--attention-backend", "inkling", "--points", "4x128", "--out", "o.json",
                          "--prefill-repeats", "0"])


def test_speed_table_ratios_stay_within_one_call_and_name_a_failed_entry(tmp_path):
    def entry(label, backend, steps, kv_tokens):
        return {"label": label, "attention_backend": backend, "rc": 0, "max_total_num_tokens": kv_tokens,
                "kv_pool": "Pool", "page_size": 1, "server_args": [],
                "points": [{"batch": b, "context": c, "step_ms": ms, "decode_tok_s": b * 1000 / ms, "graph_steps": 4,
                            "steps": 4} for (b, c), ms in steps.items()]}

    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    (one / "speed.json").write_text(json.dumps([
        entry("inkling_mxfp8", "inkling", {(1, 4096): 2.0, (32, 4096): 4.0}, 200),
        entry("triton_auto", "triton", {(1, 4096): 3.0, (32, 4096): 2.0}, 100),
        {"label": "flashinfer_auto", "rc": 1, "log_tail": ["Traceback", "ImportError: cannot import name 'x'", "end"]}]))
    (two / "speed.json").write_text(json.dumps([entry("inkling_mxfp8", "inkling", {(1, 4096): 3.0}, 200)]))
    out = subprocess.run([sys.executable, str(HARNESS / "speed_table.py"), str(one), str(two), "--json",
                          str(tmp_path / "s.json")], capture_output=True, text=True, check=True).stdout
    assert "| 1 | 4096 | 2.00 | 3.00 | 1.50x | 500 | 333 |" in out
    assert "| 32 | 4096 | 4.00 | 2.00 | 0.50x | 8000 | 16000 |" in out
    assert "flashinfer_auto: failed: `ImportError: cannot import name 'x'`" in out
    assert "| inkling_mxfp8 | 1 | 4096 | 2.00, 3.00 | 1.50x |" in out
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved[0]["points"][0]["speedup"] == {"triton_auto/inkling_mxfp8": 1.5}
    assert saved[1]["points"][0]["speedup"] == {}  # no peer in that call: no ratio across calls


def test_speed_table_prefill_and_whole_request_time(tmp_path):
    def entry(label, backend, points):
        return {"label": label, "attention_backend": backend, "rc": 0, "max_total_num_tokens": 1, "kv_pool": "Pool",
                "page_size": 1, "server_args": [],
                "points": [{"batch": b, "context": c, "prefill_s": pre, "step_ms": ms, "decode_tok_s": b * 1000 / ms,
                            "graph_steps": 4, "steps": 4} for (b, c), (pre, ms) in points.items()]}

    (tmp_path / "speed.json").write_text(json.dumps([
        entry("flashinfer_auto", "flashinfer", {(32, 4096): (0.64, 8.0), (32, 32768): (3.2, 16.0)}),
        entry("inkling_mxfp8", "inkling", {(32, 4096): (0.96, 4.0), (32, 32768): (3.2, 8.0)})]))
    out = subprocess.run([sys.executable, str(HARNESS / "speed_table.py"), str(tmp_path), "--json",
                          str(tmp_path / "s.json")], capture_output=True, text=True, check=True).stdout
    assert "| 32 | 4096 | 0.64 (1.00x) | 0.96 (1.50x) |" in out
    # 4096/512 at B 32: 640/32 + 512 * 8/32 = 148 ms for flashinfer; 960/32 + 512 * 4/32 = 94 ms for ours
    assert "| 4096/512 | 32 | 148.0 (1.00x) | 94.0 (0.64x) |" in out
    # 32768/2048: 3200/32 + 2048 * 16/32 = 1124; ours 100 + 512 = 612
    assert "| 32768/2048 | 32 | 1124.0 (1.00x) | 612.0 (0.54x) |" in out
    requests = json.loads((tmp_path / "s.json").read_text())[0]["requests"]
    assert {(r["prompt"], r["output"]) for r in requests} == {(4096, 512), (32768, 256), (32768, 2048)}
    assert "Decode step parts" not in out  # no point recorded its forward


def test_speed_table_step_parts(tmp_path):
    """The step, the forward inside it and the backend's graph metadata host time, per entry and point."""
    def point(b, c, step, forward, host):
        return {"batch": b, "context": c, "prefill_s": 1.0, "step_ms": step, "decode_tok_s": b * 1000 / step,
                "graph_steps": 4, "steps": 4, "forward_ms": forward, "graph_metadata_us": host}

    (tmp_path / "speed.json").write_text(json.dumps([
        {"label": "flashinfer_auto", "attention_backend": "flashinfer", "rc": 0, "max_total_num_tokens": 1,
         "kv_pool": "Pool", "page_size": 1, "server_args": [], "points": [point(128, 4096, 4.74, 4.33, 182.4)]},
        {"label": "inkling_auto", "attention_backend": "inkling", "rc": 0, "max_total_num_tokens": 1,
         "kv_pool": "Pool", "page_size": 1, "server_args": [], "points": [point(128, 4096, 5.58, 4.89, None)]}]))
    out = subprocess.run([sys.executable, str(HARNESS / "speed_table.py"), str(tmp_path)], capture_output=True,
                         text=True, check=True).stdout
    assert "| 128 | 4096 | 4.74 / 4.33 / 182 | 5.58 / 4.89 / - |" in out


def test_rank2_models_have_one_ranks_heads_with_replicated_kv_where_tp_exceeds_them():
    make_models = _harness_module("make_models")
    heads = lambda c: (c.get("text_config", c)["num_attention_heads"], c.get("text_config", c)["num_key_value_heads"])  # noqa: E731
    assert heads(make_models.CONFIGS["llama-gqa4"](False)) == (8, 2)
    assert heads(make_models.CONFIGS["llama-gqa4-rank2"](False)) == (4, 1)
    assert heads(make_models.CONFIGS["gemma3-swa-rank2"](False)) == (2, 1)  # 1 KV head: replicated, not split
    inkling = make_models.CONFIGS["inkling-swa-rank2"](False)["text_config"]
    assert (inkling["num_attention_heads"], inkling["num_key_value_heads"]) == (4, 1)
    assert (inkling["swa_num_attention_heads"], inkling["swa_num_key_value_heads"]) == (4, 1)
    assert make_models.CONFIGS["inkling-swa"](False)["text_config"]["num_attention_heads"] == 8  # not mutated
    with pytest.raises(ValueError, match="does not split over tp=3"):
        make_models.rank_shape(make_models.CONFIGS["llama-gqa4"](False), 3)



def test_eagle_drafts_fit_their_target_and_name_sglangs_draft_classes():
    """The seeded EAGLE/EAGLE3 drafts: SGLang's draft classes by name (each an EntryClass of the installed SGLang's
    model files), the target's widths and context (the draft's fc reads the target's hidden states; SGLang runs the
    draft at the target's context), untied, and EAGLE3's aux layers distinct ones of the target's."""
    make_models = _harness_module("make_models")
    target = make_models.CONFIGS["llama-gqa4"](False)
    for name, arch, module in (("llama-gqa4-eagle", "LlamaForCausalLMEagle", "llama_eagle"),
                               ("llama-gqa4-eagle3", "LlamaForCausalLMEagle3", "llama_eagle3")):
        draft = make_models.CONFIGS[name](False)
        assert draft["architectures"] == [arch] and name in make_models.DUMMY_LOAD
        for key in ("hidden_size", "vocab_size", "max_position_embeddings"):
            assert draft[key] == target[key], key
        assert draft["tie_word_embeddings"] is False and draft["num_hidden_layers"] == 1
        spec = importlib.util.find_spec("sglang")
        if spec is not None:
            source = (Path(spec.origin).parent / "srt" / "models" / f"{module}.py").read_text()
            assert f"EntryClass = [{arch}]" in source
    aux = make_models.CONFIGS["llama-gqa4-eagle3"](False)["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert len(set(aux)) == 3 and max(aux) + 1 < target["num_hidden_layers"]

def test_summarize_compares_the_per_rank_models_like_the_full_ones(tmp_path):
    summarize = _harness_module("summarize")
    assert summarize.per_rank("inkling-swa_triton_auto_noprefillgraph") == "inkling-swa-rank2_triton_auto_noprefillgraph"
    out = {"output_ids": [7, 8], "logprobs": [-0.5, -0.5], "top2": [[[7, -0.5], [1, -2.0]], [[8, -0.5], [1, -2.0]]]}
    other = {**out, "output_ids": [7, 9]}  # diverges at its second token, not a near-tie (gap 1.5 nats)
    folder = tmp_path / "runs"
    folder.mkdir()
    for name, o in (("gemma3-swa-rank2_triton_auto", out), ("gemma3-swa-rank2_inkling_auto", other)):
        (folder / f"{name}.json").write_text(json.dumps({"concurrent": [o], "text": None, "prefix_hit": None}))
    cmd = [sys.executable, str(HARNESS / "summarize.py"), str(folder)]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    (row,) = [line for line in text.splitlines() if line.startswith("| gemma3-swa-rank2 | parity bf16")]
    assert row.split(" | ")[3:5] == ["1/2", "1"]  # tokens before the first divergence; divergences off a near-tie


def test_speed_table_uses_the_points_a_timed_out_entry_printed(tmp_path):
    ours = {"label": "inkling_mxfp8", "attention_backend": "inkling", "rc": 0, "max_total_num_tokens": 1,
            "kv_pool": "Pool", "page_size": 128, "server_args": [],
            "points": [{"batch": 32, "context": 4096, "prefill_s": 0.5, "step_ms": 4.0, "decode_tok_s": 8000,
                        "graph_steps": 4, "steps": 4}]}
    (tmp_path / "speed.json").write_text(json.dumps([
        {"label": "flashinfer_auto", "rc": 124, "log_tail": ["Capturing prefill shape"]}, ours]))
    (tmp_path / "speed.log").write_text(
        "===== flashinfer:auto\n"
        "flashinfer_auto B=32 ctx=4096: step 6.000 ms (min 5.9, max 6.1), forward 5.5 ms, 5333 decode tok/s, "
        "graph 4/4, prefill 0.40 s\n"
        "inkling_mxfp8 B=32 ctx=4096: step 9.000 ms (min 9, max 9), forward 9 ms, 1 decode tok/s, graph 4/4, "
        "prefill 9.00 s\n")  # another entry's line: never read for flashinfer_auto
    out = subprocess.run([sys.executable, str(HARNESS / "speed_table.py"), str(tmp_path), "--json",
                          str(tmp_path / "s.json")], capture_output=True, text=True, check=True).stdout
    assert "| 32 | 4096 | 6.00 | 4.00 | 1.50x |" in out  # its step, ours from the JSON (not the log's 9.000)
    assert "flashinfer_auto: stopped (`rc=124`) after 1 points" in out
    assert "| 32 | 4096 | 0.40 (1.00x) | 0.50 (1.25x) |" in out
    # without the log nothing is recovered: the entry is listed as failed
    (tmp_path / "speed.log").unlink()
    out = subprocess.run([sys.executable, str(HARNESS / "speed_table.py"), str(tmp_path)], capture_output=True,
                         text=True, check=True).stdout
    assert "flashinfer_auto: failed: `rc=124`" in out


Q_BF16_CHECK = r"""
import sys, torch
from sglang_inkling_backend.hosts.sglang.cpu_testing import prepare_sglang_cpu_import
prepare_sglang_cpu_import()
import sglang.kernels.ops.quantization.mxfp8_quant as m
calls = []
real = m.to_mxfp8
def fake_original(x):  # the patch wrapped the module's function at import: swap what it calls to see the calls
    calls.append(tuple(x.shape)); return "quantized"
site = "/x/sglang/srt/models/inkling_common/attn.py"
code = compile("def attend(q, k, to_mxfp8):\n    return to_mxfp8(q.view(2, 4, 32)), to_mxfp8(k.view(2, 1, 32))", site, "exec")
ns = {}; exec(code, ns)
for cell, name in zip(real.__closure__, real.__code__.co_freevars):
    if name == "original": cell.cell_contents = fake_original
q, k = torch.randn(2, 128), torch.randn(2, 32)
q_out, k_out = ns["attend"](q, k, m.to_mxfp8)
assert q_out.data.data_ptr() == q.data_ptr() and q_out.scale.view(torch.float8_e8m0fnu) is None
assert k_out == "quantized" and calls == [(2, 1, 32)], calls
assert m.to_mxfp8(q.view(2, 4, 32)) == "quantized"  # the same q from any other file is quantized
print("ok")
"""


def test_the_q_bf16_diagnostic_passes_only_the_inkling_attention_q_through():
    """patches/sitecustomize.py's INKLING_TEST_Q_BF16: only attn.py's call on a view of its local q is passed
    through unrounded (no q_descale); K's call, and q from elsewhere, reach the real quantizer."""
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed")
    env = {"INKLING_TEST_Q_BF16": "1", "PYTHONPATH": f"{HARNESS / 'patches'}:{HARNESS.parents[1]}",
           "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", Q_BF16_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]



def test_compare_adds_the_evict_phase_requests_when_either_run_has_them():
    """serve_check --evict-tokens: the documents' first and second requests are compared after the rest; a run
    without the phase shows them missing instead of dropping them."""
    compare = _compare_module()
    ref = _record([1, 2, 3, 4], [1.0] * 4)
    doc = {"output_ids": [5, 6], "logprobs": [-0.5, -0.5], "top2": [[[5, -0.5], [6, -2.0]], [[6, -0.5], [7, -2.0]]],
           "cached_tokens": 2048, "cached_tokens_details": {"device": 0, "host": 2048}}
    with_phase = dict(ref, evict_reload={"first": [doc, doc], "second": [doc, dict(doc, output_ids=[5, 9])]})
    same = compare.compare(with_phase, with_phase)
    assert same["requests"] == 7 and same["requests_identical"] == 5 and same["missing"] == 2  # text, prefix_hit
    other = dict(ref, evict_reload={"first": [doc, doc], "second": [doc, doc]})
    diverged = compare.compare(with_phase, other)
    assert diverged["requests_diverged"] == 1 and diverged["rows"][-1]["first_divergence"] == 1
    assert diverged["rows"][-1]["cached_tokens_details"][1] == {"device": 0, "host": 2048}
    assert compare.compare(with_phase, ref)["missing"] == 6  # text, prefix_hit and the other run's 4
    assert compare.compare(ref, ref)["requests"] == 3  # neither has the phase: as before


def test_compare_reports_decode_rates_when_both_runs_measured_them():
    """serve_check --decode-rate: compare.py gives both medians, their ratio and the speculative run's accept
    lengths; a run without the phase gives None."""
    compare = _harness_module("compare")
    run = lambda rates, lengths: {"decode_rate": {"tok_s_median": sorted(rates)[1], "runs": [  # noqa: E731
        {"tok_s": r, "spec_accept_length": a} for r, a in zip(rates, lengths)]}}
    got = compare.compare_decode_rates(run([100.0, 98.0, 101.0], [None] * 3), run([150.0, 160.0, 155.0],
                                                                                [1.5, 1.6, 1.55]))
    assert got == {"ref_tok_s": 100.0, "other_tok_s": 155.0, "other_over_ref": 1.55,
                   "ref_accept_lengths": [None] * 3, "other_accept_lengths": [1.5, 1.6, 1.55]}
    assert compare.compare_decode_rates({}, run([1.0, 1.0, 1.0], [None] * 3)) is None


# --- load_faults.py (issue #58): the judging, not the server -------------------------------------------------------

def _completed(rid, new, got=None, finish="length", retractions=0):
    got = new if got is None else got
    return {"rid": rid, "kind": "complete", "http": 200, "finish": finish, "max_new_tokens": new,
            "completion_tokens": got, "output_ids": list(range(got)), "num_retractions": retractions}


def test_load_faults_judge_counts_lost_truncated_and_unasked_aborts():
    lf = _harness_module("load_faults")
    requests = [
        _completed("a", 8), _completed("b", 8, retractions=2),
        {"rid": "d", "kind": "disconnect", "http": 200, "chunks": 3, "closed_by_client": True},
        {"rid": "r", "kind": "abort_running", "http": 200, "chunks": 1, "finish": "abort"},
        {"rid": "q", "kind": "abort_queued", "http": 200, "chunks": 0, "finish": "abort"},
    ]
    judged = lf.judge(requests, {"r": 200, "q": 200})
    assert judged["bad"] == []
    assert judged["counts"] | {} == {"complete": 2, "retracted": 1, "disconnect": 1, "abort_running": 1,
                                     "abort_queued": 1, "abort_prefill": 0, "aborted_without_output": 1}
    # each of these is lost or truncated without the client asking: counted, named
    broken = [_completed("short", 8, got=5), _completed("unasked", 8, got=3, finish="abort"),
              {"rid": "err", "kind": "complete", "http": 503, "max_new_tokens": 8, "error": "overloaded"},
              {"rid": "q2", "kind": "abort_queued", "http": 200, "chunks": 0, "finish": None}]
    judged = lf.judge(requests + broken, {"r": 200, "q": 200, "q2": 200})
    assert sorted(b["rid"] for b in judged["bad"]) == ["err", "q2", "short", "unasked"]


def test_load_faults_sends_26_distinct_bad_requests_of_valid_json_or_raw_bytes():
    lf = _harness_module("load_faults")
    cases = lf.bad_requests(max_input=1000)
    assert len(cases) == 26 and len({name for name, _, _ in cases}) == 26
    long_prompt = dict((name, body) for name, _, body in cases)["prompt longer than the context"]
    assert len(long_prompt["input_ids"]) > 1000
    for name, path, body in cases:
        assert path.startswith("/") and (isinstance(body, bytes) or json.dumps(body)), name


def test_load_faults_alone_comparison_excuses_only_near_ties():
    lf = _harness_module("load_faults")
    burst = [_completed(f"r{i}", 4) | {"_ids": [1, 2, 3], "logprobs": [-0.1] * 4} for i in range(2)]
    burst[0]["output_ids"] = [0, 1, 9, 9]  # diverges at position 2
    for r in burst:
        r["top2"] = [[[t, -0.1], [t + 1, -3.0]] for t in r["output_ids"]]

    class Alone:  # the alone run: tokens 0..3 with top-2 gaps of 2.9 nats except where set
        def __init__(self, gap_at_2):
            self.gap = gap_at_2

        def __call__(self, url, ids, new_tokens, rid=None):
            top2 = [[[t, -0.1], [t + 1, -3.0]] for t in range(new_tokens)]
            top2[2][1][1] = -0.1 - self.gap
            return {"output_ids": list(range(new_tokens)), "logprobs": [-0.1] * new_tokens, "top2": top2}

    lf.generate = Alone(gap_at_2=0.0625)  # a near-tie where they part: excused
    result = lf.alone("http://unused", [dict(r) for r in burst], limit=2)["compare"]
    assert (result["requests_identical"], result["divergences_not_near_tie"]) == (1, 0)
    lf.generate = Alone(gap_at_2=1.0)  # a decisive position: not excused
    result = lf.alone("http://unused", [dict(r) for r in burst], limit=2)["compare"]
    assert (result["requests_identical"], result["divergences_not_near_tie"]) == (1, 1)
