"""OPT-Tree: an adaptive draft tree maximising the expected acceptance length (Wang et
al. 2024, "OPT-Tree").

A node's score is `p_hat` = product of draft probabilities along its path, an
estimate of the probability that the target accepts the whole path; the
expected acceptance length of a tree is then `E(A) = 1 + sum of p_hat`.
With node budget n and threshold delta:

* layer by layer (one batched draft forward per layer), the n children of the
  last layer with the largest `p_hat` become the next layer (each node proposes
  its `topk` best children first; None: n, which loses nothing);
* after each layer `E = 1 + sum of the n largest p_hat in the tree so far`;
  growth stops when E gained less than delta (between mu = draft step / target
  step time, and 1) or at `max_depth`;
* the n nodes with the largest `p_hat` are kept.

One saving over the paper, exact for the result: a new layer node that is not
in the tree's current top n is not forwarded (the top-n bar only rises and its
descendants score lower still), so wide layers cost fewer draft rows.

With `auto=true` (`budget=auto`) the budget is a cap and the kept top-n is cut to the n
that best trades expected tokens against step time (the step's rate; builders/auto_size.py).

Children are *selected* by their own probability, not sampled: verify with
`greedy` at temperature 0 and `sample-match` above (the engine enforces it,
docs/algorithms.md §2). `grow()` also returns the E(A) history of the layers.

`top_subtree` (shared with EAGLE-2) ranks nodes by `(p_hat desc, depth asc)`:
`p_hat` never grows along a path (a product of factors <= 1, and IEEE
multiplication by a factor <= 1 never rounds up), so every node outranks its
descendants and any top-n prefix of the ranking is a valid subtree, ties included.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.contracts import DraftContext, TreeBuilder
from ..engine.cost import CostCurve
from ..engine.tree import ChildrenMode, TokenTree
from ..errors import ArborError
from .auto_size import auto_subtree, layer_to_draft, require_cost
from .base import rank_nodes, require_positive, top_children
from .registry import register


def top_subtree(tree: TokenTree, n: int, children_mode: ChildrenMode = "selected") -> TokenTree:
    """A new tree with the n best-ranked nodes of `tree` (a valid subtree; sibling order kept)."""
    out = tree.subtree(rank_nodes(tree)[:n])
    out.children_mode = children_mode
    return out


def best_children(
    ctx: DraftContext, tree: TokenTree, nodes: list[int], n: int, topk: int
) -> list[int]:
    """Add, over all `nodes`, the n children with the largest p_hat (each node proposing its topk
    best); one batched draft forward. Returns the new nodes, best first (each parent's
    children best first too)."""
    cands = top_children(ctx, tree, nodes, topk)
    if not cands.joint:
        return []
    best = torch.topk(
        torch.tensor(cands.joint, dtype=torch.float64), min(n, len(cands))
    ).indices.tolist()
    return cands.add(tree, best)


@dataclass
class OptTreeResult:
    """What one call of `OptTreeBuilder.grow` made: the tree, and E(A) after each
    layer (root alone: 1)."""

    tree: TokenTree
    history: list[float]


@register
@dataclass(kw_only=True)
class OptTreeBuilder(TreeBuilder):
    budget: int = 32  # n: nodes kept, and layer width
    max_depth: int = 12
    delta: float = 0.2  # stop when E(A) grows by less than this (the paper's best for a 68M draft)
    # budget=auto: keep the best-scoring top-n, n <= budget (builders/auto_size.py)
    auto: bool = False
    name = "opt-tree"
    children_mode = "selected"
    paper = "Wang et al. 2024, OPT-Tree (Alg. 1, Thm. 3.1-3.2)"

    def __post_init__(self) -> None:
        require_positive(budget=self.budget, max_depth=self.max_depth, topk=self.topk)
        if self.delta < 0:
            raise ArborError(f"delta must be >= 0, got {self.delta}")

    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        cost = require_cost(self.name, ctx.cost) if self.auto else None
        tree = self.grow(ctx, root_token, cost).tree
        return auto_subtree(tree, cost, ctx.drafter.forwards, ctx.acceptance) if self.auto else tree

    def grow(
        self, ctx: DraftContext, root_token: int, cost: CostCurve | None = None
    ) -> OptTreeResult:
        """Layer by layer (module doc). With a cost curve (`budget=auto`), only the nodes whose
        children could still pay for their rows are drafted, and growth stops when the next layer
        could not raise the tree's best score after paying its draft forward
        (builders/auto_size.layer_to_draft, calibrated values)."""
        work = TokenTree.from_root(root_token, self.children_mode)
        layer, history = [0], [1.0]  # E(A) of the root alone: the bonus token
        for _ in range(self.max_depth):
            new = best_children(ctx, work, layer, self.budget, self.topk or self.budget)
            best = rank_nodes(work)[: self.budget]
            history.append(1.0 + sum(work.values[i] for i in best))
            # a node outside the top n never re-enters it, nor do its descendants: don't expand it
            top = set(best)
            layer = [i for i in new if i in top]
            if history[-1] - history[-2] < self.delta or not layer:
                break
            if cost is not None:
                layer = layer_to_draft(
                    work, layer, cost, ctx.drafter.forwards, ctx.acceptance, self.budget
                )
                if not layer:
                    break
        return OptTreeResult(top_subtree(work, self.budget, self.children_mode), history)
