"""Pure-Python stand-in for the CPU build of ``sgl_kernel`` (SGLang 0.5.23, ``SGLANG_USE_CPU_ENGINE=1``, no AMX).

SGLang imports these 8 names at module level on its CPU path. None of them is called during plain
(non-speculative) generation; the two with a real body follow the semantics of SGLang's own Triton kernels,
the six speculative-decoding ones raise. See ../../README.md.
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


# Imported at module level on the CPU path; only speculative decoding (EAGLE / tree verify) calls them.
fill_accept_out_cache_loc_cpu = _speculative_only("fill_accept_out_cache_loc_cpu")  # kernels/ops/speculative/eagle.py
fill_bonus_tokens_cpu = _speculative_only("fill_bonus_tokens_cpu")  # kernels/ops/speculative/eagle.py
assign_draft_cache_locs_contiguous_cpu = _speculative_only("assign_draft_cache_locs_contiguous_cpu")  # cache_locs.py
assign_extend_cache_locs_cpu = _speculative_only("assign_extend_cache_locs_cpu")  # cache_locs.py
build_tree_kernel_efficient_cpu = _speculative_only("build_tree_kernel_efficient_cpu")  # spec_tree.py
verify_tree_greedy_cpu = _speculative_only("verify_tree_greedy_cpu")  # spec_tree.py
