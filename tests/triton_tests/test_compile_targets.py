"""Every GPU target compiles the decode block kernel (on the CPU: Triton's wheel carries ptxas and the AMD code
generator), and the e4m3 decodings that AMD's code uses are checked against float8_e4m3fn's over all 256 codes.

- sm_80, sm_86, sm_89, sm_90, sm_100, sm_120, gfx942, gfx950: ``decode_blocks_kernel`` over an MXFP8 pool (as bytes
  on sm_80 / sm_86, as the route passes it there) compiles with registers > 0 and decodes e4m3 as
  bench/results/current/compile-targets/README.md says: integer operations (sm_80 / sm_86), cvt.rn.f16x2.e4m3x2
  (sm_89 on), gfx942's software sequence and no v_cvt fp8 instruction (gfx942's own fp8 conversions read e4m3fnuz,
  not the pool's e4m3fn), gfx950's v_cvt_scalef32_pk_f16_fp8 (OCP e4m3, e4m3fn's format).
- gfx942's two software sequences, step for step in torch: e4m3fn -> fp16 gives float8_e4m3fn's value for every
  code (NaNs, -0 and subnormals included); e4m3fn -> bf16 for every code but the NaNs 0x7F / 0xFF, which it reads as
  +-480. The same comparison fails on the e4m3fnuz reading of the bytes (what a native gfx942 conversion gives) and
  on a decoder that flushes subnormals.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
TARGETS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120", "gfx942", "gfx950")

# Run in a fresh interpreter without TRITON_INTERPRET (tests/conftest.py sets it in this one, and the kernels
# imported here would be interpreted functions). One process compiles every target: Triton is imported once.
COMPILE_EVERY_TARGET = """
import json, sys
sys.path.insert(0, {tools!r})
import compile_targets as ct
from triton.backends import backends
case_id = next(i for i, case in enumerate(ct.CASES) if case.kernel == "decode_blocks" and case.pool == "mxfp8")
for target in {targets!r}:
    vendor = "nvidia" if ct.TARGETS[target][0] == "cuda" else "amd"
    if vendor in backends:
        record = ct.compile_case(case_id, target)
    else:
        record = {{"target": target, "unavailable": "this Triton has no " + vendor + " backend"}}
    print("RECORD " + json.dumps(record), flush=True)
"""


@pytest.fixture(scope="module")
def block_kernel_records():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default; silences its warning
    result = subprocess.run([sys.executable, "-c", COMPILE_EVERY_TARGET.format(tools=TOOLS, targets=TARGETS)],
                            capture_output=True, text=True, env=env, timeout=600)
    records = {}
    for line in result.stdout.splitlines():
        if line.startswith("RECORD "):
            record = json.loads(line[len("RECORD "):])
            records[record["target"]] = record
    assert result.returncode == 0 and len(records) == len(TARGETS), result.stderr[-3000:]
    return records


@pytest.mark.parametrize("target", TARGETS)
def test_the_decode_block_kernel_compiles_for(target, block_kernel_records):
    record = block_kernel_records[target]
    if "unavailable" in record:
        pytest.skip(record["unavailable"])
    assert record["compiled"], record.get("error_detail") or record["error"]
    assert record["registers"] > 0
    e4m3 = record["e4m3"]
    if target in ("sm_80", "sm_86"):
        assert record["pool_arg"] == "*u8" and e4m3["how"].startswith("integer operations")
    elif target.startswith("sm_"):
        assert record["pool_arg"] == "*fp8e4nv" and e4m3["instructions"].get("cvt.rn.f16x2.e4m3x2", 0) > 0
    elif target == "gfx942":
        # A v_cvt_*fp8 instruction here would read the pool's e4m3fn bytes as e4m3fnuz: half the value, and 0x80
        # (e4m3fn's -0) as NaN
        assert e4m3["instructions"] == {}, f"gfx942 converts e4m3fn bytes natively (fnuz!): {e4m3}"
        assert e4m3["software_sequences"] == ["software to fp16 (NaN kept)"]
    else:
        assert e4m3["instructions"].get("v_cvt_scalef32_pk_f16_fp8", 0) > 0, e4m3


# Every kernel for every target, in one configuration each (the first of tools/compile_targets.py's cases for it)
# and, where the pool goes as bytes (sm_80 / sm_86), each kernel that takes a pool with a per-tensor fp8 one too
# (its unused scale arguments once were a float8e4nv pointer, which Triton refuses there). One process per vendor,
# side by side. The full table (every configuration and pool) is tools/compile_targets.py's.
COMPILE_EVERY_KERNEL = """
import json, sys
sys.path.insert(0, {tools!r})
import compile_targets as ct
from triton.backends import backends
for target in {targets!r}:
    vendor = "nvidia" if ct.TARGETS[target][0] == "cuda" else "amd"
    if vendor not in backends:
        print("RECORD " + json.dumps({{"target": target, "unavailable": "this Triton has no " + vendor + " backend"}}))
        continue
    chosen, seen = [], set()
    for i in ct.cases_for(target):
        case = ct.CASES[i]
        fp8_as_bytes = case.pool == "fp8" and ct.pool_as_bytes(target)
        if case.kernel not in seen or (fp8_as_bytes and (case.kernel, "fp8") not in seen):
            chosen.append(i)
            seen.update({{case.kernel, (case.kernel, case.pool)}})
    for i in chosen:
        print("RECORD " + json.dumps(ct.compile_case(i, target)), flush=True)
"""


@pytest.fixture(scope="module")
def every_kernel_records():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    vendors = [[t for t in TARGETS if t.startswith("sm_")], [t for t in TARGETS if t.startswith("gfx")]]
    procs = [subprocess.Popen([sys.executable, "-c", COMPILE_EVERY_KERNEL.format(tools=TOOLS, targets=targets)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for targets in vendors]
    records = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        records += [json.loads(line[len("RECORD "):]) for line in out.splitlines() if line.startswith("RECORD ")]
    return records


def test_every_kernel_compiles_for_every_target(every_kernel_records):
    available = [r for r in every_kernel_records if "unavailable" not in r]
    if not available:
        pytest.skip("this Triton has neither the NVIDIA nor the AMD backend")
    failed = [f"{r['target']} {r['kernel']} {r['pool']}: {r['error']}" for r in available if not r["compiled"]]
    assert not failed, failed
    kernels = {r["kernel"] for r in available}
    assert {"decode_blocks", "decode_tiles", "decode_merge", "extend", "kv_store", "gather_kv", "prologue"} <= kernels
    for target in {r["target"] for r in available}:  # every kernel on every target, the Hopper one on sm_90
        want = kernels - ({"decode_hopper"} if target != "sm_90" else set())
        assert {r["kernel"] for r in available if r["target"] == target} == want, target
    bytes_fp8 = {(r["target"], r["kernel"]) for r in available
                 if r["pool"] == "fp8" and r["target"] in ("sm_80", "sm_86")}
    assert {("sm_80", k) for k in ("decode_blocks", "decode_tiles", "extend", "gather_kv")} <= bytes_fp8


# ---------------------------------------------------------------------------------------------------------------
# gfx942's e4m3fn decodings, reproduced from its AMDGCN (no GPU, no Triton)
# ---------------------------------------------------------------------------------------------------------------

# The fp16 bits gfx942's sequence selects for the subnormal codes 0x01..0x07 (k * 2**-9)
GFX942_SUBNORMAL_HALVES = (0x1800, 0x1C00, 0x1E00, 0x2000, 0x2100, 0x2200, 0x2300)


def _halves(bits: torch.Tensor) -> torch.Tensor:
    """Unsigned 16-bit patterns (int32 0..65535) as the fp16 values they encode, in float32."""
    return torch.where(bits >= 0x8000, bits - 0x10000, bits).to(torch.int16).view(torch.float16).float()


def e4m3fn_to_fp16_like_gfx942(codes: torch.Tensor) -> torch.Tensor:
    """gfx942's e4m3fn -> fp16 code (Triton's software sequence for CDNA3), one step per instruction group:
        v_lshlrev_b16 t, 7, b; v_and_b32 t, 0x3f80, t; v_add_u16 t, 0x2000, t   exponent-mantissa to fp16's
                                                                                   place, exponent + 8 (15 - 7)
        v_cmp_ne_u16 0x7f / 0 and v_cndmask t = 0x7e00 / 0                      NaN (0x7F), zero
        v_cmp_ne_u16 k and v_cndmask t = SUBNORMAL[k], k = 1..7                   subnormals, from a table
        v_lshlrev_b16 s, 8, b; v_and_b32 s, 0xffff8000, s; v_or_b32 t, t, s       the sign
    (then v_cvt_f32_f16 where float32 is wanted: exact). Returns the fp16 values as float32."""
    b = codes.to(torch.int32)
    em = b & 0x7F
    t = ((b << 7) & 0x3F80) + 0x2000
    t = torch.where(em == 0x7F, 0x7E00, t)
    t = torch.where(em == 0, 0, t)
    for k, half in enumerate(GFX942_SUBNORMAL_HALVES, start=1):
        t = torch.where(em == k, half, t)
    return _halves(t | ((b << 8) & 0x8000))


def e4m3fn_to_bf16_like_gfx942(codes: torch.Tensor) -> torch.Tensor:
    """gfx942's e4m3fn -> bf16 code:
        v_lshlrev_b16 h, 8, b; v_lshlrev_b32 w, 12, h; v_and_b32 w, 0x7f00000, w  exponent-mantissa at float32's
                                                                                    exponent's low bits: 2**(e-127)
        v_mul_f32 w, 0x7b800000, w                                                  times 2**120: 2**(e - 7), with
                                                                                    fp32 denormals kept (mode 3)
        v_lshrrev_b32 w, 16, w; v_and_or_b32 r, h, 0x8000, w                        bf16 bits (exact), the sign
    No step looks for 0x7F. Returns the bf16 values as float32."""
    b = codes.to(torch.int32)
    magnitude = ((b & 0x7F) << 20).view(torch.float32).double() * 2.0 ** 120  # exact (float64 keeps denormals)
    top = magnitude.float().view(torch.int32) >> 16
    bits = top | ((b << 8) & 0x8000)
    return torch.where(bits >= 0x8000, bits - 0x10000, bits).to(torch.int16).view(torch.bfloat16).float()


def codes_decoded_differently(got: torch.Tensor, want: torch.Tensor) -> list:
    """The byte codes whose values differ (a NaN matches a NaN; -0 does not match +0)."""
    same = ((got == want) & (torch.signbit(got) == torch.signbit(want))) | (torch.isnan(got) & torch.isnan(want))
    return (~same).nonzero().flatten().tolist()


ALL_CODES = torch.arange(256, dtype=torch.uint8)
E4M3FN = ALL_CODES.view(torch.float8_e4m3fn).float()  # the pool's format (SGLang's float8_e4m3fn)


def test_gfx942_fp16_sequence_decodes_every_e4m3fn_code():
    got = e4m3fn_to_fp16_like_gfx942(ALL_CODES)
    assert codes_decoded_differently(got, E4M3FN) == []
    # the cases that differ between the formats are among them
    assert torch.isnan(got[[0x7F, 0xFF]]).all() and got[0x80] == 0 and torch.signbit(got[0x80])
    assert got[0x7E] == 448 and got[0x01] == 2.0 ** -9 and got[0x08] == 2.0 ** -6


def test_gfx942_bf16_sequence_reads_the_nan_codes_as_480():
    got = e4m3fn_to_bf16_like_gfx942(ALL_CODES)
    assert codes_decoded_differently(got, E4M3FN) == [0x7F, 0xFF]
    assert got[0x7F] == 480 and got[0xFF] == -480  # 1.875 * 2**8: the NaN bits read as a number
    assert got[0x80] == 0 and torch.signbit(got[0x80]) and got[0x01] == 2.0 ** -9  # -0, subnormals exact


def test_the_comparison_fails_on_the_fnuz_reading_and_on_flushed_subnormals():
    # what gfx942's native conversions (v_cvt_f32_fp8, v_cvt_pk_f32_fp8) give: the bytes read as e4m3fnuz
    fnuz = ALL_CODES.view(torch.float8_e4m3fnuz).float()
    wrong = codes_decoded_differently(fnuz, E4M3FN)
    assert 0x80 in wrong and torch.isnan(fnuz[0x80])  # e4m3fn's -0 is fnuz's only NaN
    assert 0x7F in wrong and fnuz[0x7F] == 240  # e4m3fn's NaN is fnuz's largest value
    finite = [c for c in range(256) if c not in (0x00, 0x80, 0x7F, 0xFF)]
    assert torch.equal(fnuz[finite] * 2, E4M3FN[finite])  # exponent bias 8 against 7: every other value halved
    assert wrong == list(range(1, 256))  # every code but 0x00, zero in both
    # a decoder that flushes subnormals to zero differs on exactly the 14 subnormal codes
    flushed = torch.where((ALL_CODES.int() & 0x78) == 0, E4M3FN * 0, E4M3FN)
    assert codes_decoded_differently(flushed, E4M3FN) == [*range(0x01, 0x08), *range(0x81, 0x88)]
