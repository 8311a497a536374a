"""DecodeConfig(pdl_merge=True): the merge launched with programmatic dependent launch (sm_90+), without a GPU.
Where the plan allows it and why not, what the launcher passes (fake kernels), and the compiled kernels' Grid
Dependency Control instructions (only when asked for; the default kernels compile as before). Its speed is a GPU
run's (bench/sweep_decode_variants.py, variant "planned/pdl")."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (the core tests run without it)")

from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.triton import DecodeConfig, decode_attention, plan_decode, run_decode  # noqa: E402
from sglang_inkling_backend.triton import plan as plan_mod  # noqa: E402

SHAPE = dict(num_q_heads=16, num_kv_heads=2, head_dim=128, max_seq_len=4096, page_size=128)
PDL = DecodeConfig(pdl_merge=True)


def test_the_plan_takes_pdl_only_where_it_runs(monkeypatch):
    with pytest.raises(ValueError, match="pdl_merge=True needs programmatic dependent launch .*: not a CUDA device"):
        plan_decode(1, config=PDL, device="cpu", **SHAPE)
    with pytest.raises(ValueError, match="pdl_merge must be None, True or False, got 'yes'"):
        plan_decode(1, config=DecodeConfig(pdl_merge="yes"), device="cpu", **SHAPE)
    assert plan_decode(1, device="cpu", **SHAPE).pdl_merge is False  # off unless asked for
    # one split: no merge to launch early, nothing refused
    one = plan_decode(1, config=DecodeConfig(pdl_merge=True, num_splits=1), device="cpu", **SHAPE)
    assert (one.num_splits, one.pdl_merge) == (1, False)
    monkeypatch.setattr(plan_mod, "pdl_status", lambda device: (True, "a test's sm_90"))
    plan = plan_decode(1, config=PDL, device="cpu", **SHAPE)
    assert plan.num_splits > 1 and plan.pdl_merge is True


def test_pdl_status_says_why_not(monkeypatch):
    assert plan_mod.pdl_status("cpu") == (False, "not a CUDA device")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert plan_mod.pdl_status("cuda:0") == (False, "the Triton interpreter is on")
    monkeypatch.delenv("TRITON_INTERPRET")
    from sglang_inkling_backend.triton import device as device_mod

    if device_mod.gdc_wait is None:
        assert plan_mod.pdl_status("cuda:0")[1].endswith("has no triton.language.extra.cuda.gdc_wait")
        return
    for cap, ok, why in (((8, 0), False, "sm_80 is older than sm_90"), ((8, 9), False, "sm_89 is older than sm_90"),
                         ((9, 0), True, "sm_90"), ((10, 0), True, "sm_100")):
        monkeypatch.setattr(plan_mod, "_cuda_capability", lambda index, cap=cap: cap)
        assert plan_mod.pdl_status("cuda:0") == (ok, why)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert plan_mod.pdl_status("cuda:0")[0] is False


class _FakeKernel:
    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.calls.append((self.name, {k: v for k, v in kw.items() if isinstance(v, bool)}))
        return launch


@pytest.mark.parametrize("pdl", [False, True])
def test_the_launcher_passes_both_halves_of_the_handshake(monkeypatch, pdl):
    """Stage 1 triggers its dependents and the merge both launches with launch_pdl and waits in the kernel, or
    neither does: a merge launched early without the wait would read partial rows stage 1 has not written."""
    monkeypatch.setattr(plan_mod, "pdl_status", lambda device: (True, "a test's sm_90"))
    calls = []
    monkeypatch.setattr(decode_attention, "decode_blocks_kernel", _FakeKernel("blocks", calls))
    monkeypatch.setattr(decode_attention, "decode_tiles_kernel", _FakeKernel("tiles", calls))
    monkeypatch.setattr(decode_attention, "decode_merge_kernel", _FakeKernel("merge", calls))
    kv = PagedKV(torch.zeros(512, 2, 128, dtype=torch.bfloat16), torch.zeros(512, 2, 128, dtype=torch.bfloat16))
    q = torch.zeros(1, 16, 128, dtype=torch.bfloat16)
    plan = plan_decode(1, config=DecodeConfig(pdl_merge=pdl or None, num_splits=4), device="cpu", **SHAPE)
    run_decode(plan, q, kv, params=AttentionParams(1.0 / 128), out=torch.empty_like(q),
               page_table=torch.tensor([[0, 1, 2, 3]], dtype=torch.int32),
               seq_lens=torch.tensor([500], dtype=torch.int32))
    (stage1, s1_flags), (merge, m_flags) = calls
    assert merge == "merge" and stage1 in ("blocks", "tiles")
    assert (s1_flags["TRIGGER_MERGE"], m_flags["WAIT_PRIMARY"]) == (pdl, pdl)
    # launch_pdl only when on: Triton's AMD launcher refuses launch options its backend does not have
    assert m_flags.get("launch_pdl", "absent") == (True if pdl else "absent")


COMPILE = """
import json, sys
sys.path.insert(0, {root!r})
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tools.compile_sm90 import compile_decode, launch_signature
from sglang_inkling_backend.triton.decode_merge import decode_merge_kernel
out = {{}}
for on in (False, True):
    for name, kw in (("blocks", dict(block_n=32, warps=1, stages=3, paged="blocks")),
                     ("tiles", dict(block_n=64, warps=2, stages=2, paged=True))):
        out[name + str(on)] = compile_decode(extra={{"TRIGGER_MERGE": on}}, **kw).asm["ptx"].count("griddepcontrol")
    consts = dict(HQ=16, D=128, HAS_WINDOW=False, HAS_SINKS=False, SPLIT_BLOCK=32, ALIGN=128, BLOCK_D=32,
                  PAGE_TABLE=True, BLOCK_N=128, WAIT_PRIMARY=on)
    types = {{"part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "lens_ptr": "*i32", "sinks_ptr": "*bf16",
             "out_ptr": "*bf16"}}
    sig, attrs = launch_signature(decode_merge_kernel, types, consts)
    k = triton.compile(ASTSource(decode_merge_kernel, sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={{"num_warps": 4}})
    out["merge" + str(on)] = k.asm["ptx"].count("griddepcontrol.wait")
print("RESULT " + json.dumps(out))
"""


def test_the_kernels_carry_grid_dependency_control_only_when_asked():
    """sm_90 PTX: griddepcontrol.launch_dependents in the stage-1 kernels and griddepcontrol.wait in the merge with
    the constexprs on, none without (the default kernels' SASS is unchanged by the option: checked once offline,
    Triton 3.9)."""
    from sglang_inkling_backend.triton import device as device_mod

    if device_mod.gdc_wait is None or importlib.util.find_spec("triton.backends.nvidia") is None:
        pytest.skip("this Triton has no Grid Dependency Control extras or no NVIDIA backend")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    run = subprocess.run([sys.executable, "-c", COMPILE.format(root=root)], capture_output=True, text=True, env=env,
                         timeout=600, cwd=root)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT "):])
    assert got == {"blocksFalse": 0, "tilesFalse": 0, "mergeFalse": 0, "blocksTrue": 1, "tilesTrue": 1,
                   "mergeTrue": 1}, got
