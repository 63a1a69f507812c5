"""SpecInfer: `topk` independent draft sequences of `max_depth` tokens (Miao et
al. 2024, "SpecInfer").

The root's `topk` children are i.i.d. draws *with replacement* from
the draft distribution (duplicates are kept as separate nodes, each the start of
its own sequence); every sequence then continues alone for `max_depth - 1`
more tokens. Given only a `budget`, the tree has
`min(topk, budget)` sequences of `budget // sequences` tokens; given only
`topk` and `max_depth`, the budget is their product. Verified by multi-round
rejection *with replacement* (`rejection-wr`, docs/algorithms.md §2). One draft
forward per depth, batched over the sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..engine.contracts import DraftContext, TreeBuilder
from ..engine.tree import TokenTree
from ..errors import ArborError
from .base import require_positive
from .registry import register

DEFAULT_SEQUENCES = 4
DEFAULT_LENGTH = 4


@register
@dataclass(kw_only=True)
class SpecInferBuilder(TreeBuilder):
    budget: int = DEFAULT_SEQUENCES * DEFAULT_LENGTH
    topk: int = DEFAULT_SEQUENCES  # sequences (the root's i.i.d. children)
    max_depth: int | None = None  # tokens per sequence; None = budget // sequences
    name = "specinfer"
    children_mode = "with_replacement"
    paper = "Miao et al. 2024, SpecInfer (k independent sequences)"

    def __post_init__(self) -> None:
        require_positive(budget=self.budget, topk=self.topk, max_depth=self.max_depth)
        if self.sequences * self.length > self.budget:
            raise ArborError(
                f"specinfer: {self.sequences} sequences x {self.length} tokens exceed the budget "
                f"of {self.budget} draft nodes: raise the budget or lower topk / max_depth"
            )

    @classmethod
    def from_params(cls, **params) -> SpecInferBuilder:
        if "budget" not in params:  # then k x length define the tree
            params.setdefault("max_depth", DEFAULT_LENGTH)
            params["budget"] = params.get("topk", DEFAULT_SEQUENCES) * params["max_depth"]
        return cls(**params)

    @property
    def sequences(self) -> int:
        return min(self.topk, self.budget)

    @property
    def length(self) -> int:
        return (
            self.max_depth if self.max_depth is not None else max(1, self.budget // self.sequences)
        )

    @property
    def depth_limit(self) -> int:
        return self.length

    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        tree = TokenTree.from_root(root_token, self.children_mode)
        frontier = self._draw(ctx, tree, 0, self.sequences)
        for _ in range(self.length - 1):
            ctx.probs(tree, frontier)  # one batched draft forward for the whole layer
            frontier = [kid for node in frontier for kid in self._draw(ctx, tree, node, 1)]
        return tree

    def _draw(self, ctx: DraftContext, tree: TokenTree, node: int, n: int) -> list[int]:
        probs = ctx.probs(tree, [node])[0]
        tree.child_dists[node] = probs
        draws = torch.multinomial(
            probs.to(ctx.generator.device), n, replacement=True, generator=ctx.generator
        )
        v = tree.values[node]
        return [
            tree.add(node, int(y), value=v * float(probs[y]), draft_prob=float(probs[y]))
            for y in draws.tolist()
        ]
