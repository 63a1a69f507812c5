"""EAGLE-2 tree construction: expand by joint probability, then rerank (Li et al.
2024, "EAGLE-2", Sec. 4).

Expand phase: the root proposes its `topk` children; at each further layer the
`topk` nodes of the last layer with the largest joint probability (product of
draft probabilities along the path) are expanded, one batched draft forward
per layer, each proposing its own `topk` children. After `max_depth` layers,
the rerank phase keeps the `budget` nodes with the largest
joint probability over everything proposed (a valid subtree: see
`opt_tree.top_subtree`).

Here the draft is any `Drafter` (EAGLE's own feature-level draft head is not
part of arborspec). Children are *selected*: verify with `greedy` at
temperature 0 and `sample-match` above (docs/algorithms.md §2).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.contracts import DraftContext, TreeBuilder
from ..engine.tree import TokenTree
from .base import rank_nodes, require_positive, top_children
from .opt_tree import top_subtree
from .registry import register


@register
@dataclass(kw_only=True)
class Eagle2Builder(TreeBuilder):
    budget: int = 32  # N: nodes kept after reranking
    topk: int = 8  # children per expanded node, and nodes expanded per layer
    max_depth: int = 6  # expansion layers
    name = "eagle2"
    children_mode = "selected"
    paper = "Li et al. 2024, EAGLE-2 (Sec. 4: expansion and reranking)"

    def __post_init__(self) -> None:
        require_positive(budget=self.budget, topk=self.topk, max_depth=self.max_depth)

    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        work = TokenTree.from_root(root_token, self.children_mode)
        expand = [0]
        for layer in range(self.max_depth):
            new = top_children(ctx, work, expand, self.topk).add(work)
            if layer + 1 == self.max_depth or not new:
                break
            new_set = set(new)
            expand = [i for i in rank_nodes(work) if i in new_set][: self.topk]
        return top_subtree(work, self.budget, self.children_mode)
