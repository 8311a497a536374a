"""SGLang's target-verify batch (speculative decoding: NGRAM's ``NgramVerifyInput``, EAGLE's verify input) as the
core's ``attention_inputs.SpecVerify``. Host-free (torch only): the backend hands in SGLang's tensors.

SGLang 0.5.23's verify step (``docs/studies/SGLANG_SPEC_HICACHE_STUDY.md`` section 3): each request has ``D =
spec_info.draft_token_num`` draft tokens, already in ``req_to_token`` after its ``seq_lens`` cached keys
(``forward_batch.seq_lens`` excludes them); ``spec_info.positions`` are ``seq_len + depth``; ``spec_info.custom_mask``
is bool, request after request, either the FULL layout (off CPU: a ``[D, seq_len + D]`` block per request, the
prefix columns all True, the last D the tree) or the tree alone (``[D, D]`` per request: on CPU, and EAGLE's
QLEN_ONLY mask where the target backend exposes its buffer).
"""
from __future__ import annotations

import torch

from sglang_inkling_backend.attention_inputs import SpecVerify
from sglang_inkling_backend.checks import is_int, require_tensor


def draft_count(spec_info) -> int:
    """``spec_info.draft_token_num`` as a positive int (ValueError naming it otherwise)."""
    d = getattr(spec_info, "draft_token_num", None)
    if not is_int(d) or d < 1:
        raise ValueError(f"a target-verify batch needs spec_info.draft_token_num, a positive int, got {d!r}")
    return d


def spec_verify_of(spec_info, seq_lens_host: torch.Tensor) -> SpecVerify:
    """The core's ``SpecVerify`` for a target-verify batch whose requests have ``seq_lens_host`` cached keys (host
    ints, the drafts excluded, as SGLang's ``seq_lens_cpu``). ValueError/TypeError naming what does not fit."""
    d = draft_count(spec_info)
    mask, positions = getattr(spec_info, "custom_mask", None), getattr(spec_info, "positions", None)
    for name, t in (("spec_info.custom_mask", mask), ("spec_info.positions", positions)):
        if isinstance(t, torch.Tensor):
            require_tensor(t, name)
    require_tensor(seq_lens_host, "seq_lens_host", "a 1-D tensor of cached keys per request")
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 1:
        raise TypeError(f"spec_info.custom_mask must be a 1-D bool tensor, got "
                        f"{f'{mask.dtype} {tuple(mask.shape)}' if isinstance(mask, torch.Tensor) else mask!r}")
    lens = [int(x) for x in seq_lens_host.tolist()]
    bs = len(lens)
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1 or positions.numel() != bs * d \
            or positions.is_floating_point():
        raise ValueError(f"spec_info.positions must hold one integer position per draft token ({bs} x {d}), got "
                         f"{tuple(positions.shape) if isinstance(positions, torch.Tensor) else positions!r}")
    full = sum(d * (n + d) for n in lens)
    if mask.numel() == bs * d * d:  # the tree alone (SGLang on CPU; EAGLE's QLEN_ONLY mask)
        tree = mask
    elif mask.numel() == full:  # FULL: [D, seq_len + D] per request; its last D columns are the tree
        tree = mask[full_layout_tree_index(seq_lens_host.to(mask.device), d)]
        # every prefix column True: the mask's True count less the trees' is D * sum(seq_lens) (one read)
        trues = torch.stack([mask.sum(), tree.sum()]).tolist()
        if trues[0] - trues[1] != d * sum(lens):
            host, start = mask.cpu(), 0
            for b, n in enumerate(lens):
                if not bool(host[start:start + d * (n + d)].view(d, n + d)[:, :n].all()):
                    raise ValueError(f"spec_info.custom_mask: request {b} hides part of its cached prefix from a "
                                     "draft; every draft sees the whole prefix")
                start += d * (n + d)
    else:
        raise ValueError(f"spec_info.custom_mask must hold {bs * d * d} (the trees) or {full} (FULL layout, "
                         f"[D, seq_len + D] per request) entries, got {mask.numel()}")
    depths = positions.cpu().long() - torch.tensor(lens, dtype=torch.int64).repeat_interleave(d)
    device = positions.device
    return SpecVerify(tree.to(device), (torch.arange(bs + 1) * d * d).to(device), depths.to(device))


def full_layout_tree_index(seq_lens: torch.Tensor, d: int) -> torch.Tensor:
    """Where each request's ``[D, D]`` tree lies in a FULL-layout mask (``[D, seq_len + D]`` per request, request
    after request) over requests of ``seq_lens`` cached keys: int64 ``[B * D * D]`` on ``seq_lens``' device, made
    there without reading it (a CUDA-graph refill gathers the trees with it)."""
    n = seq_lens.to(torch.int64)
    row = n + d  # one draft's row of the FULL layout
    start = torch.cumsum(d * row, 0) - d * row  # each request's first entry
    i = torch.arange(d, device=n.device, dtype=torch.int64)
    index = start.view(-1, 1, 1) + i.view(1, d, 1) * row.view(-1, 1, 1) + n.view(-1, 1, 1) + i.view(1, 1, d)
    return index.reshape(-1)
