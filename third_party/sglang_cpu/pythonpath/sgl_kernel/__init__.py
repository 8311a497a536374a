"""Pure-Python stand-in for the CPU build of ``sgl_kernel`` (SGLang 0.5.23, ``SGLANG_USE_CPU_ENGINE=1``, no AMX).

SGLang imports these 8 names at module level on its CPU path. None of them is called during plain
(non-speculative) generation. Six have a body that follows the semantics of SGLang's own Triton kernels (two for
every server, four for NGRAM's verify steps, with ``speculative.reconstruct_indices_from_tree_mask``); EAGLE's two
draft-tree ops raise. See ../../README.md.
"""
import ctypes
import os

import torch

__version__ = "0.0.0+inkling-cpu-stub"

# Set SGL_KERNEL_STUB_LOG=/path to record every call (used to check that serving never reaches the stub).
_CALL_LOG = os.environ.get("SGL_KERNEL_STUB_LOG")


def _record_call(name: str) -> None:
    if _CALL_LOG:
        with open(_CALL_LOG, "a") as f:
            f.write(name + "\n")


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """``req_to_token[req_pool_indices[i], start[i]:end[i]] = out_cache_loc[off_i : off_i + len_i]``
    (srt/mem_cache/allocation.py::assign_req_to_token_pool)."""
    _record_call("assign_req_to_token_pool_cpu")
    offset = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        length = end - start
        if length > 0:
            req_to_token[row, start:end] = out_cache_loc[offset:offset + length].to(req_to_token.dtype)
        offset += length


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor,
                                tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
    """For every buffer ``i`` (base pointer ``data_ptrs[i]``, row stride ``strides[i]`` bytes):
    ``row[tgt_loc[j]] = row[src_loc[j]]``."""
    _record_call("copy_all_layer_kv_cache_cpu")
    targets, sources = tgt_loc.tolist(), src_loc.tolist()
    for base, row_bytes in zip(data_ptrs.tolist(), strides.tolist()):
        for target, source in zip(targets, sources):
            ctypes.memmove(base + target * row_bytes, base + source * row_bytes, row_bytes)


def _speculative_only(name: str):
    def unavailable(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel CPU stand-in: {name} is used by speculative decoding only and is not implemented")
    unavailable.__name__ = name
    return unavailable


# Speculative decoding's CPU ops that NGRAM verify steps call (each after the Triton kernel of the same name in
# SGLang 0.5.23's kernels/ops/speculative/, whose semantics they follow); EAGLE's draft-tree ops still raise.
def fill_accept_out_cache_loc_cpu(accept_index: torch.Tensor, out_cache_loc: torch.Tensor,
                                  accept_out_cache_loc: torch.Tensor) -> None:
    """``accept_out_cache_loc[k] = out_cache_loc[accept_index[i]]`` for the k-th entry ``i`` of the flat
    ``accept_index`` that is not -1 (eagle.py fill_accept_out_cache_loc)."""
    _record_call("fill_accept_out_cache_loc_cpu")
    flat = accept_index.reshape(-1)
    kept = flat[flat != -1].to(torch.int64)
    accept_out_cache_loc[:kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor,
                          accept_stride: int) -> None:
    """``bonus_tokens[i] = accept_tokens.flat[accept_stride * i + accept_lens[i] - 1]`` (eagle.py fill_bonus_tokens)."""
    _record_call("fill_bonus_tokens_cpu")
    rows = torch.arange(accept_lens.numel())
    index = accept_stride * rows + accept_lens.to(torch.int64) - 1
    bonus_tokens[:] = accept_tokens.reshape(-1)[index].to(bonus_tokens.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """``out_cache_loc[off_i : off_i + len_i] = req_to_token[req_pool_indices[i], start[i]:end[i]]``, requests packed
    in order (cache_locs.py assign_extend_cache_locs)."""
    _record_call("assign_extend_cache_locs_cpu")
    offset = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        length = end - start
        if length > 0:
            out_cache_loc[offset:offset + length] = req_to_token[row, start:end].to(out_cache_loc.dtype)
        offset += max(length, 0)


def verify_tree_greedy_cpu(predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor,
                           candidates: torch.Tensor, retrive_index: torch.Tensor, retrive_next_token: torch.Tensor,
                           retrive_next_sibling: torch.Tensor, target_predict: torch.Tensor) -> None:
    """Greedy acceptance down a draft tree (spec_tree.py verify_tree_greedy_kernel_triton): per request, from the
    root, take the first child (in sibling order) whose draft token equals the target's prediction at the last
    accepted node, until none does or ``accept_index.shape[1] - 1`` drafts are accepted; ``predicts`` gets the
    target's token at every accepted node, ``accept_index`` the accepted nodes' flat indices (the root first),
    ``accept_token_num`` the number of accepted drafts."""
    _record_call("verify_tree_greedy_cpu")
    num_spec = accept_index.shape[1]
    target = target_predict.reshape(-1)
    for b in range(candidates.shape[0]):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, node = 0, 0
        for _ in range(1, num_spec):
            node = int(retrive_next_token[b, node])
            token = int(target[last])
            while node != -1 and int(candidates[b, node]) != token:
                node = int(retrive_next_sibling[b, node])
            if node == -1:
                break
            predicts[last] = token
            accepted += 1
            last = int(retrive_index[b, node])
            accept_index[b, accepted] = last
        accept_token_num[b] = accepted
        predicts[last] = target[last]


# Imported at module level on the CPU path; only EAGLE's draft steps call them.
assign_draft_cache_locs_contiguous_cpu = _speculative_only("assign_draft_cache_locs_contiguous_cpu")  # cache_locs.py
build_tree_kernel_efficient_cpu = _speculative_only("build_tree_kernel_efficient_cpu")  # spec_tree.py
