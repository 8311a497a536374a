"""The Triton rail-slot gather (``triton.gather_rail_slots``, the route's ``gather_rail_slots``) inside
``rails.gather_rails_host_lengths`` against that function's torch gather: the same indptr and slots, written into the
same graph buffers, for full rails and windows, requests longer than one program's block, int32 and int64 rows."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton's jit

pytest.importorskip("triton")

from sglang_inkling_backend import rails  # noqa: E402
from sglang_inkling_backend.triton.gather_rails import BLOCK, gather_rail_slots  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def gather_rails_host_lengths(*args, **kwargs):
    """The core function with the kernel gathering the slots (what the Triton route's graph metadata runs)."""
    return rails.gather_rails_host_lengths(*args, **kwargs, gather_slots=gather_rail_slots)


def table(reqs, width, gen):
    return torch.randint(1, 1 << 20, (reqs, width), generator=gen, dtype=torch.int32).to(DEV)


@pytest.mark.parametrize("window", [None, 300])
@pytest.mark.parametrize("rows_dtype", [torch.int64, torch.int32])
def test_same_rails_as_the_torch_gather(window, rows_dtype):
    gen = torch.Generator().manual_seed(5)
    req_to_token = table(6, BLOCK + 700, gen)
    rows = torch.tensor([4, 0, 5, 2], dtype=rows_dtype).to(DEV)
    seq_lens = torch.tensor([BLOCK + 650, 1, 37, BLOCK], dtype=torch.int64)  # past one program's block, and one key
    start = None if window is None else rails.window_start(seq_lens, torch.ones_like(seq_lens), window)
    buffers = [(torch.full((9,), -7, dtype=torch.int64, device=DEV),
                torch.full((4 * (BLOCK + 700),), -7, dtype=torch.int64, device=DEV)) for _ in range(2)]
    got = gather_rails_host_lengths(req_to_token, rows, seq_lens, start, out_indptr=buffers[0][0],
                                    out_indices=buffers[0][1])
    want = rails.gather_rails_host_lengths(req_to_token, rows, seq_lens, start, out_indptr=buffers[1][0],
                                           out_indices=buffers[1][1])
    assert got.indptr.data_ptr() == buffers[0][0].data_ptr() and got.indices.data_ptr() == buffers[0][1].data_ptr()
    assert torch.equal(buffers[0][0], buffers[1][0]) and torch.equal(buffers[0][1], buffers[1][1])
    nnz = int(want.indptr[-1])
    assert nnz == (2 * BLOCK + 688 if window is None else 300 + 1 + 37 + 300)
    assert int((buffers[0][1] == -7).sum()) == buffers[0][1].numel() - nnz  # nothing written past the rails
    fresh = gather_rails_host_lengths(req_to_token, rows, seq_lens, start)  # without buffers: new tensors
    assert torch.equal(fresh.indices, want.indices[:nnz]) and torch.equal(fresh.indptr, want.indptr)


def test_a_strided_table_reads_the_same_slots():
    """A table that is a view with a column stride (e.g. every other column of a wider one) is read through it."""
    gen = torch.Generator().manual_seed(8)
    wide = table(3, 2 * 300, gen)
    req_to_token = wide[:, ::2]
    rows, seq_lens = torch.tensor([2, 0]).to(DEV), torch.tensor([300, 17])
    got = gather_rails_host_lengths(req_to_token, rows, seq_lens)
    want = rails.gather_rails_host_lengths(req_to_token, rows, seq_lens)
    assert torch.equal(got.indices, want.indices) and got.indices.numel() == 317


def test_a_wrong_slot_would_show():
    """The comparison can fail: a table changed after the torch gather gives other slots."""
    gen = torch.Generator().manual_seed(6)
    req_to_token = table(2, 64, gen)
    rows, seq_lens = torch.tensor([1, 0]).to(DEV), torch.tensor([40, 9])
    want = rails.gather_rails_host_lengths(req_to_token, rows, seq_lens)
    req_to_token[0, 3] += 1
    got = gather_rails_host_lengths(req_to_token, rows, seq_lens)
    assert int((got.indices != want.indices).sum()) == 1


def test_buffers_too_small_are_refused_before_writing():
    req_to_token = table(2, 64, torch.Generator().manual_seed(7))
    indptr, indices = torch.zeros(3, dtype=torch.int64, device=DEV), torch.zeros(10, dtype=torch.int64, device=DEV)
    with pytest.raises(ValueError, match=r"out_indptr / out_indices too small: need >= 3 and >= 49 entries"):
        gather_rails_host_lengths(req_to_token, torch.tensor([1, 0]).to(DEV), torch.tensor([40, 9]),
                                  out_indptr=indptr, out_indices=indices)
    assert not indptr.any() and not indices.any()
