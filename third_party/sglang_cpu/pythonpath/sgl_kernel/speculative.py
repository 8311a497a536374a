"""``sgl_kernel.speculative`` of the CPU stand-in: NGRAM's verify metadata from its tree mask (SGLang 0.5.23 imports
it at module level on CPU: srt/../kernels/ops/speculative/reconstruct_tree.py)."""
import torch

from . import _record_call


def reconstruct_indices_from_tree_mask(tree_mask: torch.Tensor, verified_seq_len: torch.Tensor,
                                       positions: torch.Tensor, retrieve_index: torch.Tensor,
                                       retrieve_next_token: torch.Tensor, retrieve_next_sibling: torch.Tensor,
                                       batch_size: int, draft_token_num: int) -> None:
    """In place, per request b and node i (n = draft_token_num; ``tree_mask[b, i, j]``, row-major, marks j an
    ancestor of i; only j < i counts), as reconstruct_tree.py's Triton kernel:
    ``positions = verified_seq_len[b] + #ancestors``, ``retrieve_index = b * n + i``, ``retrieve_next_token`` the
    first child (-1: none), ``retrieve_next_sibling`` the next node of the same parent (-1: none, or a root)."""
    _record_call("reconstruct_indices_from_tree_mask")
    n = draft_token_num
    if batch_size == 0:
        return
    mask = tree_mask.reshape(-1)[:batch_size * n * n].view(batch_size, n, n).bool()
    below = torch.ones(n, n, dtype=torch.bool).tril(-1)  # [i, j]: j < i
    ancestors = mask & below
    node = torch.arange(n)
    depth = ancestors.sum(dim=2)
    positions.view(-1)[:batch_size * n] = (depth + verified_seq_len[:batch_size, None].to(torch.int64)).reshape(-1)
    retrieve_index.view(-1)[:batch_size * n] = torch.arange(batch_size * n)
    parent = torch.where(ancestors, node[None, None, :], -1).amax(dim=2)  # [b, i]
    first_child = torch.where(ancestors, node[None, :, None], n).amin(dim=1)  # [b, j]: smallest child row
    next_token = torch.where(first_child < n, first_child, -1)
    same = (parent[:, :, None] == parent[:, None, :]) & (node[:, None] > node[None, :])  # [b, k, i]: k after i
    first_sibling = torch.where(same, node[None, :, None], n).amin(dim=1)  # [b, i]
    next_sibling = torch.where((parent >= 0) & (first_sibling < n), first_sibling, -1)
    retrieve_next_token.view(-1)[:batch_size * n] = next_token.reshape(-1)
    retrieve_next_sibling.view(-1)[:batch_size * n] = next_sibling.reshape(-1)
