"""Chain: classic speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

`gamma` draft tokens sampled one after another, each from the draft's
distribution after the previous one. A chain is a tree with one child per
node, so the `rejection` verifier is exactly the standard speculative
sampling rule. Children mode: sampled (without replacement, trivially).
"""

from __future__ import annotations

from dataclasses import dataclass

from .registry import register
from ..engine.tree import TokenTree
from .base import DraftContext, TreeBuilder, draw_children, require_positive


@register
@dataclass
class ChainBuilder(TreeBuilder):
    gamma: int = 4
    name = "chain"
    children_mode = "without_replacement"
    paper = "Leviathan et al. 2023 / Chen et al. 2023"

    def __post_init__(self) -> None:
        require_positive(gamma=self.gamma)

    @classmethod
    def from_budget(cls, budget: int, **params) -> "ChainBuilder":
        return cls(gamma=budget, **params)

    @property
    def max_depth(self) -> int:
        return self.gamma

    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        tree = TokenTree.from_root(root_token, self.children_mode)
        node = 0
        for _ in range(self.gamma):
            kids = draw_children(ctx, tree, node, 1)
            if not kids:
                break
            node = kids[0]
        return tree
