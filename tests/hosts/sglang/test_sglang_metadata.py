"""The inkling backend's metadata builder (host-free: no sglang import) against plain Python loops."""
import pytest
import torch

from types import SimpleNamespace

from sglang_inkling_backend.hosts.sglang.metadata import (DecodeGraphBuffers, VerifyGraphBuffers,
                                                          build_forward_metadata, window_start)
from sglang_inkling_backend.hosts.sglang.spec_verify import spec_verify_of
from sglang_inkling_backend.rails import gather_rails


def _req_to_token(max_reqs=6, width=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    # distinct slot ids per (row, position), like an allocator would hand out
    return torch.randperm(max_reqs * width, generator=g).reshape(max_reqs, width).to(torch.int32) + 1


def _expected_rail(req_to_token, row, start, end):
    return [int(x) for x in req_to_token[row, start:end]]


def _rail(rails, b):
    return [int(x) for x in rails.indices[int(rails.indptr[b]):int(rails.indptr[b + 1])]]


def test_decode_rails_mixed_lengths():
    r2t = _req_to_token()
    rows, seq_lens = torch.tensor([4, 0, 2]), torch.tensor([7, 1, 33])
    md = build_forward_metadata(r2t, rows, seq_lens, windows=[4, 16])
    assert md.is_decode and md.batch_size == 3
    assert md.qo_indptr.tolist() == [0, 1, 2, 3]
    for b in range(3):
        row, n = int(rows[b]), int(seq_lens[b])
        assert _rail(md.full, b) == _expected_rail(r2t, row, 0, n)
        for w in (4, 16):  # decode: the query is position n-1 and sees positions n-w .. n-1
            assert _rail(md.rails(w), b) == _expected_rail(r2t, row, max(0, n - w), n)
    assert md.rails(None) is md.full
    with pytest.raises(ValueError, match=r"window 8: no window rails for window 8 .* windows \[4, 16\]"):
        md.rails(8)


def test_extend_rails_with_prefix_hits_and_chunks():
    r2t = _req_to_token()
    rows = torch.tensor([1, 3, 5])
    prefix = torch.tensor([0, 10, 25])  # no prefix / a prefix-cache hit / an earlier chunk
    new = torch.tensor([9, 3, 8])
    seq_lens = prefix + new
    md = build_forward_metadata(r2t, rows, seq_lens, extend_seq_lens=new, windows=[5])
    assert not md.is_decode
    assert md.qo_indptr.tolist() == [0, 9, 12, 20]
    for b in range(3):
        row, n, q = int(rows[b]), int(seq_lens[b]), int(new[b])
        assert _rail(md.full, b) == _expected_rail(r2t, row, 0, n)
        # the first query (position n-q) sees back to n-q-4
        assert _rail(md.rails(5), b) == _expected_rail(r2t, row, max(0, n - q - 4), n)


def test_window_rails_translate_to_swa_slots_and_write_loc():
    r2t = _req_to_token(width=20)
    full_to_swa = torch.arange(r2t.numel() + 2, dtype=torch.int64) * 7 % 101
    rows, seq_lens = torch.tensor([2, 0]), torch.tensor([12, 5])
    out_cache_loc = r2t[rows, seq_lens - 1].long()
    md = build_forward_metadata(r2t, rows, seq_lens, windows=[3], full_to_swa=full_to_swa,
                                out_cache_loc=out_cache_loc)
    for b in range(2):
        row, n = int(rows[b]), int(seq_lens[b])
        assert _rail(md.full, b) == _expected_rail(r2t, row, 0, n)  # full rails stay in the full id space
        assert _rail(md.rails(3), b) == [int(full_to_swa[s]) for s in _expected_rail(r2t, row, n - 3, n)]
    assert md.swa_out_cache_loc.tolist() == full_to_swa[out_cache_loc].tolist()
    # a write slot past the map is refused by name (it was an IndexError from the indexing)
    past = out_cache_loc.clone()
    past[1] = full_to_swa.numel()
    with pytest.raises(ValueError, match=r"out_cache_loc \(the step's write slots\) must be slots in "
                                         r"\[0, 122\) \(the hybrid"):
        build_forward_metadata(r2t, rows, seq_lens, windows=[3], full_to_swa=full_to_swa, out_cache_loc=past)


def test_window_start():
    assert window_start(torch.tensor([10, 3, 10]), torch.tensor([1, 3, 4]), 4).tolist() == [6, 0, 3]
    with pytest.raises(ValueError, match="window must be >= 1"):
        window_start(torch.tensor([1]), torch.tensor([1]), 0)


def test_bad_input_is_rejected_naming_the_argument():
    r2t = _req_to_token(max_reqs=2, width=8)
    with pytest.raises(ValueError, match=r"seq_lens must lie in \[0, 8\]"):
        build_forward_metadata(r2t, torch.tensor([0]), torch.tensor([9]))
    with pytest.raises(ValueError, match=r"req_pool_indices must lie in \[0, 2\)"):
        build_forward_metadata(r2t, torch.tensor([2]), torch.tensor([3]))
    with pytest.raises(ValueError, match="same length"):
        build_forward_metadata(r2t, torch.tensor([0, 1]), torch.tensor([3]))
    with pytest.raises(ValueError, match=r"extend_seq_lens must lie in \[0, seq_len\]"):
        build_forward_metadata(r2t, torch.tensor([0]), torch.tensor([3]), extend_seq_lens=torch.tensor([4]))
    with pytest.raises(ValueError, match="decode seq_lens must be >= 1"):
        build_forward_metadata(r2t, torch.tensor([0]), torch.tensor([0]))
    with pytest.raises(ValueError, match="req_to_token must be 2-D"):
        gather_rails(r2t[0], torch.tensor([0]), torch.tensor([1]))


@pytest.mark.parametrize("host", [False, True])
@pytest.mark.parametrize("swa", [False, True])
def test_decode_graph_buffers_refill_in_place(swa, host):
    """Graph metadata equals the eager builder's, in the same storage every time; with the lengths on the host
    (``seq_lens_host``, SGLang's seq_lens_cpu) too."""
    r2t = _req_to_token(max_reqs=8, width=24, seed=3)
    full_to_swa = (torch.arange(r2t.numel() + 2) * 5 % 97) if swa else None
    buffers = DecodeGraphBuffers(max_bs=4, max_context_len=24, windows=[6], device="cpu", swa=swa)
    addresses = [t.data_ptr() for t in buffers.tensors()]
    batches = [
        (torch.tensor([3, 1, 7, 0]), torch.tensor([24, 2, 9, 1])),  # a full batch; row 0 is a padded row (len 1)
        (torch.tensor([5, 2]), torch.tensor([13, 6])),  # a smaller batch reusing the same storage
    ]
    for rows, seq_lens in batches:
        loc = r2t[rows, seq_lens - 1].long()
        md = buffers.refill(r2t, rows, seq_lens, full_to_swa=full_to_swa, out_cache_loc=loc,
                            seq_lens_host=seq_lens.clone() if host else None)
        eager = build_forward_metadata(r2t, rows, seq_lens, windows=[6], full_to_swa=full_to_swa, out_cache_loc=loc)
        assert [t.data_ptr() for t in buffers.tensors()] == addresses
        assert md.full.indptr.data_ptr() == buffers.full_indptr.data_ptr()
        assert md.qo_indptr.tolist() == eager.qo_indptr.tolist()
        for b in range(len(rows)):
            assert _rail(md.full, b) == _rail(eager.full, b)
            assert _rail(md.rails(6), b) == _rail(eager.rails(6), b)
        if swa:
            assert md.swa_out_cache_loc.tolist() == eager.swa_out_cache_loc.tolist()
            assert md.swa_out_cache_loc.data_ptr() == buffers.swa_out_cache_loc.data_ptr()
    with pytest.raises(ValueError, match="exceeds the graph buffers' max_bs 4"):
        buffers.refill(r2t, torch.arange(5), torch.ones(5, dtype=torch.int64), full_to_swa=full_to_swa,
                       out_cache_loc=torch.zeros(5, dtype=torch.int64))


def test_graph_buffers_with_host_lengths_read_only_the_host_lengths():
    """With seq_lens_host the rails come from the host's lengths alone (a device seq_lens of other values does not
    change them: nothing reads it back), and bad host lengths are refused naming seq_lens_host, before any refill."""
    r2t = _req_to_token(max_reqs=8, width=24, seed=4)
    buffers = DecodeGraphBuffers(max_bs=4, max_context_len=24, windows=[6], device="cpu", swa=False)
    rows, host = torch.tensor([3, 1, 7]), torch.tensor([24, 2, 9])
    md = buffers.refill(r2t, rows, torch.ones(3, dtype=torch.int64), seq_lens_host=host)
    eager = build_forward_metadata(r2t, rows, host, windows=[6])
    for b in range(3):
        assert _rail(md.full, b) == _rail(eager.full, b) and _rail(md.rails(6), b) == _rail(eager.rails(6), b)
    before = [t.clone() for t in buffers.tensors()]
    for bad, err, match in ((torch.tensor([24, 2]), ValueError, r"one entry per request \(3\), got 2"),
                            (torch.tensor([25, 2, 9]), ValueError, r"seq_lens_host must lie in \[1, 24\]"),
                            (torch.tensor([0, 2, 9]), ValueError, r"seq_lens_host must lie in \[1, 24\]"),
                            (torch.tensor([24.0, 2.0, 9.0]), TypeError, "seq_lens_host must be a 1-D int32/int64 CPU")):
        with pytest.raises(err, match=match):
            buffers.refill(r2t, rows, host, seq_lens_host=bad)
    assert all(torch.equal(a, b) for a, b in zip(before, buffers.tensors()))


def test_decode_graph_replay_view_with_padding_rows_writes_their_swa_slot_zero():
    """SGLang's replay view: 4 rows (2 of them padding, request 0 with one key) but out_cache_loc for the 2 real
    requests only. The real rows map through full_to_swa; the padding rows get SWA slot 0, also where an earlier
    batch left other values in the static buffer."""
    r2t = _req_to_token(max_reqs=8, width=24, seed=3)
    full_to_swa = torch.arange(r2t.numel() + 2) * 5 % 97 + 1  # no slot maps to 0 by itself
    buffers = DecodeGraphBuffers(max_bs=4, max_context_len=24, windows=[6], device="cpu", swa=True)
    rows, seq_lens = torch.tensor([3, 1, 0, 0]), torch.tensor([24, 2, 1, 1])
    loc = r2t[rows, seq_lens - 1].long()
    buffers.refill(r2t, rows, seq_lens, full_to_swa=full_to_swa, out_cache_loc=loc)  # a full batch first
    md = buffers.refill(r2t, rows, seq_lens, full_to_swa=full_to_swa, out_cache_loc=loc[:2])
    assert md.swa_out_cache_loc.tolist() == full_to_swa[loc[:2]].tolist() + [0, 0]
    before = [t.clone() for t in buffers.tensors()]
    for bad in (torch.zeros(5, dtype=torch.int64), torch.zeros(2, 1, dtype=torch.int64), None):
        with pytest.raises(ValueError, match="out_cache_loc must hold one slot per real request"):
            buffers.refill(r2t, torch.tensor([5, 2, 0, 0]), seq_lens, full_to_swa=full_to_swa, out_cache_loc=bad)
    assert all(torch.equal(a, b) for a, b in zip(before, buffers.tensors()))  # refused before any refill


def _verify_batch(r2t, rows, prefix, d, gen, layout, buffers=None, padding=0):
    """SGLang's TARGET_VERIFY view: ``rows`` real requests with ``prefix`` cached keys and ``d`` drafts each (in
    req_to_token after the prefix already), then ``padding`` rows (request row 0, seq_len 1, positions 0). The mask
    covers the real requests: FULL layout, the trees alone (qlen) or written into ``buffers``' own tree mask."""
    from sglang_inkling_backend.reference.draft_trees import random_tree
    trees = [random_tree(d, gen) for _ in rows]
    positions = torch.cat([p + dep for (_, dep), p in zip(trees, prefix)] + [torch.zeros(padding * d).long()])
    if layout == "full":
        mask = torch.cat([torch.cat([torch.ones(d, p, dtype=torch.bool), m], 1).reshape(-1)
                          for (m, _), p in zip(trees, prefix)])
    else:
        mask = torch.cat([m.reshape(-1) for m, _ in trees])
        if layout == "own":
            buffers.tree_mask[:mask.numel()].copy_(mask)
            mask = buffers.tree_mask
    all_rows = torch.tensor(list(rows) + [0] * padding)
    seq_lens = torch.tensor(list(prefix) + [1] * padding)
    return trees, all_rows, seq_lens, positions, mask


@pytest.mark.parametrize("layout", ["full", "qlen", "own"])
@pytest.mark.parametrize("swa", [False, True])
def test_verify_graph_buffers_refill_matches_the_eager_verify_metadata(swa, layout):
    """A verify graph's metadata (padding rows included) gives the real requests the eager verify step's rails
    (over prefix + D keys; each window over its last w + D - 1), trees and depths, in the same storage every time,
    from any of the three mask layouts SGLang sends; padding rows get depth 0 and SWA write slot 0."""
    d, w = 3, 6
    r2t = _req_to_token(max_reqs=8, width=40, seed=5)
    full_to_swa = (torch.arange(r2t.numel() + 2) * 5 % 97 + 1) if swa else None
    buffers = VerifyGraphBuffers(max_bs=4, draft_len=d, max_context_len=40, windows=[w], device="cpu", swa=swa)
    addresses = [t.data_ptr() for t in buffers.tensors()]
    gen = torch.Generator().manual_seed(0)
    for rows, prefix, padding in (([3, 1, 7, 2], [30, 2, 9, 14], 0), ([5, 2], [13, 1], 2)):
        trees, all_rows, seq_lens, positions, mask = _verify_batch(r2t, rows, prefix, d, gen, layout, buffers,
                                                                   padding)
        real = len(rows)
        keys = torch.tensor(prefix) + d
        loc = torch.cat([r2t[r, p:p + d] for r, p in zip(rows, prefix)]).long()
        md = buffers.refill(r2t, all_rows, seq_lens, positions, mask, num_real=real, seq_lens_host=seq_lens.clone(),
                            full_to_swa=full_to_swa, out_cache_loc=loc if swa else None)
        eager = build_forward_metadata(r2t, torch.tensor(rows), keys, extend_seq_lens=torch.full((real,), d),
                                       windows=[w], full_to_swa=full_to_swa, out_cache_loc=loc)
        eager_verify = spec_verify_of(SimpleNamespace(draft_token_num=d, positions=positions[:real * d],
                                                      custom_mask=mask[:real * d * d] if layout == "own" else mask),
                                      torch.tensor(prefix))
        assert [t.data_ptr() for t in buffers.tensors()] == addresses
        assert not md.is_decode and md.graph and md.batch_size == real + padding
        assert md.qo_indptr.tolist() == [i * d for i in range(real + padding + 1)]
        for b in range(real):
            assert _rail(md.full, b) == _rail(eager.full, b) == [int(x) for x in r2t[rows[b], :prefix[b] + d]]
            assert _rail(md.rails(w), b) == _rail(eager.rails(w), b)
            assert len(_rail(md.rails(w), b)) == min(prefix[b] + d, w + d - 1)
        v = md.verify
        assert v.uniform_len == d and v.draft_lens == (d,) * (real + padding)
        assert torch.equal(v.tree_mask[:real * d * d], eager_verify.tree_mask)
        assert torch.equal(v.depths[:real * d], eager_verify.depths)
        assert torch.equal(v.depths[:real * d], torch.cat([dep for _, dep in trees]))
        assert v.depths[real * d:].tolist() == [0] * (padding * d)
        assert v.mask_indptr.tolist() == [i * d * d for i in range(real + padding + 1)]
        if swa:
            assert md.swa_out_cache_loc.tolist() == eager.swa_out_cache_loc.tolist() + [0] * (padding * d)


def test_verify_graph_buffers_refuse_bad_batches_before_writing_and_keep_trees_at_capture():
    """Each bad verify batch is refused naming what is wrong, the buffers untouched; the capture (no mask: SGLang's
    all-True capture mask is not a batch's) leaves the trees as they are, and a swapped tree changes them."""
    d = 3
    r2t = _req_to_token(max_reqs=8, width=40, seed=6)
    buffers = VerifyGraphBuffers(max_bs=4, draft_len=d, max_context_len=40, windows=[6], device="cpu", swa=False)
    gen = torch.Generator().manual_seed(1)
    trees, rows, seq_lens, positions, mask = _verify_batch(r2t, [3, 1], [20, 5], d, gen, "full")
    chain = buffers.tree_mask.clone()
    buffers.refill(r2t, rows, seq_lens, positions, None, num_real=2, seq_lens_host=seq_lens.clone())
    assert torch.equal(buffers.tree_mask, chain)  # the capture keeps the chains it was built with
    md = buffers.refill(r2t, rows, seq_lens, positions, mask, num_real=2, seq_lens_host=seq_lens.clone())
    assert not torch.equal(md.verify.tree_mask, chain[:2 * d * d])
    before = [t.clone() for t in buffers.tensors()]
    host = seq_lens.clone()
    for args, kwargs, err, match in (
            ((r2t, rows, seq_lens, positions, mask[:-1]), {}, ValueError, r"must hold 18 \(the real requests' "
             r"trees\) or 93 \(FULL layout"),
            ((r2t, rows, seq_lens, positions, mask.int()), {}, TypeError, "verify mask must be a 1-D bool tensor"),
            ((r2t, rows, seq_lens, positions[:-1], mask), {}, ValueError, r"positions must be a 1-D integer tensor "
             r"of at least 2 x 3"),
            ((r2t, torch.arange(5), torch.ones(5).long(), torch.zeros(15).long(), None), {"seq_lens_host": None},
             ValueError, r"the graph buffers hold 1 to 4 \(max_bs\)"),
            ((r2t, rows, seq_lens, positions, mask), {"num_real": 3}, ValueError, r"num_real must be an int in "
             r"\[0, 2\]"),
            ((r2t, rows, seq_lens, positions, mask), {"seq_lens_host": torch.tensor([38, 5])}, ValueError,
             r"seq_lens_host must lie in \[1, 37\]"),
            ((r2t, rows, seq_lens, positions, mask), {"full_to_swa": torch.arange(400)}, ValueError,
             "full_to_swa must be given exactly when")):
        kwargs = {"num_real": 2, "seq_lens_host": host, **kwargs}
        with pytest.raises(err, match=match):
            buffers.refill(*args, **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(before, buffers.tensors()))
    swa_buffers = VerifyGraphBuffers(max_bs=4, draft_len=d, max_context_len=40, windows=[6], device="cpu", swa=True)
    with pytest.raises(ValueError, match=r"out_cache_loc must hold the real requests' 2 x 3 write slots"):
        swa_buffers.refill(r2t, rows, seq_lens, positions, mask, num_real=2, seq_lens_host=host,
                           full_to_swa=torch.arange(400), out_cache_loc=torch.zeros(5).long())
    with pytest.raises(ValueError, match="draft_len .* must be below max_context_len"):
        VerifyGraphBuffers(max_bs=4, draft_len=40, max_context_len=40, windows=[], device="cpu", swa=False)


@pytest.mark.parametrize("page_size", [None, 8])
def test_the_batchs_entries_are_checked_against_the_pool_with_rails_or_a_page_table(page_size):
    """Eager decode metadata checks each request's first seq_lens entries of req_to_token against the pool's slots,
    whether the step reads rails or a page table (which gathers no rails: the entries are read masked): an entry the
    batch reads past the pool is refused, one past a request's length or in a row the batch does not use is not."""
    r2t = _req_to_token()
    num_slots = int(r2t.max()) + 1
    rows, seq_lens = torch.tensor([4, 0, 2]), torch.tensor([7, 1, 33])
    kw = dict(page_size=page_size, max_seq_len=40) if page_size else {}
    r2t[4, 7:] = 10 ** 6  # past request 0's 7 keys: never read
    r2t[1, :] = -5  # a row no request of the batch uses
    build_forward_metadata(r2t, rows, seq_lens, num_slots=num_slots, **kw)
    for row, col, value in ((2, 32, num_slots), (0, 0, -1), (4, 6, 10 ** 6)):  # each a key some request reads
        bad = r2t.clone()
        bad[row, col] = value
        with pytest.raises(ValueError, match=rf"must be slots of the KV pool in \[0, {num_slots}\), got"):
            build_forward_metadata(bad, rows, seq_lens, num_slots=num_slots, **kw)
