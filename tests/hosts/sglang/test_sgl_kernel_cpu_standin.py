"""The test set-up's CPU ``sgl_kernel`` stand-in (third_party/sglang_cpu/pythonpath/sgl_kernel): its torch bodies of
NGRAM's speculative ops give the bytes of SGLang 0.5.23's own Triton kernels of the same names (run here under the
interpreter) on random draft trees, so the CPU server tests of speculation (integration/test_speculative_cpu.py)
run SGLang's semantics."""
from __future__ import annotations

import pytest
import torch

from sglang_inkling_backend.hosts.sglang.cpu_testing import prepare_sglang_cpu_import

prepare_sglang_cpu_import()
pytest.importorskip("sglang")

import sgl_kernel  # noqa: E402  (the stand-in: prepare_sglang_cpu_import puts it first on sys.path)
from sgl_kernel.speculative import reconstruct_indices_from_tree_mask  # noqa: E402
from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs  # noqa: E402
from sglang.kernels.ops.speculative.eagle import fill_accept_out_cache_loc, fill_bonus_tokens  # noqa: E402
from sglang.kernels.ops.speculative.reconstruct_tree import reconstruct_indices_from_tree_mask_triton  # noqa: E402
from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton  # noqa: E402

BS, N, SPEC = 3, 7, 4  # requests, draft tokens per request (the root included), most tokens accepted per step


def random_trees(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``BS`` trees of ``N`` nodes in BFS-like order (each node's parent comes before it) as SGLang's mask (node i
    sees its ancestors and itself), and the cached lengths before them."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(BS, N, N, dtype=torch.bool)
    for b in range(BS):
        mask[b, 0, 0] = True
        for i in range(1, N):
            parent = int(torch.randint(0, i, (1,), generator=g))
            mask[b, i] = mask[b, parent]
            mask[b, i, i] = True
    return mask.reshape(-1), torch.randint(5, 50, (BS,), generator=g)


def reconstructed(fn, mask, seq_lens):
    out = [torch.full((BS * N,), -7, dtype=torch.int64) for _ in range(4)]
    fn(mask, seq_lens, *out, BS, N)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_tree_metadata_and_greedy_acceptance_match_sglangs_triton_kernels(seed):
    mask, seq_lens = random_trees(seed)
    ours = reconstructed(reconstruct_indices_from_tree_mask, mask, seq_lens)
    theirs = reconstructed(reconstruct_indices_from_tree_mask_triton, mask, seq_lens)
    for name, a, b in zip(("positions", "retrieve_index", "next_token", "next_sibling"), ours, theirs):
        assert torch.equal(a, b), name
    positions, index, next_token, next_sibling = (t.view(BS, N) for t in ours)
    assert (next_sibling >= 0).any() and (next_token >= 0).any()  # real trees: branches and depth

    g = torch.Generator().manual_seed(100 + seed)
    candidates = torch.randint(0, 2, (BS, N), generator=g)  # a 2-token vocabulary: many drafts match
    target = torch.randint(0, 2, (BS, N), generator=g)
    results = []
    for fn in (sgl_kernel.verify_tree_greedy_cpu, verify_tree_greedy_triton):
        predicts = torch.full((BS * N,), -1, dtype=torch.int32)
        accept_index = torch.full((BS, SPEC), -1, dtype=torch.int32)
        accept_num = torch.full((BS,), -1, dtype=torch.int32)
        if fn is verify_tree_greedy_triton:
            fn(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, candidates=candidates,
               retrieve_index=index, retrieve_next_token=next_token, retrieve_next_sibling=next_sibling,
               target_predict=target)
        else:
            fn(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, candidates=candidates,
               retrive_index=index, retrive_next_token=next_token, retrive_next_sibling=next_sibling,
               target_predict=target)
        results.append((predicts, accept_index, accept_num))
    for name, a, b in zip(("predicts", "accept_index", "accept_token_num"), *results):
        assert torch.equal(a, b), name
    assert int(results[0][2].sum()) > 0  # some drafts were accepted: the walk down the tree was compared


def test_cache_location_ops_match_sglangs_triton_kernels():
    g = torch.Generator().manual_seed(0)
    req_to_token = torch.randint(0, 1000, (5, 64), generator=g, dtype=torch.int32)
    rows = torch.tensor([3, 0, 4])
    start, end = torch.tensor([10, 0, 30]), torch.tensor([17, 7, 37])
    ours = torch.full((21,), -1, dtype=torch.int64)
    theirs = ours.clone()
    sgl_kernel.assign_extend_cache_locs_cpu(rows, req_to_token, start, end, ours, req_to_token.shape[1])
    assign_extend_cache_locs[(3,)](rows, req_to_token, start, end, theirs, req_to_token.shape[1], 4)
    assert torch.equal(ours, theirs) and int(ours.min()) >= 0

    accept_index = torch.tensor([[0, 2, -1], [3, -1, -1], [6, 7, 8]], dtype=torch.int32)
    out_cache_loc = torch.arange(100, 109, dtype=torch.int64)
    ours, theirs = (torch.full((6,), -1, dtype=torch.int64) for _ in range(2))
    sgl_kernel.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, ours)
    fill_accept_out_cache_loc[(9,)](accept_index, out_cache_loc, theirs, 16)
    assert torch.equal(ours, theirs) and ours.tolist() == [100, 102, 103, 106, 107, 108]

    accept_tokens = torch.tensor([[5, 6, 7], [8, 9, 10]])
    accept_lens = torch.tensor([2, 3], dtype=torch.int32)
    ours, theirs = (torch.full((2,), -1, dtype=torch.int64) for _ in range(2))
    sgl_kernel.fill_bonus_tokens_cpu(accept_tokens, accept_lens, ours, 3)
    fill_bonus_tokens[(2,)](accept_tokens, accept_lens, theirs, 3)
    assert torch.equal(ours, theirs) and ours.tolist() == [6, 10]
