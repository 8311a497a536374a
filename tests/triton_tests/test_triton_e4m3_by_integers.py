"""The kernels' e4m3 path for GPUs without e4m3 conversions (sm_80/86: Triton has no fp8e4nv there), where an 8-bit
pool reaches the kernels as bytes and ``device.e4m3_bytes_to_float`` decodes it with integer operations:
- the decoder against torch's float8_e4m3fn over all 256 codes (NaNs included), and shown failing on a wrong one;
- decode (both Triton kernels: rails and page table), extend and the gather with ``INKLING_E4M3_BY_INTEGERS=1``
  give bit-identical results to the native conversion, MXFP8 and per-tensor fp8;
- the kernels compile for sm_80 with the pool as bytes and not with float8e4nv (offline, no GPU: Triton's wheel
  carries ptxas)."""

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton's jit

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend import triton as kernels  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.rails import KVPages, KVRails  # noqa: E402
from sglang_inkling_backend.step_plans import DecodePlanCache  # noqa: E402
from sglang_inkling_backend.gpu.route import GpuRoute  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402
from sglang_inkling_backend.triton.device import e4m3_bytes_to_float  # noqa: E402
from sglang_inkling_backend.triton.gather_kv import gather_kv  # noqa: E402
from sglang_inkling_backend.triton.inputs import kv_data  # noqa: E402
from sglang_inkling_backend.triton.plan import E4M3_BY_INTEGERS_ENV, e4m3_by_integers  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
PAGE, HQ, HKV, D = 128, 4, 2, 64


@triton.jit
def decode_bytes_kernel(src, dst, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(dst + offs, e4m3_bytes_to_float(tl.load(src + offs)))


def test_the_decoder_over_all_256_codes():
    codes = torch.arange(256, dtype=torch.uint8, device=DEV)
    got = torch.empty(256, dtype=torch.float32, device=DEV)
    decode_bytes_kernel[(1,)](codes, got, N=256)
    want = codes.view(torch.float8_e4m3fn).float()
    nan = torch.isnan(want)
    assert nan.sum() == 2 and torch.equal(torch.isnan(got), nan)  # 0x7F and 0xFF
    assert torch.equal(got[~nan], want[~nan])  # subnormals (0x01..0x07), +-0 and 448 included
    # The comparison can fail: the same bits read one exponent off (times 128 instead of 256) differ.
    assert not torch.equal((got[~nan] / 2), want[~nan])


def make_pool(fmt, gen):
    slots = 4 * PAGE
    k = torch.randn(slots, HKV, D, generator=gen) * torch.exp2(torch.randint(-8, 8, (slots, 1, 1), generator=gen))
    v = torch.randn(slots, HKV, D, generator=gen)
    if fmt == "mxfp8":
        layout = ScaleLayout.for_pool(slots, HKV, D, PAGE)
        (kd, ks), (vd, vs) = mxfp8.quantize(k.bfloat16()), mxfp8.quantize(v.bfloat16())
        k_scales, v_scales = layout.empty(), layout.empty()
        layout.scatter(k_scales, torch.arange(slots), ks)
        layout.scatter(v_scales, torch.arange(slots), vs)
        return PagedKV(kd.to(DEV), vd.to(DEV), k_scales.to(DEV), v_scales.to(DEV), layout)
    return PagedKV((k / 4).clamp(-448, 448).to(torch.float8_e4m3fn).to(DEV), v.to(torch.float8_e4m3fn).to(DEV),
                   k_scale=4.0, v_scale=1.0)


def run_everything(pool, gen_seed):
    """Decode through rails (tile kernel) and a page table (block kernel), an extend and a gather."""
    gen = torch.Generator().manual_seed(gen_seed)
    lens = [150, 20]
    pages = torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)
    slots = torch.cat([(pages[b, t // PAGE] * PAGE + t % PAGE).view(1) for b, n in enumerate(lens) for t in range(n)])
    rails = KVRails(torch.tensor([0, lens[0], sum(lens)], device=DEV), slots.to(DEV))
    table = KVPages(pages.to(DEV), torch.tensor(lens, device=DEV), PAGE)
    q = torch.randn(2, HQ, D, generator=gen).bfloat16().to(DEV)
    params = AttentionParams(D ** -0.5, logit_cap=5.0)
    route = GpuRoute(kernels)
    outs = [route.decode(q, pool, keys, params, max_seq_len=150, plans=DecodePlanCache(), workspace=None)
            for keys in (rails, table)]
    qe = torch.randn(7, HQ, D, generator=gen).bfloat16().to(DEV)
    outs.append(route.extend(qe, pool, rails, torch.tensor([0, 4, 7], device=DEV), params, plans=DecodePlanCache()))
    outs.extend(gather_kv(pool, slots.to(DEV)))
    return outs


@pytest.mark.parametrize("fmt", ["mxfp8", "fp8"])
def test_integer_path_gives_the_native_paths_bits(fmt, monkeypatch):
    pool = make_pool(fmt, torch.Generator().manual_seed(3))
    monkeypatch.delenv(E4M3_BY_INTEGERS_ENV, raising=False)
    native = run_everything(pool, 5)
    monkeypatch.setenv(E4M3_BY_INTEGERS_ENV, "1")
    assert e4m3_by_integers(pool.k_buffer.device) and kv_data(pool)[0].dtype == torch.uint8
    by_integers = run_everything(pool, 5)
    assert len(native) == len(by_integers) == 5
    for a, b in zip(native, by_integers):
        assert torch.equal(a, b)


@pytest.mark.parametrize("fmt", ["mxfp8", "fp8"])
def test_no_e4m3_pointer_reaches_a_launch_on_the_integer_path(fmt, monkeypatch):
    """Triton refuses a float8e4nv pointer before sm_89 even when the kernel never reads it, so the per-tensor fp8
    pool's unused scale arguments must be bytes there too (a per-tensor fp8 decode, extend or gather on an A100
    would otherwise fail at its first launch: bench/results/current/compile-targets/README.md)."""
    from sglang_inkling_backend.triton.inputs import scale_args

    pool = make_pool(fmt, torch.Generator().manual_seed(4))
    monkeypatch.setenv(E4M3_BY_INTEGERS_ENV, "1")
    launched = [*kv_data(pool), *scale_args(pool)[:2]]
    assert [t.dtype for t in launched] == [torch.uint8] * 4
    monkeypatch.delenv(E4M3_BY_INTEGERS_ENV)
    if fmt == "fp8":  # natively the buffers go as they are
        assert scale_args(pool)[0].dtype == torch.float8_e4m3fn


def test_float_pools_are_never_passed_as_bytes(monkeypatch):
    monkeypatch.setenv(E4M3_BY_INTEGERS_ENV, "1")
    pool = PagedKV(torch.zeros(4, 1, 32, dtype=torch.bfloat16), torch.zeros(4, 1, 32, dtype=torch.bfloat16))
    assert kv_data(pool)[0].dtype == torch.bfloat16


COMPILE_SM80 = """
import sys
sys.path.insert(0, {tools!r})
import compile_sm90
kernel = compile_sm90.compile_decode(fmt="mxfp8", paged="blocks", block_n=32, warps=1, stages=3, arch=80,
                                     e4m3_bytes=True)
print("bytes: compiled", ".target sm_80" in kernel.asm["ptx"], len(kernel.asm["cubin"]) > 0)
try:
    compile_sm90.compile_decode(fmt="mxfp8", paged="blocks", block_n=32, warps=1, stages=3, arch=80)
    print("float8e4nv: compiled")
except Exception as err:
    print("float8e4nv:", "fp8e4nv not supported in this architecture" in str(err))
"""


def test_the_decode_block_kernel_compiles_for_sm80_only_with_the_pool_as_bytes():
    """Offline, in a fresh interpreter without TRITON_INTERPRET (this one's kernels are interpreted functions)."""
    import subprocess

    pytest.importorskip("triton.backends.nvidia")
    tools = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", COMPILE_SM80.format(tools=tools)], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bytes: compiled True True" in result.stdout, result.stdout
    assert "float8e4nv: True" in result.stdout, result.stdout  # the same kernel with the pool as float8e4nv does not
