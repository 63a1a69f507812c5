"""Sequoia, run-time half: fill a fixed tree shape by sampling without replacement (Chen et al. 2024, "Sequoia", Alg. 1).

The shape (index paths, see `shapes.py`) comes from a file or from the
dynamic program of `sequoia_dp.py` (App. C.2.2) for the requested size and
depth. Layer by layer, one batched draft forward per layer, each node of the
shape that has k children gets the first k draws *without replacement* from
its draft distribution (Gumbel top-k). When a distribution has fewer than k
non-zero tokens the missing subtrees are dropped. Verifier: `rejection`
(without replacement) — Sequoia Alg. 1 / DySpec Alg. 3.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ArborError
from .registry import register
from .shapes import Shape, children_counts, load_shape, parse_shape_literal, shape_depth, validate_shape
from ..engine.tree import TokenTree
from .base import DraftContext, TreeBuilder, draw_children, require_positive


@register
@dataclass
class SequoiaBuilder(TreeBuilder):
    shape: Shape | str | None = None  # index paths, or a JSON file; None = DP shape for (budget, depth)
    budget: int = 16
    depth: int = 8
    name = "sequoia"
    children_mode = "without_replacement"
    paper = "Chen et al. 2024, Sequoia (Alg. 1, App. C.2.2)"
    _counts: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        require_positive(budget=self.budget, depth=self.depth)
        if isinstance(self.shape, str) and self.shape.lstrip().startswith("["):
            self.shape = parse_shape_literal(self.shape)
        elif isinstance(self.shape, str):
            self.shape, _ = load_shape(self.shape)
        elif self.shape is None:
            from .sequoia_dp import default_shape

            self.shape = default_shape(self.budget, self.depth)
        else:
            self.shape = validate_shape(self.shape)
        if not self.shape:
            raise ArborError("the Sequoia shape is empty")
        self.budget = len(self.shape)
        self._counts = children_counts(self.shape)

    @property
    def max_depth(self) -> int:
        return shape_depth(self.shape)

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
