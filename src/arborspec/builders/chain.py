"""Chain: classic speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

`budget` draft tokens sampled one after another, each from the
draft's distribution after the previous one; `max_depth`, when given, caps the
length too. A chain is a tree with one child per node (`topk` can only be 1),
so the `rejection` verifier is exactly the standard speculative sampling rule
(docs/algorithms.md §2). Children mode: sampled (without replacement, trivially).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.contracts import DraftContext, TreeBuilder
from ..engine.tree import TokenTree
from ..errors import ArborError
from .base import draw_children, require_positive
from .registry import register


@register
@dataclass(kw_only=True)
class ChainBuilder(TreeBuilder):
    budget: int = 4
    name = "chain"
    children_mode = "without_replacement"
    paper = "Leviathan et al. 2023 / Chen et al. 2023"

    def __post_init__(self) -> None:
        require_positive(budget=self.budget, max_depth=self.max_depth)
        if self.topk not in (None, 1):
            raise ArborError(f"a chain has one child per node: topk must be 1, got {self.topk}")

    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        tree = TokenTree.from_root(root_token, self.children_mode)
        node = 0
        for _ in range(self.depth_limit):
            kids = draw_children(ctx, tree, node, 1)
            if not kids:
                break
            node = kids[0]
        return tree
