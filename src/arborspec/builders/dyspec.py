"""DySpec: dynamic token trees grown by estimated verification probability (Xiong
et al. 2024, "DySpec").

Two builders, both sampling children *without replacement*, so both pair with
the `rejection` verifier (DySpec Alg. 3 = Sequoia Alg. 1) above temperature 0:

* `dyspec` (Alg. 1, greedy): a max-heap of *sampling slots*. A slot is "the
  k-th draw from node p's draft distribution"; its value is the estimated
  probability that the verifier ever looks at that draw. Popping the best slot
  samples a token, adds it to the tree and pushes two slots: the next sibling
  (`v * (1 - R[y])`) and the new node's first child (`v * R[y]`). Because
  every slot value is at most its parent slot's, the m popped slots are the m
  best of all reachable slots: the tree maximises the sum of slot values, which
  is DySpec's E[accepted tokens] under "acceptance ~ draft probability" (App. D).
* `dyspec-threshold` (Alg. 2): layer by layer, every slot whose value is
  `>= threshold` is drawn (the paper's `< t` is a typo). With the threshold set
  to the m-th best slot value it grows the same tree as the greedy variant,
  with one draft forward per layer instead of up to one per node.

Randomness is keyed by node (`DraftContext.gumbel`): the k-th child of a node is
the k-th largest of `log D + G`, exactly the k-th draw without replacement. So
both variants (and any batching of draft forwards) see the same draws, and
`tree.child_dists[node]` (the full, un-residualised `D(.|node)`) lets the
verifier replay the residuals of later siblings.

The slot values telescope (App. D, eq. 9-10): the k-th slot of node p is worth
`value[p] * tail_k` (`tail_k` = draft mass not drawn before the k-th draw) and
the node it produces `value[p] * D[y]`. `builders/base.DrawSequence` computes
them in that closed form, once, for both variants and for every other builder
that samples (chain, Sequoia), so all of them estimate values the same way
(docs/algorithms.md §3).

Size parameters: `budget` (nodes), `max_depth` (None: bounded by the budget)
and `topk` (draws per node; None: as many as the budget allows). With
`auto=true` (`budget=auto`) the budget is a cap and each draw is made only if its
expected calibrated value, known before the draw, pays for its row at the step's
best rate so far, and a draft forward only if the children it yields are expected
to repay it (builders/auto_size.GrowthRule). Nothing is cut after the tree is grown: a cut by
the kept nodes' own values would bias the rejection verifier (docs/algorithms.md §7).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from ..engine.contracts import DraftContext, TreeBuilder
from ..engine.tree import TokenTree
from ..errors import ArborError
from .auto_size import DrawMoments, GrowthRule, require_cost
from .base import DrawSequence, add_draw, require_positive
from .registry import register


@dataclass(order=True)
class Slot:
    """A pending draw: the k-th child of `parent`, keyed by its (negated) value for a min-heap."""

    neg_value: float
    seq: int  # insertion counter: deterministic tie-breaking
    parent: int
    k: int


class _DySpecSize:
    """The size rules both DySpec builders share."""

    budget: int
    max_depth: int | None
    topk: int | None
    auto: bool

    def _rule(self, ctx: DraftContext) -> GrowthRule | None:
        """budget=auto: the growth rule (builders/auto_size.py), deciding every draw
        before it is made."""
        if not self.auto:
            return None
        return GrowthRule(
            require_cost(self.name, ctx.cost),
            ctx.acceptance,
            self.budget,
            ordered=ctx.cfg.ordered_draws,
        )

    def _check_size(self) -> None:
        require_positive(budget=self.budget, max_depth=self.max_depth, topk=self.topk)

    def draws_per_node(self, room: int) -> int:
        """How many children a node may get when `room` nodes are left."""
        return min(room, self.topk or room)


@register
@dataclass(kw_only=True)
class DySpecBuilder(_DySpecSize, TreeBuilder):
    budget: int = 32  # with auto: the largest tree considered
    # batch draft forwards for nodes that may be popped soon (never changes the tree)
    prefetch: bool = True
    # budget=auto: size each tree by the measured cost curve (builders/auto_size.py)
    auto: bool = False
    name = "dyspec"
    children_mode = "without_replacement"
    paper = "Xiong et al. 2024, DySpec (Alg. 1, App. D)"

    def __post_init__(self) -> None:
        self._check_size()

    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        tree = TokenTree.from_root(root_token, self.children_mode)
        draws: dict[int, DrawSequence] = {}
        moments: dict[int, DrawMoments | None] = {}
        counter = itertools.count()
        heap = [Slot(-1.0, next(counter), 0, 0)]
        rule = self._rule(ctx)
        while heap and tree.size < self.budget:
            slot = heapq.heappop(heap)
            # a first-child slot: its distribution needs a draft forward
            if slot.parent not in draws:
                forwards = ctx.drafter.forwards
                if (
                    rule is not None
                    and not ctx.has_probs(tree, slot.parent)
                    and not rule.worth_forward(
                        tree.size, rule.children_worth(slot.parent), forwards + 1, forwards
                    )
                ):
                    # budget=auto: the node stays a leaf, its children are not expected to repay the
                    # forward
                    continue
                self._forward(ctx, tree, heap, slot.parent, draws, rule)
                draws[slot.parent] = DrawSequence.of(
                    ctx, tree, slot.parent, self.draws_per_node(self.budget)
                )
                if rule is not None:
                    moments[slot.parent] = rule.moments(draws[slot.parent].dist)
            seq = draws[slot.parent]
            if rule is not None and not rule.keep(
                tree.size,
                rule.draw_value(slot.parent, moments[slot.parent], seq.probs, slot.k),
                ctx.drafter.forwards,
            ):
                # budget=auto: this draw, and so the node's later ones, are not expected to pay
                continue
            node = add_draw(tree, seq, slot.parent, slot.k)
            if rule is not None:
                rule.add(tree, node)
            if slot.k + 1 < len(seq):  # next sibling, unless the residual is empty
                value = seq.slot_value(tree.values[slot.parent], slot.k + 1)
                heapq.heappush(heap, Slot(-value, next(counter), slot.parent, slot.k + 1))
            if tree.depths[node] < self.depth_limit:  # first child of the new node
                heapq.heappush(heap, Slot(-tree.values[node], next(counter), node, 0))
        return tree

    def _forward(
        self,
        ctx: DraftContext,
        tree: TokenTree,
        heap: list[Slot],
        node: int,
        draws: dict[int, DrawSequence],
        rule: GrowthRule | None = None,
    ) -> None:
        """One batched draft forward for `node` and, with `prefetch`, the other unexpanded nodes
        among the slots that can still be popped (the best `budget - size - 1` in the heap; with
        `budget=auto`, only those whose children are expected to be worth a row, `GrowthRule.keep`).

        Only those can be popped before the budget runs out: later pushes never outrank
        the slot they came from. Extra rows may be wasted but never change the tree,
        because the draws are keyed by node, not by the order of forwards.
        """
        nodes = [node]
        if self.prefetch:
            room = self.budget - tree.size - 1
            slots = [s for s in heapq.nsmallest(room, heap) if s.parent not in draws and s.k == 0]
            if rule is not None:  # this forward is paid either way
                forwards = ctx.drafter.forwards + 1
                slots = [
                    s
                    for s in slots
                    if rule.keep(tree.size, rule.children_worth(s.parent), forwards)
                ]
            nodes += [s.parent for s in slots]
        ctx.probs(tree, nodes)


@register
@dataclass(kw_only=True)
class DySpecThresholdBuilder(_DySpecSize, TreeBuilder):
    budget: int = 64  # node cap
    threshold: float = 0.03  # given a budget and no threshold: 1 / budget
    auto: bool = False  # budget=auto: only draws expected to pay are made (builders/auto_size.py)
    name = "dyspec-threshold"
    children_mode = "without_replacement"
    paper = "Xiong et al. 2024, DySpec (Alg. 2)"

    def __post_init__(self) -> None:
        self._check_size()
        if not 0 < self.threshold <= 1:
            raise ArborError(f"threshold must be in (0, 1], got {self.threshold}")

    @classmethod
    def from_params(cls, **params) -> DySpecThresholdBuilder:
        if "budget" in params:
            params.setdefault("threshold", 1.0 / params["budget"])
        return cls(**params)

    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        tree = TokenTree.from_root(root_token, self.children_mode)
        rule = self._rule(ctx)
        layer = [0]
        while layer and tree.size < self.budget:
            # a node's first-child slot has the node's own value: only those passing get a forward
            expand = [
                n
                for n in layer
                if tree.values[n] >= self.threshold and tree.depths[n] < self.depth_limit
            ]
            # budget=auto: children expected to repay the layer's forward
            if rule is not None and tree.size > 0:
                forwards = ctx.drafter.forwards
                expand = [
                    n for n in expand if rule.keep(tree.size, rule.children_worth(n), forwards + 1)
                ]
                gain = sum(rule.children_worth(n) for n in expand)
                if expand and not rule.worth_forward(tree.size, gain, forwards + 1, forwards):
                    expand = []
            if not expand:
                break
            ctx.probs(tree, expand)  # one batched draft forward per layer
            layer = self._grow_layer(ctx, tree, expand, rule)
        return tree

    def _grow_layer(
        self, ctx: DraftContext, tree: TokenTree, expand: list[int], rule: GrowthRule | None
    ) -> list[int]:
        """Draw every slot of `expand` with value >= threshold; if the node cap would be
        exceeded keep the best slots (a node's slot values decrease with k, so each
        node keeps a prefix of its draws). With `budget=auto`, a node's draws also stop at the
        first one whose expected calibrated value, known before it is drawn, is below the price
        of a node at the layer's starting size (`GrowthRule.keep`)."""
        room = self.budget - tree.size
        size, forwards = tree.size, ctx.drafter.forwards
        seqs = {n: DrawSequence.of(ctx, tree, n, self.draws_per_node(room)) for n in expand}
        slots = []  # (-slot value, position in layer, k)
        for pos, n in enumerate(expand):
            moments = rule.moments(seqs[n].dist) if rule is not None else None
            for k in range(len(seqs[n])):
                value = seqs[n].slot_value(tree.values[n], k)
                if value < self.threshold:
                    break
                if rule is not None and not rule.keep(
                    size, rule.draw_value(n, moments, seqs[n].probs, k), forwards
                ):
                    break
                slots.append((-value, pos, k))
        # back to layer order, draw order
        kept = sorted(sorted(slots)[:room], key=lambda s: (s[1], s[2]))
        nodes = []
        for _, pos, k in kept:
            nodes.append(add_draw(tree, seqs[expand[pos]], expand[pos], k))
            if rule is not None:
                rule.add(tree, nodes[-1])
        return nodes
