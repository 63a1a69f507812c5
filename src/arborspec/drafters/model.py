"""`ModelDrafter`: draft logits from a Hugging Face draft model (the `Drafter` contract is in
`engine/contracts.py`).

The drafter follows the committed sequence across steps. Tree nodes are fed
depth by depth: one forward per call, with a tree mask over the draft's own KV
cache (docs/algorithms.md §4). After verification the accepted path's KV rows
are kept (compaction), the rest is cropped, and tokens the draft has not seen
yet are fed at the next `begin`.
"""

from __future__ import annotations

import copy

import torch

from ..common.timing import clock
from ..engine.adapter import ModelAdapter
from ..engine.contracts import Drafter
from ..engine.tree import TokenTree


def tree_rows_allowed(
    tree: TokenTree, nodes: list[int], base: int, past: int, row_of: dict[tuple[int, ...], int]
) -> tuple[torch.Tensor, list[tuple[int, ...]]]:
    """Attention pattern of a draft cache forward feeding `nodes` as rows `past, past + 1, ...`.

    Each row sees the committed rows `[0, base)`, the cache rows of its ancestors (`row_of`: token
    path -> cache row, filled as nodes are fed) and itself. Returns `[K, past + K]` bool
    and the nodes' paths.
    """
    k = len(nodes)
    allowed = torch.zeros(k, past + k, dtype=torch.bool)
    allowed[:, :base] = True
    paths = [tuple(tree.path_tokens(n)) for n in nodes]
    for row, path in enumerate(paths):
        for d in range(1, len(path)):
            # KeyError here = contract broken (ancestor not expanded)
            allowed[row, row_of[path[:d]]] = True
        allowed[row, past + row] = True
    return allowed, paths


class ModelDrafter(Drafter):
    """A Hugging Face draft model with its own KV cache, fed depth by depth."""

    def __init__(self, model) -> None:
        self.lm = ModelAdapter(model)
        self.vocab_size = self.lm.vocab_size
        self.slots: dict[tuple[int, ...], int] = {}  # token path from the root -> draft cache row
        self.base = 0  # committed tokens in the cache after `begin`

    def spawn(self) -> "ModelDrafter":
        twin = copy.copy(self)
        twin.lm = copy.copy(self.lm)  # the same model and LM head, a cache of its own
        twin.reset()
        return twin

    @property
    def max_positions(self) -> int:
        return self.lm.max_positions

    @property
    def cache_len(self) -> int:
        return self.lm.cache_len

    def reset(self) -> None:
        self.lm.reset()
        self.slots = {}

    def begin(self, committed: list[int]) -> torch.Tensor:
        self.forward_time, self.forwards = 0.0, 0
        if self.lm.cache_len >= len(committed):  # never expected, but keep the root's row fresh
            self.lm.crop_to(len(committed) - 1)
        pending = torch.tensor(committed[self.lm.cache_len :], dtype=torch.long)
        t0 = clock()
        logits = self.lm.prefill(pending)
        self._tick(t0)
        self.base = len(committed)
        self.slots = {(): self.base - 1}
        return logits

    def expand(self, tree: TokenTree, nodes: list[int]) -> torch.Tensor:
        past = self.lm.cache_len
        allowed, paths = tree_rows_allowed(tree, nodes, self.base, past, self.slots)
        positions = [self.base - 1 + tree.depths[n] for n in nodes]
        t0 = clock()
        logits = self.lm.nodes_forward([tree.tokens[n] for n in nodes], positions, allowed)
        self._tick(t0)
        for row, path in enumerate(paths):
            self.slots[path] = past + row
        return logits

    def commit(self, tree: TokenTree, accepted: list[int]) -> None:
        keep, path = [], ()
        for node in accepted:  # the accepted prefix whose KV the draft already holds
            path = path + (tree.tokens[node],)
            if path not in self.slots:
                break
            keep.append(self.slots[path])
        self.lm.compact(self.base, keep)
        self.slots = {}

    def _tick(self, t0: float) -> None:
        self.forward_time += clock(self.lm.device) - t0
        self.forwards += 1
