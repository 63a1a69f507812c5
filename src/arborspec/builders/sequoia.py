"""Sequoia, run-time half: fill a fixed tree shape by sampling without replacement (Chen et al.
2024, "Sequoia", Alg. 1).

The shape (index paths, see `shapes.py`) comes from `shape=` (a JSON file, or an
inline literal like `[[0], [1], [0, 0]]`) or from the dynamic program of
`sequoia_dp.py` (App. C.2.2) for `budget` nodes, depth `max_depth` and at most
`topk` children per node. Given a shape and no budget or depth, those are the
shape's own. Layer by layer, one batched draft forward per
layer, each node of the shape that has k children gets the first k draws
*without replacement* from its draft distribution (Gumbel top-k). When a
distribution has fewer than k non-zero tokens the missing subtrees are dropped.
Verifier: `rejection` (without replacement) — Sequoia Alg. 1 / DySpec Alg. 3.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..engine.contracts import DraftContext, TreeBuilder
from ..engine.tree import TokenTree
from ..errors import ArborError
from .base import draw_children, require_positive
from .registry import register
from .sequoia_dp import default_shape
from .shapes import (
    Shape,
    children_counts,
    load_shape,
    parse_shape_literal,
    shape_depth,
    validate_shape,
)


def read_shape(shape: Shape | str) -> Shape:
    """Index paths from a list, an inline JSON literal or a shape file."""
    if isinstance(shape, str) and shape.lstrip().startswith("["):
        return parse_shape_literal(shape)
    if isinstance(shape, str):
        return load_shape(shape)[0]
    return validate_shape(shape)


@register
@dataclass(kw_only=True)
class SequoiaBuilder(TreeBuilder):
    budget: int = 16
    max_depth: int = 8
    # index paths, an inline literal or a JSON file; None = the DP shape
    shape: Shape | str | None = None
    name = "sequoia"
    children_mode = "without_replacement"
    paper = "Chen et al. 2024, Sequoia (Alg. 1, App. C.2.2)"
    _paths: Shape = field(default_factory=list, init=False, repr=False)
    _counts: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        require_positive(budget=self.budget, max_depth=self.max_depth, topk=self.topk)
        if self.shape is None:
            self._paths = default_shape(self.budget, self.max_depth, self.topk)
        else:
            self._paths = read_shape(self.shape)
        if not self._paths:
            raise ArborError("the Sequoia shape is empty")
        self._counts = children_counts(self._paths)
        self._check_fits()

    @classmethod
    def from_params(cls, **params) -> SequoiaBuilder:
        # a given shape sets the budget and depth it was made for
        if params.get("shape") is not None:
            params["shape"] = paths = read_shape(params["shape"])
            params.setdefault("budget", len(paths))
            params.setdefault("max_depth", shape_depth(paths))
        return cls(**params)

    def _check_fits(self) -> None:
        widest = max(self._counts.values())
        for what, have, limit in (
            ("nodes", len(self._paths), self.budget),
            ("levels", self.depth_limit, self.max_depth),
            ("children at a node", widest, self.topk),
        ):
            if limit is not None and have > limit:
                raise ArborError(
                    f"the Sequoia shape has {have} {what}, more than the {limit} asked for: "
                    "drop the budget / max_depth / topk or give a shape that fits"
                )

    @property
    def depth_limit(self) -> int:
        return shape_depth(self._paths)

    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        tree = TokenTree.from_root(root_token, self.children_mode)
        layer = [(0, ())]  # (tree node, shape path)
        while layer:
            expand = [(node, path) for node, path in layer if self._counts.get(path, 0) > 0]
            if not expand:
                break
            ctx.probs(tree, [node for node, _ in expand])  # one batched draft forward per layer
            layer = []
            for node, path in expand:
                kids = draw_children(ctx, tree, node, self._counts[path])
                layer += [(kid, path + (i,)) for i, kid in enumerate(kids)]
        return tree
