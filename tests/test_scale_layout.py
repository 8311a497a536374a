"""Scale layout indices against the formulas written out by hand."""

import pytest
import torch

from sglang_inkling_backend.scale_layout import ScaleLayout


def test_interleaved_d128_p128_matches_the_512_byte_atom_formula():
    hkv, pages = 2, 3
    layout = ScaleLayout.for_pool(pages * 128, hkv, 128, 128)
    assert layout.interleaved and layout.shape == (3, 2, 32, 4, 4)
    slots = torch.arange(pages * 128)
    idx = layout.flat_index(slots)
    for s in [0, 1, 31, 32, 33, 127, 128, 200, 383]:
        page, po = s // 128, s % 128
        for h in range(hkv):
            for b in range(4):
                assert idx[s, h, b].item() == (page * hkv + h) * 512 + (po % 32) * 16 + (po // 32) * 4 + b
    # every byte of the buffer is addressed exactly once
    assert torch.equal(idx.reshape(-1).sort().values, torch.arange(layout.num_bytes))


def test_interleaved_d256_uses_eight_blocks_per_head():
    layout = ScaleLayout.for_pool(256, 1, 256, 128)
    assert layout.shape == (2, 1, 32, 4, 8)
    sf = torch.arange(layout.num_bytes, dtype=torch.int64).remainder(251).to(torch.uint8).reshape(layout.shape)
    slot = 128 + 70  # page 1, po 70: sf[1, 0, 70 % 32, 70 // 32, b]
    assert layout.gather(sf, torch.tensor([slot]))[0, 0].tolist() == sf[1, 0, 6, 2, :].tolist()


def test_flat_layout_for_other_page_sizes():
    layout = ScaleLayout.for_pool(64, 3, 64, 16)
    assert not layout.interleaved and layout.shape == (64, 3, 2)
    idx = layout.flat_index(torch.tensor([5]))
    assert idx[0].tolist() == [[30, 31], [32, 33], [34, 35]]


def test_scatter_then_gather_round_trips():
    layout = ScaleLayout.for_pool(256, 2, 128, 128)
    sf = layout.empty()
    slots = torch.tensor([3, 129, 255, 0])
    values = torch.randint(0, 255, (4, 2, 4), dtype=torch.uint8)
    layout.scatter(sf, slots, values)
    assert torch.equal(layout.gather(sf, slots), values)
    assert int((sf != 0).sum()) <= values.numel()


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="head_dim must be a multiple of 32"):
        ScaleLayout.for_pool(128, 1, 48, 128)
    with pytest.raises(ValueError, match="num_slots must be a multiple of page_size=128"):
        ScaleLayout.for_pool(130, 1, 128, 128)
    layout = ScaleLayout.for_pool(128, 1, 128, 128)
    with pytest.raises(ValueError, match=r"slots must be slots in \[0, 128\), got \[128, 128\]"):
        layout.flat_index(torch.tensor([128]))
    with pytest.raises(TypeError, match="slots must be int32 or int64"):
        layout.flat_index(torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"sf must have shape \(1, 1, 32, 4, 4\)"):
        layout.gather(torch.zeros(128, 1, 4, dtype=torch.uint8), torch.tensor([0]))
