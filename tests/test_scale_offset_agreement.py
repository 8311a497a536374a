"""The scale-offset formula, once per language, gives the same offsets everywhere.

Where the UE8M0 scale byte of (slot, KV head, 32-channel block) lives: SGLang's interleaved layout
``[pages, Hkv, 32, page // 32, D // 32]`` at page size 128, flat ``[slots, Hkv, D // 32]`` otherwise. Its homes:
``ScaleLayout.flat_index`` (Python, the core), ``mlx.mxfp8_ops.scale_offsets`` (MLX ops) and
``inkling_scale_offset`` in ``mlx/metal/inkling_common.metal`` (Metal, called by every kernel that touches pool
scales). The Triton version is checked in the Triton tests. The Metal function runs here through a one-line probe
kernel: on the CPU under ``tools/check_metal_on_cpu`` (the Metal source compiled as C++, as in
tests/mlx_tests/test_mlx_metal_on_cpu.py), and on the real device when this is Apple silicon with Metal.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sglang_inkling_backend.scale_layout import INTERLEAVED_PAGE_SIZE, ROWS_PER_ATOM, ScaleLayout

ROOT = Path(__file__).resolve().parents[1]

# (num_slots, num_kv_heads, head_dim, page_size): the interleaved layout at several head counts and head sizes
# (1, 2, 3, 4 and 8 blocks per head), and the flat layout at page sizes 1 and 16.
SHAPES = [
    (256, 3, 128, 128),
    (512, 8, 64, 128),
    (384, 1, 256, 128),
    (1024, 2, 32, 128),
    (256, 2, 128, 1),
    (96, 4, 96, 16),
]
IDS = [f"slots{n}-hkv{h}-d{d}-page{p}" for n, h, d, p in SHAPES]

# The probe: one thread per (block, KV head, slot) writes what inkling_scale_offset returns.
PROBE_BODY = """\
const uint block = thread_position_in_grid.x;
const uint kv_head = thread_position_in_grid.y;
const uint i = thread_position_in_grid.z;
if (block >= uint(NUM_BLOCKS) || kv_head >= uint(NUM_KV_HEADS)) {
    return;
}
offsets[(i * uint(NUM_KV_HEADS) + kv_head) * uint(NUM_BLOCKS) + block] =
    inkling_scale_offset<PAGE_SIZE, NUM_KV_HEADS, NUM_BLOCKS>(uint(slots[i]), kv_head, block);
"""


def _slots(num_slots: int, page_size: int) -> torch.Tensor:
    """Every slot boundary that matters (atom rows, columns, pages, the last slot) and a seeded shuffle of all."""
    edges = {0, 1, ROWS_PER_ATOM - 1, ROWS_PER_ATOM, 2 * ROWS_PER_ATOM + 5, page_size - 1, page_size,
             page_size + ROWS_PER_ATOM + 1, num_slots - 1}
    edges = sorted(s for s in edges if 0 <= s < num_slots)
    shuffled = torch.randperm(num_slots, generator=torch.Generator().manual_seed(num_slots + page_size))
    return torch.cat([torch.tensor(edges), shuffled])


def _python_offsets(shape) -> tuple[torch.Tensor, torch.Tensor]:
    num_slots, hkv, d, page = shape
    slots = _slots(num_slots, page)
    return slots, ScaleLayout.for_pool(num_slots, hkv, d, page).flat_index(slots)


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_python_offsets_cover_the_buffer_once(shape):
    """Over all slots the offsets are a permutation of the buffer's bytes, and at page 128 each (page, head) owns
    one contiguous atom of 32 x 4 x D/32 bytes."""
    num_slots, hkv, d, page = shape
    layout = ScaleLayout.for_pool(num_slots, hkv, d, page)
    offsets = layout.flat_index(torch.arange(num_slots))
    assert sorted(offsets.reshape(-1).tolist()) == list(range(layout.num_bytes))
    if page == INTERLEAVED_PAGE_SIZE:
        atom = page * (d // 32)
        first_page_head0 = offsets[:page, 0].reshape(-1)
        assert (first_page_head0.min().item(), first_page_head0.max().item()) == (0, atom - 1)


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_mlx_ops_offsets_equal_python(shape):
    pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'mlx[cpu]' or '.[mlx]')")
    from sglang_inkling_backend.mlx import mxfp8_ops
    from sglang_inkling_backend.mlx.interop import from_torch, to_torch

    slots, expected = _python_offsets(shape)
    _, hkv, d, page = shape
    ours = to_torch(mxfp8_ops.scale_offsets(from_torch(slots.to(torch.int32)), hkv, d, page))
    assert ours.shape == expected.shape
    assert torch.equal(ours.long(), expected)


def _probe_spec(tmp_path: Path):
    from sglang_inkling_backend.mlx import metal_kernels as mk

    body = tmp_path / "scale_offset_probe.metal"
    body.write_text(PROBE_BODY)
    # An absolute body_file replaces METAL_SOURCE_DIR in the spec's path; the header is the shipped one.
    return mk.MetalKernelSpec(name="inkling_scale_offset_probe", body_file=str(body),
                              input_names=("slots",), output_names=("offsets",))


def _probe_launch(mx, slots: torch.Tensor, shape):
    from sglang_inkling_backend.mlx import metal_kernels as mk

    _, hkv, d, page = shape
    grid = (d // 32, hkv, len(slots))
    return mk.MetalLaunch(
        inputs=[mx.array(slots.to(torch.int32).numpy())],
        output_shapes=[(len(slots), hkv, d // 32)],
        output_dtypes=[mx.uint32],
        grid=grid,
        threadgroup=mk.threadgroup_for(grid),
        template=[("PAGE_SIZE", page), ("NUM_KV_HEADS", hkv), ("NUM_BLOCKS", d // 32)],
    )


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_metal_offsets_equal_python_on_the_cpu(shape, tmp_path):
    """The Metal source compiled as C++ under tools/check_metal_on_cpu (ASan + UBSan, two thread orders)."""
    mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'mlx[cpu]' or '.[mlx]')")
    sys.path.insert(0, str(ROOT / "tools" / "check_metal_on_cpu"))
    metal_cpu = pytest.importorskip("metal_cpu", reason="tools/check_metal_on_cpu is not in this checkout")
    if not metal_cpu.compiler_available():
        pytest.skip("no C++ compiler (g++) to build the Metal sources on the CPU")

    slots, expected = _python_offsets(shape)
    kernel = metal_cpu.CpuMetalKernel(_probe_spec(tmp_path), tmp_path / "build")
    (ours,) = kernel.checked_call(**_probe_launch(mx, slots, shape).kwargs())
    assert torch.equal(torch.from_numpy(ours.astype(np.int64)), expected)


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_metal_offsets_equal_python_on_the_device(shape, tmp_path):
    mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'mlx[cpu]' or '.[mlx]')")
    from sglang_inkling_backend.mlx import metal_kernels as mk

    if not mk.metal_available():
        pytest.skip("no Metal device here (mx.metal.is_available() is False); the CPU test above ran the source")
    slots, expected = _python_offsets(shape)
    (ours,) = mk.run_metal(_probe_spec(tmp_path), _probe_launch(mx, slots, shape))
    assert torch.equal(torch.from_numpy(np.array(ours).astype(np.int64)), expected)
