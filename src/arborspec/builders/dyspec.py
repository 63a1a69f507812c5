"""DySpec: dynamic token trees grown by estimated verification probability (Xiong et al. 2024, "DySpec").

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

The slot values telescope (App. D, eq. 9-10): with `tail_k` = draft mass not
drawn before the k-th draw, the k-th slot of node p has value
`value[p] * tail_k` and the node it produces has value `value[p] * D[y]`
(= `v * R[y]` with `R = D / tail_k`). We compute them in that closed form, so
that both variants produce bit-identical values.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import torch

from ..errors import ArborError
from .registry import register
from ..engine.sampling import sample_without_replacement
from ..engine.tree import TokenTree
from .base import DraftContext, TreeBuilder, require_positive


@dataclass
class DrawSequence:
    """The keyed draws of one node: its children-to-be, in the order they are sampled."""

    dist: torch.Tensor  # [V] full draft distribution D(.|node)
    tokens: list[int]  # the first draws without replacement (only tokens with D > 0)
    probs: list[float]  # D[token] of each draw
    tails: list[float]  # tails[k] = mass of D not drawn before draw k (tails[0] = 1)

    @classmethod
    def of(cls, ctx: DraftContext, tree: TokenTree, node: int, limit: int) -> "DrawSequence":
        dist = ctx.probs(tree, [node])[0]
        tokens = sample_without_replacement(dist, limit, ctx.gumbel(tree, node))
        probs = [float(dist[y]) for y in tokens]
        tails = [max(0.0, 1.0 - s) for s in itertools.accumulate([0.0] + probs[:-1])]
        return cls(dist, tokens, probs, tails)

    def __len__(self) -> int:
        return len(self.tokens)

    def slot_value(self, parent_value: float, k: int) -> float:
        """Estimated probability that draw k is verified: parent accepted, draws 0..k-1 rejected."""
        return parent_value * self.tails[k]

    def child_value(self, parent_value: float, k: int) -> float:
        """Estimated probability that draw k is accepted: slot value * R[y] = parent value * D[y]
        (clamped to the slot value, which float32 probabilities can exceed by an ulp when y is the
        last token left: keeps every slot's value >= its children's, so the heap order is exact)."""
        return min(parent_value * self.probs[k], self.slot_value(parent_value, k))


def add_draw(tree: TokenTree, draws: DrawSequence, parent: int, k: int) -> int:
    """Add draw k of `parent` (the tree must already hold draws 0..k-1) and record D(.|parent)."""
    assert len(tree.children[parent]) == k, "draws must be added in order"
    tree.child_dists[parent] = draws.dist
    return tree.add(parent, draws.tokens[k], value=draws.child_value(tree.values[parent], k),
                    draft_prob=draws.probs[k])


@dataclass(order=True)
class Slot:
    """A pending draw: the k-th child of `parent`, keyed by its (negated) value for a min-heap."""

    neg_value: float
    seq: int  # insertion counter: deterministic tie-breaking
    parent: int
    k: int


@register
@dataclass
class DySpecBuilder(TreeBuilder):
    budget: int = 32
    max_depth: int | None = None  # None = no cap (bounded by the budget)
    prefetch: bool = True  # batch draft forwards for nodes that may be popped soon (never changes the tree)
    name = "dyspec"
    children_mode = "without_replacement"
    paper = "Xiong et al. 2024, DySpec (Alg. 1, App. D)"

    def __post_init__(self) -> None:
        require_positive(budget=self.budget)
        if self.max_depth is not None:
            require_positive(max_depth=self.max_depth)
        self.max_depth = min(self.max_depth or self.budget, self.budget)

    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        tree = TokenTree.from_root(root_token, self.children_mode)
        draws: dict[int, DrawSequence] = {}
        counter = itertools.count()
        heap = [Slot(-1.0, next(counter), 0, 0)]
        while heap and tree.size < self.budget:
            slot = heapq.heappop(heap)
            if slot.parent not in draws:  # a first-child slot: its distribution needs a draft forward
                self._forward(ctx, tree, heap, slot.parent, draws)
                draws[slot.parent] = DrawSequence.of(ctx, tree, slot.parent, self.budget)
            seq = draws[slot.parent]
            node = add_draw(tree, seq, slot.parent, slot.k)
            if slot.k + 1 < len(seq):  # next sibling, unless the residual is empty
                value = seq.slot_value(tree.values[slot.parent], slot.k + 1)
                heapq.heappush(heap, Slot(-value, next(counter), slot.parent, slot.k + 1))
            if tree.depths[node] < self.max_depth:  # first child of the new node
                heapq.heappush(heap, Slot(-tree.values[node], next(counter), node, 0))
        return tree

    def _forward(self, ctx: DraftContext, tree: TokenTree, heap: list[Slot], node: int,
                 draws: dict[int, DrawSequence]) -> None:
        """One batched draft forward for `node` and, with `prefetch`, the other unexpanded nodes
        among the slots that can still be popped (the best `budget - size - 1` in the heap).

        Only those can be popped before the budget runs out: later pushes never outrank
        the slot they came from. Extra rows may be wasted but never change the tree,
        because the draws are keyed by node, not by the order of forwards.
        """
        nodes = [node]
        if self.prefetch:
            room = self.budget - tree.size - 1
            nodes += [s.parent for s in heapq.nsmallest(room, heap) if s.parent not in draws and s.k == 0]
        ctx.probs(tree, nodes)


@register
@dataclass
class DySpecThresholdBuilder(TreeBuilder):
    threshold: float = 0.03
    budget: int = 64  # node cap
    max_depth: int | None = None  # None = no cap (bounded by the budget)
    name = "dyspec-threshold"
    children_mode = "without_replacement"
    paper = "Xiong et al. 2024, DySpec (Alg. 2)"

    def __post_init__(self) -> None:
        require_positive(budget=self.budget)
        if not 0 < self.threshold <= 1:
            raise ArborError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.max_depth is not None:
            require_positive(max_depth=self.max_depth)
        self.max_depth = min(self.max_depth or self.budget, self.budget)

    @classmethod
    def from_budget(cls, budget: int, **params) -> "DySpecThresholdBuilder":
        params.setdefault("threshold", 1.0 / budget)
        return cls(budget=budget, **params)

    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        tree = TokenTree.from_root(root_token, self.children_mode)
        layer = [0]
        while layer and tree.size < self.budget:
            # a node's first-child slot has the node's own value: only those passing get a forward
            expand = [n for n in layer if tree.values[n] >= self.threshold and tree.depths[n] < self.max_depth]
            if not expand:
                break
            ctx.probs(tree, expand)  # one batched draft forward per layer
            layer = self._grow_layer(ctx, tree, expand)
        return tree

    def _grow_layer(self, ctx: DraftContext, tree: TokenTree, expand: list[int]) -> list[int]:
        """Draw every slot of `expand` with value >= threshold; if the node cap would be
        exceeded keep the best slots (a node's slot values decrease with k, so each
        node keeps a prefix of its draws)."""
        room = self.budget - tree.size
        seqs = {n: DrawSequence.of(ctx, tree, n, room) for n in expand}
        slots = []  # (-slot value, position in layer, k)
        for pos, n in enumerate(expand):
            for k in range(len(seqs[n])):
                value = seqs[n].slot_value(tree.values[n], k)
                if value < self.threshold:
                    break
                slots.append((-value, pos, k))
        kept = sorted(sorted(slots)[:room], key=lambda s: (s[1], s[2]))  # back to layer order, draw order
        return [add_draw(tree, seqs[expand[pos]], expand[pos], k) for _, pos, k in kept]
