"""The Triton scale-offset function (``triton.device.scale_offsets``, the one copy every Triton kernel calls) gives
the same byte offsets as the Python ``ScaleLayout`` (``scale_layout.py``), in both of its forms: a vector of slots,
and one page-aligned tile's first slot plus ``0..BLOCK_N - 1``. Under TRITON_INTERPRET=1 on the CPU, tiny."""

import importlib
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("CPU interpreter tests", allow_module_level=True)

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402
from sglang_inkling_backend.triton import device  # noqa: E402

if not isinstance(device.scale_offsets, triton.runtime.interpreter.InterpretedFunction):
    device = importlib.reload(device)  # defined before TRITON_INTERPRET was set: define it again, interpreted


@triton.jit
def _slot_offsets(slots_ptr, out_ptr, N: tl.constexpr, HKV: tl.constexpr, NB: tl.constexpr, PAGE: tl.constexpr,
                  INTERLEAVED: tl.constexpr):
    h = tl.program_id(0)
    i = tl.arange(0, N)
    slots = tl.load(slots_ptr + i).to(tl.int64)
    tl.store(out_ptr + h * N + i, device.scale_offsets(slots, 0, h, HKV, NB, PAGE, INTERLEAVED))


@triton.jit
def _tile_offsets(out_ptr, BLOCK_N: tl.constexpr, HKV: tl.constexpr, NB: tl.constexpr, PAGE: tl.constexpr,
                  INTERLEAVED: tl.constexpr):
    tile = tl.program_id(0)
    h = tl.program_id(1)
    slot0 = (tile * BLOCK_N).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    tl.store(out_ptr + (h * tl.num_programs(0) + tile) * BLOCK_N + offs,
             device.scale_offsets(slot0, offs, h, HKV, NB, PAGE, INTERLEAVED))


@pytest.mark.parametrize("slots,hkv,d,page", [(256, 2, 64, 128), (384, 3, 128, 128), (96, 1, 32, 16),
                                              (128, 2, 256, 32), (512, 1, 128, 64)])
def test_triton_scale_offsets_equal_scale_layout(slots, hkv, d, page):
    layout = ScaleLayout.for_pool(slots, hkv, d, page)
    nb = d // 32
    want = layout.flat_index(torch.arange(slots))  # [slots, Hkv, NB]: every scale byte's offset
    assert torch.equal(want - want[..., :1], torch.arange(nb).expand_as(want))  # a slot's NB bytes are adjacent
    first = want[..., 0].T.contiguous()  # [Hkv, slots]: the offsets the kernels compute
    perm = torch.randperm(slots, generator=torch.Generator().manual_seed(slots + d))
    n = triton.next_power_of_2(slots)
    got = torch.full((hkv, n), -1, dtype=torch.int64)
    padded = torch.cat([perm, perm[: n - slots]]).to(torch.int32)  # a power-of-two vector of slots, any order
    _slot_offsets[(hkv,)](padded, got, N=n, HKV=hkv, NB=nb, PAGE=page, INTERLEAVED=layout.interleaved)
    assert torch.equal(got, first[:, padded.long()])
    block_n = min(page, 32)
    tiles = torch.full((hkv, slots // block_n, block_n), -1, dtype=torch.int64)
    _tile_offsets[(slots // block_n, hkv)](tiles, BLOCK_N=block_n, HKV=hkv, NB=nb, PAGE=page,
                                          INTERLEAVED=layout.interleaved)
    assert torch.equal(tiles.reshape(hkv, slots), first)
    # every byte of the buffer is named exactly once
    assert torch.equal(want.reshape(-1).sort().values, torch.arange(layout.num_bytes))
