"""SpecInfer: k independent draft sequences of length L (Miao et al. 2024, "SpecInfer").

The root's k children are i.i.d. draws *with replacement* from the draft
distribution (duplicates are kept as separate nodes, each the start of its own
sequence); every sequence then continues alone for L - 1 more tokens. Verified
by multi-round rejection *with replacement* (`rejection-wr`, ALGORITHMS.md §2).
One draft forward per depth, batched over the k sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .registry import register
from ..engine.tree import TokenTree
from .base import DraftContext, TreeBuilder, require_positive


@register
@dataclass
class SpecInferBuilder(TreeBuilder):
    k: int = 4
    length: int = 4
    name = "specinfer"
    children_mode = "with_replacement"
    paper = "Miao et al. 2024, SpecInfer (k independent sequences)"

    def __post_init__(self) -> None:
        require_positive(k=self.k, length=self.length)

    @classmethod
    def from_budget(cls, budget: int, k: int = 4, **params) -> "SpecInferBuilder":
        k = min(k, budget)
        return cls(k=k, length=max(1, budget // k), **params)

    @property
    def max_depth(self) -> int:
        return self.length

    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        tree = TokenTree.from_root(root_token, self.children_mode)
        frontier = self._draw(ctx, tree, 0, self.k)
        for _ in range(self.length - 1):
            ctx.probs(tree, frontier)  # one batched draft forward for the whole layer
            frontier = [kid for node in frontier for kid in self._draw(ctx, tree, node, 1)]
        return tree

    def _draw(self, ctx: DraftContext, tree: TokenTree, node: int, n: int) -> list[int]:
        probs = ctx.probs(tree, [node])[0]
        tree.child_dists[node] = probs
        draws = torch.multinomial(probs.to(ctx.generator.device), n, replacement=True, generator=ctx.generator)
        v = tree.values[node]
        return [tree.add(node, int(y), value=v * float(probs[y]), draft_prob=float(probs[y])) for y in draws.tolist()]
