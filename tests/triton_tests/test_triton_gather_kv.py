"""``triton.gather_kv`` (the extend family's K/V gather) against ``PagedKV.read``, on the CPU under the Triton
interpreter: bit-exact for every pool format (MXFP8 and per-tensor fp8 values are exact in bf16; the per-tensor
scale is applied by the caller), and bad slots refused before anything is written."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton's jit

pytest.importorskip("triton")

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend.attention_inputs import PagedKV  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402
from sglang_inkling_backend.triton.gather_kv import gather_dtype, gather_kv  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SLOTS, HKV, D = 256, 2, 64


def make_pool(fmt, gen):
    # Scales spread over 2**-6 .. 2**6 per row, so MXFP8 blocks hold many different exponents.
    k = torch.randn(SLOTS, HKV, D, generator=gen) * torch.exp2(torch.randint(-6, 7, (SLOTS, 1, 1), generator=gen))
    v = torch.randn(SLOTS, HKV, D, generator=gen)
    k, v = k.to(DEV), v.to(DEV)
    if fmt == "mxfp8":
        layout = ScaleLayout.for_pool(SLOTS, HKV, D, 128)
        (kd, ks), (vd, vs) = mxfp8.quantize(k.bfloat16()), mxfp8.quantize(v.bfloat16())  # the torch reference
        k_scales, v_scales = layout.empty(DEV), layout.empty(DEV)
        slots = torch.arange(SLOTS, device=DEV)
        layout.scatter(k_scales, slots, ks)
        layout.scatter(v_scales, slots, vs)
        return PagedKV(kd, vd, k_scales, v_scales, layout)
    if fmt == "fp8":
        return PagedKV((k / 8).clamp(-448, 448).to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn), k_scale=8.0,
                       v_scale=0.5)
    return PagedKV(k.to(fmt), v.to(fmt))


@pytest.mark.parametrize("fmt", ["mxfp8", "fp8", torch.bfloat16, torch.float16])
def test_gather_equals_pool_read(fmt):
    gen = torch.Generator().manual_seed(3)
    pool = make_pool(fmt, gen)
    slots = torch.randperm(SLOTS, generator=gen)[:77].to(DEV)  # 77: not a multiple of the kernel's block
    k, v = gather_kv(pool, slots)
    assert k.dtype == v.dtype == gather_dtype(pool) and k.shape == (77, HKV, D)
    want_k, want_v = pool.read(slots)
    scale_k, scale_v = (pool.k_scale, pool.v_scale) if fmt == "fp8" else (1.0, 1.0)
    assert torch.equal(k.float() * scale_k, want_k)
    assert torch.equal(v.float() * scale_v, want_v)
    # The check can fail: one slot swapped gives different rows.
    swapped = slots.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    assert not torch.equal(gather_kv(pool, swapped)[0].float() * scale_k, want_k)


def test_gather_of_nothing_and_into_given_buffers():
    pool = make_pool("mxfp8", torch.Generator().manual_seed(4))
    k, v = gather_kv(pool, torch.empty(0, dtype=torch.int64, device=DEV))
    assert k.shape == (0, HKV, D)
    out = (torch.empty(5, HKV, D, dtype=torch.bfloat16, device=DEV), torch.empty(5, HKV, D, dtype=torch.bfloat16,
                                                                                  device=DEV))
    got = gather_kv(pool, torch.arange(5, device=DEV), out=out)
    assert got[0] is out[0] and torch.equal(out[0].float(), pool.read(torch.arange(5, device=DEV))[0])


@pytest.mark.parametrize("slots, error", [
    (torch.tensor([0, SLOTS]), ValueError),
    (torch.tensor([-1]), ValueError),
    (torch.tensor([0.0, 1.0]), TypeError),
    (torch.tensor([[0, 1]]), ValueError),
])
def test_bad_slots_refused_before_writing(slots, error):
    pool = make_pool(torch.bfloat16, torch.Generator().manual_seed(5))
    n = slots.numel()
    out = (torch.full((n, HKV, D), 7.0, dtype=torch.bfloat16, device=DEV),
           torch.full((n, HKV, D), 7.0, dtype=torch.bfloat16, device=DEV))
    with pytest.raises(error, match="slots"):
        gather_kv(pool, slots.to(DEV), out=out)
    assert bool((out[0] == 7).all()) and bool((out[1] == 7).all())


def test_bad_out_refused():
    pool = make_pool("mxfp8", torch.Generator().manual_seed(6))
    with pytest.raises(ValueError, match=r"out\[0\] must be a contiguous torch.bfloat16"):
        gather_kv(pool, torch.arange(4, device=DEV), out=(torch.empty(4, HKV, D, device=DEV),) * 2)
