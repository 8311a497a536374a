"""CPU checks of the test-only vLLM GPU harness (gpu_tests/vllm/): the fat-binary cut that lets vLLM's compiled ops
travel (what an sm_90 GPU loads is kept byte for byte, everything else zeroed, the layout unchanged), the engine
check's record (the same format compare.py reads) and its server arguments, the speed script's points."""
import importlib.util
import struct
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "gpu_tests" / "vllm"


def load(name):
    sys.path.insert(0, str(HARNESS))
    sys.path.insert(0, str(HARNESS.parent / "sglang"))
    try:
        spec = importlib.util.spec_from_file_location(f"vllm_harness_{name}", HARNESS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(HARNESS))
        sys.path.remove(str(HARNESS.parent / "sglang"))


def entry(kind, arch, payload: bytes) -> bytes:
    header = bytearray(64)
    struct.pack_into("<HHIQ", header, 0, kind, 0x0101, 64, len(payload))
    struct.pack_into("<I", header, 28, arch)
    return bytes(header) + payload


def fat_binary(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_fatbin_keeps_what_sm90_loads_and_zeroes_the_rest():
    fatbin = load("fatbin")
    sass90, sass90a, sass80, sass100 = b"\x90" * 40, b"\x9a" * 24, b"\x80" * 32, b"\xa0" * 16
    ptx80, ptx90, ptx100 = b"P80" * 8, b"P90" * 8, b"PA0" * 8
    # one fat binary with sm_90 SASS (kept: both variants), one with no sm_90 SASS (its newest PTX <= 9.0 kept),
    # one with nothing an sm_90 GPU can load (all zeroed); 8 bytes of padding between them, as in a real section
    first = fat_binary(entry(2, 80, sass80), entry(2, 90, sass90), entry(2, 90, sass90a), entry(2, 100, sass100),
                       entry(1, 80, ptx80))
    second = fat_binary(entry(2, 80, sass80), entry(1, 80, ptx80), entry(1, 90, ptx90), entry(1, 100, ptx100))
    third = fat_binary(entry(2, 100, sass100), entry(1, 100, ptx100))
    blob = b"\0" * 8 + first + second + b"\0" * 8 + third
    parsed = fatbin.fatbins(blob, 0, len(blob))
    assert [[(e.kind, e.arch) for e in f] for f in parsed] == [
        [(2, 80), (2, 90), (2, 90), (2, 100), (1, 80)], [(2, 80), (1, 80), (1, 90), (1, 100)], [(2, 100), (1, 100)]]
    data = bytearray(blob)
    kept, zeroed = fatbin.strip_fatbins(data, 0, len(data), arch=90)
    assert len(data) == len(blob)
    assert kept == len(sass90) + len(sass90a) + len(ptx90)
    assert kept + zeroed == sum(e.size for f in parsed for e in f)
    for f in parsed:
        for e in f:
            chunk = bytes(data[e.payload:e.payload + e.size])
            loaded = (e.kind, e.arch) == (2, 90) or (f is parsed[1] and (e.kind, e.arch) == (1, 90))
            assert chunk == (blob[e.payload:e.payload + e.size] if loaded else bytes(e.size)), (e, loaded)
    assert [[(e.kind, e.arch) for e in f] for f in fatbin.fatbins(bytes(data), 0, len(data))] == \
        [[(e.kind, e.arch) for e in f] for f in parsed]  # headers untouched


def test_fatbin_refuses_entries_that_overrun_their_fat_binary():
    fatbin = load("fatbin")
    good = fat_binary(entry(2, 90, b"x" * 16))
    bad = bytearray(good)
    struct.pack_into("<Q", bad, 8, len(good) - 16 - 8)  # the header claims 8 bytes fewer than its entries take
    with pytest.raises(ValueError, match="entries end at"):
        fatbin.fatbins(bytes(bad) + b"\0" * 16, 0, len(bad))


def fake_output(ids, ranked, cached=0, prompt=(1, 2, 3)):
    logprobs = []
    for token, alternatives in zip(ids, ranked):
        position = {t: SimpleNamespace(logprob=lp, rank=rank) for rank, (t, lp) in enumerate(alternatives, 1)}
        position.setdefault(token, SimpleNamespace(logprob=-9.0, rank=7))
        logprobs.append(position)
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=logprobs)], num_cached_tokens=cached,
                           prompt_token_ids=list(prompt))


def test_engine_check_record_is_compare_py_format():
    check = load("engine_check")
    out = fake_output([5, 9], [[(5, -0.1), (6, -2.5), (7, -3.0)], [(8, -0.5), (9, -0.7)]], cached=128)
    record = check.record_of(out)
    assert record["output_ids"] == [5, 9]
    assert record["logprobs"] == [-0.1, -0.7]  # the chosen token's, also where it is not the top-1
    assert record["top2"] == [[[5, -0.1], [6, -2.5]], [[8, -0.5], [9, -0.7]]]
    assert record["cached_tokens"] == 128 and record["prompt_len"] == 3
    sys.path.insert(0, str(HARNESS.parent / "sglang"))
    try:
        import compare as sglang_compare
    finally:
        sys.path.remove(str(HARNESS.parent / "sglang"))
    ref = {"label": "a", "concurrent": [record], "text": record, "prefix_hit": record}
    other_record = dict(record, output_ids=[5, 8])
    result = sglang_compare.compare(ref, {"label": "b", "concurrent": [other_record], "text": record,
                                          "prefix_hit": record})
    # diverges at token 1, where the reference's top-2 gap is 0.2 nats: not a near-tie (0.125)
    assert result["requests_diverged"] == 1 and result["divergences_not_near_tie"] == 1


def test_engine_check_teacher_forced_record():
    check = load("engine_check")
    lp = lambda value, rank: SimpleNamespace(logprob=value, rank=rank)  # noqa: E731
    # vLLM's prompt_logprobs: None for the first token, then each position's top-2 and the prompt's own token
    out = SimpleNamespace(prompt_token_ids=[4, 7, 9], prompt_logprobs=[
        None, {7: lp(-0.2, 1), 3: lp(-2.0, 2)}, {2: lp(-0.1, 1), 5: lp(-2.5, 2), 9: lp(-4.0, 6)}])
    record = check.teacher_forced_of(out)
    assert record == {"prompt_ids": [4, 7, 9], "logprobs": [-0.2, -4.0],
                      "top2": [[[7, -0.2], [3, -2.0]], [[2, -0.1], [5, -2.5]]]}


def test_engine_check_workload_and_server_arguments():
    check = load("engine_check")
    concurrent, prefix = check.workload()
    base = next(p for p in concurrent if len(p) > check.PREFIX_TOKENS)
    assert prefix[:check.PREFIX_TOKENS] == base[:check.PREFIX_TOKENS] and len(prefix) == check.PREFIX_TOKENS + 37
    assert check.PREFIX_TOKENS % 128 == 0  # whole MXFP8 blocks
    args = SimpleNamespace(model=Path("/m"), backend="CUSTOM", kv_cache_dtype="mxfp8", eager=False, compilation="{}",
                           max_model_len=4096, gpu_memory_utilization=0.2, kv_cache_gib=4.0, dtype="float16")
    flags = check.serve_args(args)
    assert flags[0] == "/m"
    value = lambda flag: flags[flags.index(flag) + 1]  # noqa: E731
    assert value("--attention-backend") == "CUSTOM" and value("--kv-cache-dtype") == "mxfp8"
    assert value("--kv-cache-memory-bytes") == str(4 * 2**30) and value("--dtype") == "float16"
    assert check.engine_kwargs(args)["dtype"] == "float16"
    assert "--enforce-eager" not in flags and "--enable-prompt-tokens-details" in flags
    assert check.engine_kwargs(args)["compilation_config"]["cudagraph_capture_sizes"] == check.CAPTURE_SIZES
    eager = check.serve_args(SimpleNamespace(**{**vars(args), "eager": True}))
    assert "--enforce-eager" in eager and "--compilation-config" not in eager


def test_latency_points_parse():
    points = load("latency_points")
    assert points.parse_points("32x4096, 128x4096,16x32768") == [(32, 4096), (128, 4096), (16, 32768)]
    for bad in ("32", "0x4096", "ax1", "32x"):
        with pytest.raises(ValueError, match="BATCHxCONTEXT"):
            points.parse_points(bad)


def parity_record(label, rng, noise, base, prompts=3, positions=400, greedy_tokens=12):
    """An engine_check record whose logprobs are ``base``'s moved by N(0, noise) per position (noise 0: identical)."""
    import random

    teacher = [{"prompt_ids": p["prompt_ids"], "logprobs": [x + rng.gauss(0, noise) if noise else x
                                                             for x in p["logprobs"]], "top2": []}
               for p in base["teacher_forced"]]
    answer = lambda r: dict(r, logprobs=[x + rng.gauss(0, noise) if noise else x for x in r["logprobs"]])  # noqa
    return {"label": label, "concurrent": [answer(r) for r in base["concurrent"]], "text": answer(base["text"]),
            "prefix_hit": answer(base["prefix_hit"]), "teacher_forced": teacher}


def parity_base(rng, prompts=3, positions=400, greedy_tokens=12):
    request = lambda: {"output_ids": [rng.randrange(100) for _ in range(greedy_tokens)],  # noqa: E731
                       "logprobs": [-rng.random() for _ in range(greedy_tokens)], "top2": []}
    return {"concurrent": [request() for _ in range(prompts)], "text": request(), "prefix_hit": request(),
            "teacher_forced": [{"prompt_ids": list(range(i, i + positions + 1)),
                                "logprobs": [-3 * rng.random() for _ in range(positions)], "top2": []}
                               for i in range(prompts)]}


def test_parity_rule_fails_the_control_and_passes_correct_engines():
    import random

    parity = load("parity")
    rng = random.Random(7)
    base = parity_base(rng)
    floor_noise = 0.0235  # the float16 floor of gemma3-swa in bench/results/current/vllm-parity-rule-cpu
    runs = {"m_TRITON_ATTN_auto_fp16": dict(base, label="ref"),
            "m_TRITON_ATTN_auto_fp16+again": parity_record("again", rng, 0.0, base),
            "m_FLASHINFER_auto_fp16": parity_record("floor", rng, floor_noise, base),
            "m_CUSTOM_auto_fp16": parity_record("ours", rng, floor_noise * 1.1, base),
            "m_CUSTOM_auto_fp16+broken": parity_record("broken", rng, floor_noise * 5, base),  # there: 5.0x
            "m_CUSTOM_mxfp8_fp16": parity_record("mxfp8", rng, floor_noise * 6, base),
            "m_TRITON_ATTN_auto": dict(base, label="bf16 ref")}  # another dtype: its own group, no floor there
    groups = {g["reference"]: g for g in parity.judge_all(runs)}
    rows = {r["run"]: r for r in groups["m_TRITON_ATTN_auto_fp16"]["rows"]}
    assert groups["m_TRITON_ATTN_auto_fp16"]["floor_runs"] == ["m_FLASHINFER_auto_fp16"]
    assert rows["m_CUSTOM_auto_fp16+broken"]["verdict"] == "FAIL"
    assert rows["m_CUSTOM_auto_fp16+broken"]["tf_over_floor"] > 3
    assert rows["m_CUSTOM_auto_fp16"]["verdict"] == "pass" and rows["m_TRITON_ATTN_auto_fp16+again"]["verdict"] == "pass"
    assert rows["m_TRITON_ATTN_auto_fp16+again"]["tf_mean_abs_dlogprob"] == 0.0
    assert rows["m_TRITON_ATTN_auto_fp16+again"]["tf_positions"] == 3 * 400
    assert rows["m_CUSTOM_mxfp8_fp16"]["verdict"] == "drift" and rows["m_FLASHINFER_auto_fp16"]["verdict"] == "floor"
    assert groups["m_TRITON_ATTN_auto"]["rows"] == []  # the fp16 runs are not in the bf16 group
    # without a floor run nothing is judged (a rule without its floor would pass or fail by accident)
    del runs["m_FLASHINFER_auto_fp16"]
    rows = {r["run"]: r for r in parity.judge_all(runs)[1]["rows"]}
    assert rows["m_CUSTOM_auto_fp16+broken"]["verdict"] == "NO FLOOR"


def test_parity_rule_refuses_runs_that_scored_different_prompts():
    import random

    parity = load("parity")
    rng = random.Random(3)
    base = parity_base(rng, prompts=2, positions=10)
    other = parity_record("other", rng, 0.0, base)
    other["teacher_forced"][1]["prompt_ids"] = [9] * 11
    with pytest.raises(ValueError, match="scored different prompts"):
        parity.teacher_forced_distance(base, other)
    assert parity.split_name("llama-gqa4_TRITON_ATTN_auto_fp16+again", "llama-gqa4") == \
        ("TRITON_ATTN_auto", ("fp16", "again"))
    assert parity.split_name("gemma3-swa_CUSTOM_mxfp8", "gemma3-swa") == ("CUSTOM_mxfp8", ())
