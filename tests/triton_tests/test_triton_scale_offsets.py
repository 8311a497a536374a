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


@pytest.mark.parametrize("slots,hkv,d", [(256, 2, 64), (384, 3, 128), (512, 1, 256)])
def test_gluon_tile_scale_offsets_equal_scale_layout(slots, hkv, d):
    """The Gluon Hopper kernel's own copy (``decode_hopper.tile_scale_offsets``: slot0 int32 from the page table, the
    page index widened to int64) gives ``ScaleLayout``'s offsets for every 128-slot tile. Gluon does not run under
    the interpreter, so its Python body runs here on torch tensors, ``gl.int64`` read as ``torch.int64``: the
    arithmetic is checked, Gluon's codegen is the GPU checks' (gpu_tests/check_triton_gpu.py, Hopper cases)."""
    import types

    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from sglang_inkling_backend.triton import decode_hopper

    body = decode_hopper.tile_scale_offsets.fn
    shim = types.SimpleNamespace(int64=torch.int64, constexpr=tl.constexpr)
    tile_scale_offsets = types.FunctionType(body.__code__, {**body.__globals__, "gl": shim})
    layout = ScaleLayout.for_pool(slots, hkv, d, 128)
    nb, page = d // 32, 128
    first = layout.flat_index(torch.arange(slots))[..., 0]  # [slots, Hkv]
    offs = torch.arange(page, dtype=torch.int32)
    for h in range(hkv):
        for slot0 in range(0, slots, page):
            got = tile_scale_offsets(torch.tensor(slot0, dtype=torch.int32), offs, h, hkv, nb, page)
            assert torch.equal(got, first[slot0: slot0 + page, h]), (slot0, h)
