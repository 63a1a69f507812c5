"""EAGLE-2 tree construction: expand by joint probability, then rerank (Li et al. 2024, "EAGLE-2", Sec. 4).

Expand phase: the root proposes its top-k children; at each further layer the
k nodes of the last layer with the largest joint probability (product of
draft probabilities along the path) are expanded, one batched draft forward
per layer, each proposing its own top-k children. After `depth` layers, the
rerank phase keeps the `budget` nodes with the largest joint probability over
everything proposed (a valid subtree: see `opt_tree.top_subtree`).

Here the draft is any `Drafter` (EAGLE's own feature-level draft head is not
part of arborspec). Children are *selected*: verify with `greedy` at
temperature 0 and `sample-match` above.
"""

from __future__ import annotations

from dataclasses import dataclass

from .registry import register
from ..engine.tree import TokenTree
from .base import DraftContext, TreeBuilder, require_positive
from .opt_tree import rank_nodes, top_subtree


def top_children(ctx: DraftContext, tree: TokenTree, nodes: list[int], k: int) -> list[int]:
    """Each of `nodes` proposes its own top-k children (one batched draft forward)."""
    probs = ctx.probs(tree, nodes).double().clamp_(max=1.0)  # [L, V]
    added = []
    for node, row in zip(nodes, probs):
        top = row.topk(min(k, int((row > 0).sum())))
        for p, y in zip(top.values.tolist(), top.indices.tolist()):
            added.append(tree.add(node, y, value=tree.values[node] * p, draft_prob=p))
    return added


@register
@dataclass
class Eagle2Builder(TreeBuilder):
    budget: int = 32  # N: nodes kept after reranking
    topk: int = 8  # children per expanded node, and nodes expanded per layer
    depth: int = 6  # expansion layers
    name = "eagle2"
    children_mode = "selected"
    paper = "Li et al. 2024, EAGLE-2 (Sec. 4: expansion and reranking)"

    def __post_init__(self) -> None:
        require_positive(budget=self.budget, topk=self.topk, depth=self.depth)

    @property
    def max_depth(self) -> int:
        return self.depth

    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        work = TokenTree.from_root(root_token, self.children_mode)
        expand = [0]
        for layer in range(self.depth):
            new = top_children(ctx, work, expand, self.topk)
            if layer + 1 == self.depth or not new:
                break
            new_set = set(new)
            expand = [i for i in rank_nodes(work) if i in new_set][: self.topk]
        return top_subtree(work, self.budget, self.children_mode)
