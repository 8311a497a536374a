"""The Gluon Hopper decode kernel without a GPU: where plan_decode picks it, why it is off, the inputs it refuses
before launching, and its offline compile for sm_90a (the installed Triton's Gluon and ptxas). Its results on a GPU
are gpu_tests/check_triton_gpu.py's ("table(hopper)") and bench/bench_decode.py's (ours_mxfp8_hopper)."""

import importlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (the core tests run without it)")

from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402
from sglang_inkling_backend.triton import DecodeConfig, plan_decode, run_decode  # noqa: E402
from sglang_inkling_backend.triton import plan as plan_mod  # noqa: E402

BIG = dict(num_q_heads=16, num_kv_heads=2, head_dim=128, max_seq_len=32768, page_size=128, device="cpu")


def test_fits_rule_numbers():
    fits = plan_mod.hopper_decode_fits
    assert fits(128, 16, 2, 128, 32768)  # 256 (request, KV head) pairs x 32k keys
    assert fits(1, 64, 8, 128, 32768)  # 8 pairs x 32768 keys = 2**18 exactly
    assert not fits(1, 64, 8, 128, 16384)  # 2**17 pair-keys
    assert not fits(128, 64, 8, 128, 1024)  # fewer than 2048 keys per request
    assert fits(32, 16, 8, 256, 16384)  # head_dim 256 on half-page tiles: 0.86x the Triton kernel's time (H100)
    assert not fits(128, 8, 8, 64, 32768)  # head_dim 64: not measured
    assert not fits(128, 32, 2, 128, 32768)  # 16 query heads per KV head


def test_plan_takes_hopper_only_where_it_can_run(monkeypatch):
    assert plan_decode(128, kv_format="mxfp8", **BIG).kernel == "blocks"  # a CPU: never
    monkeypatch.setattr(plan_mod, "hopper_decode_status", lambda device: (True, "a test's sm_90"))
    plan = plan_decode(128, kv_format="mxfp8", **BIG)
    assert (plan.kernel, plan.block_n, plan.num_warps, plan.num_stages) == ("hopper", 128, 4, 3)
    assert plan.num_splits == 1  # 256 pairs >= one round of 2 programs on each of 132 SMs
    assert plan_decode(8, kv_format="mxfp8", **BIG).num_splits == 16  # 2 * 132 // 16 pairs
    for kv_format in ("fp8_e4m3", "bf16", None):  # only MXFP8 pools
        assert plan_decode(128, kv_format=kv_format, **BIG).kernel != "hopper"
    assert plan_decode(128, kv_format="mxfp8", **dict(BIG, page_size=64)).kernel != "hopper"
    wide = plan_decode(128, kv_format="mxfp8", **dict(BIG, head_dim=256))  # half-page tiles, 2 stages
    assert (wide.kernel, wide.block_n, wide.num_warps, wide.num_stages) == ("hopper", 64, 4, 2)
    forced = plan_decode(2, kv_format="mxfp8", config=DecodeConfig(kernel="hopper"), **dict(BIG, head_dim=256))
    assert (forced.kernel, forced.block_n, forced.num_stages) == ("hopper", 64, 2)  # a forced kernel too
    assert plan_decode(128, kv_format="mxfp8", **dict(BIG, head_dim=64)).kernel != "hopper"
    assert plan_decode(2, kv_format="mxfp8", **dict(BIG, max_seq_len=4096)).kernel != "hopper"  # 2**14 pair-keys
    # a kernel named by the caller wins over the route
    assert plan_decode(128, kv_format="mxfp8", config=DecodeConfig(kernel="blocks"), **BIG).kernel == "blocks"
    with pytest.raises(ValueError, match="kv_format must be None or one of .*got 'e4m3'"):
        plan_decode(128, kv_format="e4m3", **BIG)


def test_status_says_why_it_is_off(monkeypatch):
    assert plan_mod.hopper_decode_status("cpu") == (False, "not a CUDA device")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("INKLING_DISABLE_HOPPER_DECODE", raising=False)
    for cap, gluon in (((8, 0), False), ((9, 0), True), ((10, 0), False)):
        monkeypatch.setattr(plan_mod, "_hopper_status", {})
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: cap)
        ok, why = plan_mod.hopper_decode_status("cuda:0")
        if not gluon:
            assert (ok, why) == (False, f"sm_{cap[0]}{cap[1]} is not sm_90")
            continue
        try:  # under the interpreter (this process) Gluon's import itself refuses: an AssertionError
            importlib.import_module("triton.experimental.gluon.language.nvidia.hopper")
            assert (ok, why) == (True, "sm_90 with Triton's Gluon")
        except Exception:  # noqa: BLE001
            assert not ok and "has no usable Gluon Hopper module" in why
    monkeypatch.setattr(plan_mod, "_hopper_status", {})
    monkeypatch.setenv("INKLING_DISABLE_HOPPER_DECODE", "1")
    assert plan_mod.hopper_decode_status("cuda:0") == (False, "INKLING_DISABLE_HOPPER_DECODE is set")


def _pools(pages=3, hkv=2, d=128):
    slots = pages * 128
    layout = ScaleLayout.for_pool(slots, hkv, d, 128)
    fp8 = lambda: torch.zeros(slots, hkv, d, dtype=torch.float8_e4m3fn)  # noqa: E731
    mx = PagedKV(fp8(), fp8(), layout.empty("cpu"), layout.empty("cpu"), layout)
    bf = PagedKV(torch.zeros(slots, hkv, d, dtype=torch.bfloat16), torch.zeros(slots, hkv, d, dtype=torch.bfloat16))
    return mx, bf


def test_hopper_plan_refuses_other_pools_and_maps_before_launch():
    _, bf = _pools()
    q = torch.zeros(2, 16, 128, dtype=torch.bfloat16)
    out = torch.full_like(q, 7.0)
    table = torch.tensor([[1, 2], [2, 1]], dtype=torch.int32)
    lens = torch.tensor([200, 100], dtype=torch.int32)
    plan = plan_decode(2, num_q_heads=16, num_kv_heads=2, head_dim=128, max_seq_len=256, page_size=128,
                       config=DecodeConfig(kernel="hopper"), device="cpu")
    params = AttentionParams(1.0 / 128)
    with pytest.raises(ValueError, match="kernel='hopper' reads MXFP8 pages .* got a page table over a "
                                         "torch.bfloat16 pool"):
        run_decode(plan, q, bf, params=params, page_table=table, seq_lens=lens, out=out)
    indptr = torch.tensor([0, 128, 256], dtype=torch.int32)
    with pytest.raises(ValueError, match="kernel='hopper' reads MXFP8 pages .* got a CSR over a torch.bfloat16 pool"):
        run_decode(plan, q, bf, indptr, torch.arange(128, 384, dtype=torch.int32), params, out=out)
    assert bool((out == 7.0).all())  # nothing written
    with pytest.raises(ValueError, match=r"kernel='hopper' reads 128-slot pages .* in \(64, 128\), "
                                         "got page_size=64, block_n=128"):
        plan_decode(2, num_q_heads=16, num_kv_heads=2, head_dim=128, max_seq_len=256, page_size=64,
                    config=DecodeConfig(kernel="hopper"), device="cpu")
    with pytest.raises(ValueError, match="kernel='hopper' reads 128-slot pages .* got page_size=128, block_n=32"):
        plan_decode(2, num_q_heads=16, num_kv_heads=2, head_dim=128, max_seq_len=256, page_size=128,
                    config=DecodeConfig(kernel="hopper", block_n=32), device="cpu")
    half = plan_decode(2, num_q_heads=16, num_kv_heads=2, head_dim=256, max_seq_len=256, page_size=128,
                       config=DecodeConfig(kernel="hopper", block_n=64, num_stages=2), device="cpu")
    assert (half.kernel, half.block_n, half.num_stages) == ("hopper", 64, 2)


def compile_report(**args):
    """tools/compile_hopper.py's report, in a process of its own (this one may run the Triton interpreter, under
    which Gluon does not import)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    cmd = [sys.executable, os.path.join(root, "tools", "compile_hopper.py")]
    for name, value in args.items():
        cmd += [f"--{name}"] if value is True else [f"--{name}", str(value)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=root, timeout=600)
    if run.returncode != 0:
        tail = run.stderr.strip().splitlines()[-3:]
        if any("Gluon" in line or "gluon" in line for line in tail) and "Error" in run.stderr and \
                "CompilationError" not in run.stderr:
            pytest.skip(f"this Triton has no Gluon: {tail}")
        raise AssertionError(f"compile_hopper.py failed: {run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_group_past_eight_heads_is_split_across_programs_of_a_kv_head(monkeypatch):
    """GQA 16 (and 12, 9) on the Hopper kernel: programs of at most 8 query heads (16 on one program spill), so a
    KV head gets 2 (or 3) programs and the splits are planned for that many programs per request; GQA <= 8 keeps one.
    The route still picks the kernel only where the H200 grid measured it faster (GQA <= 8)."""
    split = plan_mod.hopper_head_split
    assert [split(g) for g in (1, 4, 8, 9, 12, 16, 32)] == [1, 1, 1, 3, 2, 2, 4]
    monkeypatch.setattr(plan_mod, "hopper_decode_status", lambda device: (True, "a test's sm_90"))
    gqa16 = dict(BIG, num_q_heads=64, num_kv_heads=4)
    assert plan_decode(32, kv_format="mxfp8", **gqa16).kernel == "blocks"  # not measured: not picked
    forced = plan_decode(8, kv_format="mxfp8", config=DecodeConfig(kernel="hopper"), **gqa16)
    same_pairs = plan_decode(8, kv_format="mxfp8", config=DecodeConfig(kernel="hopper"),
                             **dict(BIG, num_q_heads=64, num_kv_heads=8))
    assert forced.kernel == "hopper" and forced.num_splits == same_pairs.num_splits  # 8 x 4 x 2 = 8 x 8 programs


@pytest.mark.parametrize("d, g, flags, csr, mmas", [(128, 8, False, False, 16), (64, 1, True, True, 8)])
def test_kernel_compiles_for_sm90(d, g, flags, csr, mmas):
    """The installed Triton builds the kernel for sm_90a with the structure its docstring describes: per page, one
    e4m3 MMA per 32-channel block, 64-key row half and Q part (two parts), one fp16 MMA per 64 channels and 16
    keys, TMA loads of K and V at three places (the first stages, the refill and nowhere else), no spills."""
    try:
        importlib.util.find_spec("triton.experimental.gluon")
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"no Gluon: {err}")
    rep = compile_report(D=d, G=g, **({"all-flags": True} if flags else {}), **({"csr": True} if csr else {}))
    assert (rep["wgmma_e4m3"], rep["wgmma_f16"]) == (mmas, mmas)
    assert rep["wgmma_e4m3"] == (d // 32) * 2 * 2 and rep["wgmma_f16"] == (d // 64) * (128 // 16)
    assert rep["tma_loads"] == 6 and rep["stack"] == 0
    assert rep["shared"] <= 232448  # an H100/H200 SM's 227 KiB


def test_the_head_split_kernel_compiles_without_spills():
    """GQA 16 as two programs of 8 heads per KV head compiles as the 8-head kernel does (no stack), where 16 heads on
    one program do not fit (255 registers and a stack)."""
    try:
        importlib.util.find_spec("triton.experimental.gluon")
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"no Gluon: {err}")
    split = compile_report(G=8, **{"head-split": 2, "all-flags": True})
    assert split["stack"] == 0 and split["regs"] <= 232 and split["wgmma_e4m3"] == 16
    whole = compile_report(G=16)
    assert whole["stack"] > 0 or whole["regs"] >= 255


def test_the_routes_head_dim_256_configuration_compiles_without_spills():
    """plan.HOPPER_WIDE (what the route launches at head_dim 256) builds without a stack, and 2 programs fit an SM
    as its split policy assumes (``resident``: registers and shared memory for two)."""
    try:
        importlib.util.find_spec("triton.experimental.gluon")
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"no Gluon: {err}")
    wide = plan_mod.hopper_config(256)
    rep = compile_report(D=256, G=2, stages=wide["num_stages"], **{"block-n": wide["block_n"]})
    assert rep["stack"] == 0
    assert wide["resident"] * rep["regs"] * 128 <= 65536 and wide["resident"] * rep["shared"] <= 232448
    assert rep["wgmma_e4m3"] == (256 // 32) * 2 * (wide["block_n"] // 64)
    assert rep["wgmma_f16"] == (256 // 64) * (wide["block_n"] // 16)


def test_the_warp_specialized_kernel_is_planned_only_when_named(monkeypatch):
    """kernel="hopper_ws" plans as the Hopper kernel does (tiles, stages, head split, 2 programs per SM, so the same
    splits) and refuses the same pools, before writing anything; the route never picks it on its own (not timed)."""
    monkeypatch.setattr(plan_mod, "hopper_decode_status", lambda device: (True, "a test's sm_90"))
    ws = DecodeConfig(kernel="hopper_ws")
    assert plan_decode(128, kv_format="mxfp8", **BIG).kernel == "hopper"
    plan = plan_decode(128, kv_format="mxfp8", config=ws, **BIG)
    assert (plan.kernel, plan.block_n, plan.num_warps, plan.num_stages) == ("hopper_ws", 128, 4, 3)
    wide = plan_decode(32, kv_format="mxfp8", config=ws, **dict(BIG, head_dim=256))
    assert (wide.kernel, wide.block_n, wide.num_stages) == ("hopper_ws", 64, 2)
    for shape in (BIG, dict(BIG, num_q_heads=64, num_kv_heads=4)):  # GQA 8, and GQA 16 as 2 programs per KV head
        one = plan_decode(8, kv_format="mxfp8", config=DecodeConfig(kernel="hopper"), **shape)
        assert plan_decode(8, kv_format="mxfp8", config=ws, **shape).num_splits == one.num_splits > 1
    with pytest.raises(ValueError, match="kernel='hopper_ws' reads 128-slot pages .* got page_size=64, block_n=128"):
        plan_decode(2, kv_format="mxfp8", config=ws, **dict(BIG, page_size=64))
    _, bf = _pools()
    q = torch.zeros(2, 16, 128, dtype=torch.bfloat16)
    out = torch.full_like(q, 7.0)
    small = plan_decode(2, num_q_heads=16, num_kv_heads=2, head_dim=128, max_seq_len=256, page_size=128, config=ws,
                        device="cpu")
    with pytest.raises(ValueError, match="kernel='hopper_ws' reads MXFP8 pages .* got a page table over a "
                                         "torch.bfloat16 pool"):
        run_decode(small, q, bf, params=AttentionParams(1.0 / 128), out=out,
                   page_table=torch.tensor([[1, 2], [2, 1]], dtype=torch.int32),
                   seq_lens=torch.tensor([200, 100], dtype=torch.int32))
    assert bool((out == 7.0).all())


@pytest.mark.parametrize("head_dim, group", [(128, 8), (256, 2)])
def test_the_warp_specialized_kernel_compiles_for_two_programs_per_sm(head_dim, group):
    """decode_hopper_ws in the configuration plan.hopper_ws_config gives: no stack; two programs of 8 warps fit an
    SM's registers and shared memory (its ``resident``); its partitions move to 96 (the value warpgroup,
    HOPPER_WS_VALUE_REGS) and 160 registers (the softmax warpgroup: 8 warps x 128 less 4 x 96, over 4); and the
    per-tile structure of the one-warpgroup kernel (the same MMAs), with TMA loads in the prologue, one per stage
    and side, and at the value warpgroup's refill."""
    try:
        importlib.util.find_spec("triton.experimental.gluon")
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"no Gluon: {err}")
    cfg = plan_mod.hopper_ws_config(head_dim)
    rep = compile_report(ws=True, D=head_dim, G=group, stages=cfg["num_stages"], **{"block-n": cfg["block_n"],
                                                                                    "all-flags": True})
    assert rep["stack"] == 0
    assert cfg["resident"] * rep["regs"] * 8 * 32 <= 65536
    assert cfg["resident"] * (rep["shared"] + 1024) <= 233472  # 228 KiB per SM, 1 KiB reserved per program
    assert {96, 160} <= set(rep["setmaxnreg"]) and 4 * 96 + 4 * 160 == 8 * rep["regs"]
    assert rep["wgmma_e4m3"] == (head_dim // 32) * 2 * (cfg["block_n"] // 64)
    assert rep["wgmma_f16"] == (head_dim // 64) * (cfg["block_n"] // 16)
    assert rep["tma_loads"] == 2 * (cfg["num_stages"] + 1)


def test_the_warp_specialized_kernel_with_two_p_sets_fits_two_programs_on_two_stages():
    """The P_SETS=2 variant (the softmax warpgroup up to two tiles ahead) adds a P' set: at head_dim 128 two programs
    fit an SM's shared memory on 2 stages, not on 3."""
    try:
        importlib.util.find_spec("triton.experimental.gluon")
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"no Gluon: {err}")
    two = compile_report(ws=True, stages=2, constexpr="P_SETS=2")
    three = compile_report(ws=True, stages=3, constexpr="P_SETS=2")
    one = compile_report(ws=True, stages=3)
    assert two["stack"] == 0 and 2 * (two["shared"] + 1024) <= 233472 < 2 * (three["shared"] + 1024)
    assert three["shared"] - one["shared"] >= 2 * 128 * 16 * 2  # a P' set: two halves of [128 keys, 16] fp16


def test_each_hopper_launcher_passes_its_kernel_the_same_arguments_and_its_own_options():
    """run_decode over an MXFP8 pool with fake kernels (tests/triton_tests/hopper_launch_probe.py): the one-warpgroup
    and the warp-specialized kernel get the same grid, arguments and constexprs (GQA 16: 2 programs of 8 heads per KV
    head), each with its own launch options: 8 warps' worth of registers at 128 for hopper_ws (4 warps launched, the
    value warpgroup added by warp_specialize) and never the one-warpgroup kernel's 2-stage options (ONE_P, 168)."""
    try:
        importlib.util.find_spec("triton.experimental.gluon")
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"no Gluon: {err}")
    one3, ws3, one2, ws2 = launch_probe(64, 4, 128)
    assert [c["kernel"] for c in (one3, ws3, one2, ws2)] == ["hopper", "hopper_ws", "hopper", "hopper_ws"]
    options = ("num_warps", "maxnreg", "ONE_P")
    for one, ws in ((one3, ws3), (one2, ws2)):
        assert ws["grid"] == one["grid"] == [2, 4 * 2, 1] and ws["nargs"] == one["nargs"]
        assert {k: v for k, v in ws["kw"].items() if k not in options} == \
            {k: v for k, v in one["kw"].items() if k not in options}
        assert (ws["kw"]["HEAD_SPLIT"], ws["kw"]["G"]) == (2, 8)
        assert (ws["kw"]["num_warps"], ws["kw"]["maxnreg"]) == (4, 128) and "ONE_P" not in ws["kw"]
    assert (one2["kw"]["NUM_STAGES"], one2["kw"]["ONE_P"], one2["kw"]["maxnreg"]) == (2, True, 168)
    assert "maxnreg" not in one3["kw"] and ws2["kw"]["NUM_STAGES"] == 2


def launch_probe(hq, hkv, d, constexprs=None):
    """The launches of tests/triton_tests/hopper_launch_probe.py, in a process without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    args = [str(hq), str(hkv), str(d)] + ([json.dumps(constexprs)] if constexprs else [])
    run = subprocess.run([sys.executable, os.path.join(root, "tests", "triton_tests", "hopper_launch_probe.py"),
                          *args], env=env, capture_output=True, text=True, cwd=root, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_variant_may_put_a_group_of_sixteen_on_one_program():
    """A benchmark variant's HEAD_SPLIT (bench_decode.py BENCH_HOPPER_VARIANTS constexprs) sets the programs per KV
    head for the grid as well as the kernel: GQA 16 on one program is 4 programs of 16 heads (G_PAD 16), not 8 of 8;
    a HEAD_SPLIT that does not divide the group is refused before any launch."""
    try:
        importlib.util.find_spec("triton.experimental.gluon")
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"no Gluon: {err}")
    for call in launch_probe(64, 4, 128, {"HEAD_SPLIT": 1}):
        assert call["grid"] == [2, 4, 1]
        assert (call["kw"]["HEAD_SPLIT"], call["kw"]["G"], call["kw"]["G_PAD"]) == (1, 16, 16)
    refused = launch_probe(64, 4, 128, {"HEAD_SPLIT": 3})
    assert refused["launches"] == 0 and "HEAD_SPLIT=3 does not divide the 16 query heads" in refused["error"]


@pytest.mark.parametrize("ws", [False, True])
def test_the_hopper_kernels_trigger_the_merge_only_when_asked(ws):
    """DecodeConfig(pdl_merge=True) (tests/triton_tests/test_pdl_merge.py): with TRIGGER_MERGE each Hopper kernel
    issues griddepcontrol.launch_dependents once, without it none (its default launch is unchanged)."""
    try:
        importlib.util.find_spec("triton.experimental.gluon")
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"no Gluon: {err}")
    args = {"ws": True} if ws else {}
    assert compile_report(**args)["griddepcontrol"] == 0
    on = compile_report(constexpr="TRIGGER_MERGE=1", **args)
    assert on["griddepcontrol"] == 1 and on["stack"] == 0
