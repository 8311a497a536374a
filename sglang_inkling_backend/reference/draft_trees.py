"""Draft trees for the verify references and their tests: a tree as parent pointers, and the mask and depths a
``attention_inputs.SpecVerify`` takes (``SpecVerify.from_trees``)."""
from __future__ import annotations

import torch


def tree_from_parents(parents: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask ``[n, n]`` (ancestors and self) and depths ``[n]`` from parent pointers (-1: the root)."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    depths = torch.zeros(n, dtype=torch.int64)
    for i in range(n):
        j, depth = i, 0
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
            depth += 1
        depths[i] = depth - 1
    return mask, depths


def random_parents(n: int, g: torch.Generator) -> list[int]:
    """A tree of ``n`` drafts as parent pointers (-1: the root, draft 0), each parent an earlier draft (BFS order,
    as SGLang's NGRAM sends them); drafts 1 and 2 are both children of the root, so every tree branches."""
    parents = [-1] + [0] * min(2, n - 1)
    parents += [int(torch.randint(0, i, (1,), generator=g)) for i in range(len(parents), n)]
    return parents


def random_tree(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return tree_from_parents(random_parents(n, g))


def chain_tree(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A chain of ``n`` drafts: a plain extend of the same tokens."""
    return torch.ones(n, n, dtype=torch.bool).tril(), torch.arange(n)
