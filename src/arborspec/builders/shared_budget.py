"""One node budget for a batch: DySpec's heap over every request's sampling slots
(docs/algorithms.md §10).

DySpec (builders/dyspec.py) pops a request's sampling slots in order of their value, the
estimated probability that the verifier looks at the draw. `SharedBudget` keeps one heap for the
slots of all requests it grows, so a step's draft nodes go to the draws most likely to be
accepted whichever request they belong to: a request whose draft is confident gets a deep tree,
one whose draft is lost gets its root alone.

How many nodes (`budget=None`, the default) comes from the measured cost curve at the batch's
row count. Where the target packs a step's trees into one row (the int8 target,
engine/packed_rows.py), a forward is priced by its R real rows (an approximation: uneven trees
cost somewhat more than even ones of as many rows, docs/algorithms.md §10), so a step costs

    T = t(B, R / B) + forwards x (one draft forward) + the step's overhead

for B requests (`t(B, n)`: B requests of n rows each, measured), and commits E = B + the sum of
the accepted nodes' values, in expectation. A slot is drawn when its value v pays for what it adds
to T at the best rate E / T seen so far: `v >= best rate x (T after - T before)`: one target row,
and a draft forward where its parent has no draft probabilities yet (which, with `prefetch`, also
drafts the other first-child slots among the best in the heap). Where the forward is padded
instead (every request fed N rows, the longest tree: engine/batch_rows.py), T counts t(B, N): a
node in a request with fewer than N rows costs no target row, and one that lengthens the longest
tree opens a column of B rows, which every request as long gets to use: it is valued with the best
slot of each of them. As the batch grows, t grows and speculation shrinks; where no slot pays,
every request is decoded plainly. This is Sequoia's `t(b x n)` sizing for a batch of b trees,
taken to trees of different sizes.

Every decision is made before the draw it concerns, from values known then (the slot's value,
earlier draws of every request), never from the draw itself: the trees stay valid for the
rejection verifiers above temperature 0 (docs/algorithms.md §7).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from ..engine.batch_cost import BatchCost
from ..engine.batch_decode import expand_many
from ..engine.contracts import DraftContext, TreeBuilder
from ..engine.tree import TokenTree
from ..errors import ArborError
from .base import DrawSequence, add_draw, require_positive
from .dyspec import DySpecBuilder

PREFETCH = 32  # first-child slots looked at for a draft forward's other rows
LOOKUP = -1  # the parent of a heap slot that is a lookup token
PRIOR_FIRST = 0.6  # the calibrated rate of a node's first draw before any is seen this step


@dataclass(kw_only=True)
class SharedBudget:
    """Batch-level DySpec for the requests whose builder is `dyspec`."""

    max_nodes: int = 16  # per request
    max_depth: int | None = None
    budget: int | None = None  # draft nodes per step for the whole batch; None: by the cost curve
    prefetch: bool = True
    # the requests it grows: those whose builder is this one (None: every DySpec request); a
    # server grows its default requests' trees here and keeps a request's own method or budget
    only: DySpecBuilder | None = None

    def __post_init__(self) -> None:
        require_positive(max_nodes=self.max_nodes, max_depth=self.max_depth, budget=self.budget)
        if self.only is not None and not isinstance(self.only, DySpecBuilder):
            raise ArborError(
                f"a shared budget grows DySpec trees, not {type(self.only).__name__}'s: give it a "
                "dyspec builder"
            )

    def takes(self, builder: TreeBuilder | None) -> bool:
        if self.only is not None:
            return builder is self.only
        return isinstance(builder, DySpecBuilder)

    @property
    def depth_limit(self) -> int:
        return min(self.max_nodes, self.max_depth or self.max_nodes)

    def build_many(
        self,
        ctxs: dict | None,
        roots: dict,
        lookups: dict,
        cost: BatchCost,
        overhead: float = 0.0,
        others: list[int] | tuple[int, ...] = (),
        packed: bool = True,
    ) -> tuple[dict, dict]:
        """Grow the trees of the requests in `roots` (key -> root token) from one heap, drafting
        through `ctxs` (key -> `DraftContext`; None: no drafting this step, lookup tokens only).
        `lookups`: key -> (the lookup's proposal, the request's rate of accepted lookup tokens);
        by the cost, its tokens join the heap as slots worth rate^i, no draft forward needed;
        with a fixed `budget` every proposal is grafted whole, outside the budget. `cost`: the
        batch's measured costs; `overhead`: seconds the draft side adds to a step beyond its timed
        forwards (paid already when this runs). `others`: the most rows each request of the batch
        grown elsewhere (plain ones, other builders) feeds; `packed`: whether the target packs the
        step's trees (module doc). Returns the trees and, per request, how many of its proposal's
        tokens to graft."""
        keys = list(roots)
        trees = {k: TokenTree.from_root(roots[k], DySpecBuilder.children_mode) for k in keys}
        requests = len(keys) + len(others)
        by_cost = self.budget is None
        grafted = {k: 0 if by_cost else len(lookups[k][0]) for k in lookups}
        rows = {k: 1 + grafted.get(k, 0) for k in keys}
        width = max([1, *others, *rows.values()])  # the longest tree: a padded forward's rows
        total = sum(others) + sum(rows.values())  # a packed forward's rows
        forwards = 0
        draft = cost.draft(requests)

        def step_cost(width: int, total: int, forwards: int) -> float:
            rows_each = total / requests if packed else width
            return cost.target(requests, rows_each) + forwards * draft + overhead

        expected = float(requests)
        best = expected / step_cost(width, total, forwards)
        draws: dict[tuple, DrawSequence] = {}
        # calibrated values: a node's is its parent's times the acceptance model's rate of its draw
        values = {k: {0: 1.0} for k in keys}
        first = [PRIOR_FIRST]  # calibrated rates of first draws seen this step (their mean: kappa)
        counter = itertools.count()
        # (-expected gain, tie-break, request, parent node or LOOKUP, draw or lookup-token index)
        heap = [(-PRIOR_FIRST, next(counter), k, 0, 0) for k in keys] if ctxs is not None else []
        if by_cost:
            heap += [
                (-rate, next(counter), k, LOOKUP, 0)
                for k, (tokens, rate) in lookups.items()
                if tokens
            ]
        heapq.heapify(heap)
        added = 0
        while heap and (by_cost or added < self.budget):
            neg, _, k, parent, j = heapq.heappop(heap)
            tree = trees[k]
            lookup = parent == LOOKUP
            if not lookup and tree.size >= self.max_nodes:
                continue
            forward = not lookup and (k, parent) not in draws
            if by_cost:
                gain, needs_forward = -neg, forward
                if not packed and rows[k] + 1 > width:  # a new column: B rows, for every request
                    column = self._column(heap, trees, rows, width, draws, k)  # as long as this
                    gain += sum(value for value, _ in column.values())
                    needs_forward = needs_forward or any(f for _, f in column.values())
                wider = max(width, rows[k] + 1)
                extra = step_cost(wider, total + 1, forwards + needs_forward) - step_cost(
                    width, total, forwards
                )
                if gain < best * extra:
                    continue  # this slot (with the column it opens) does not pay for its rows
            if forward:
                self._forward(ctxs, trees, draws, heap, (k, parent))
                forwards += 1
                seq = draws[(k, parent)]
                if j >= len(seq):
                    continue
                first.append(self._rate(ctxs[k], seq, 0))
                # back into the heap at its gain now that its distribution is known (still before
                # the draw), judged again with its forward paid
                known = values[k][parent] * self._rate(ctxs[k], seq, j)
                heapq.heappush(heap, (-known, next(counter), k, parent, j))
                continue
            rows[k] += 1
            total += 1
            width = max(width, rows[k])
            if lookup:  # the proposal's next token: no draw, no forward
                grafted[k] = j + 1
                expected += -neg
                tokens, rate = lookups[k]
                if j + 1 < len(tokens):
                    heapq.heappush(heap, (neg * rate, next(counter), k, LOOKUP, j + 1))
                continue
            seq = draws[(k, parent)]
            node = add_draw(tree, seq, parent, j)
            added += 1
            values[k][node] = values[k][parent] * ctxs[k].acceptance_rate(seq.probs[j], j)
            expected += values[k][node]
            best = max(best, expected / step_cost(width, total, forwards))
            if j + 1 < len(seq):  # next sibling, unless the residual is empty
                gain = values[k][parent] * self._rate(ctxs[k], seq, j + 1)
                heapq.heappush(heap, (-gain, next(counter), k, parent, j + 1))
            if tree.depths[node] < self.depth_limit:  # first child of the new node: by kappa
                kappa = sum(first) / len(first)
                heapq.heappush(heap, (-values[k][node] * kappa, next(counter), k, node, 0))
        return trees, grafted

    @staticmethod
    def _rate(ctx: DraftContext, seq: DrawSequence, j: int) -> float:
        """The calibrated rate of draw j of a node, as known before it is made: of its draft
        probability for ordered draws (temperature 0: the j-th most likely token), else of its
        expected draft probability, `sum of D^2 / sum of D` over what is left to draw."""
        if ctx.cfg.ordered_draws:
            return ctx.acceptance_rate(seq.probs[j], j)
        left = seq.tails[j]
        square = float((seq.dist.double() ** 2).sum()) - sum(q * q for q in seq.probs[:j])
        return ctx.acceptance_rate(max(0.0, square) / left if left > 0 else 0.0, j)

    def _column(self, heap, trees, rows, width, draws, opener) -> dict:
        """For a slot that opens a new column: each other request as long as the longest tree, its
        best slot's value and whether that slot needs a draft forward (what the column would hold,
        valued before any draw)."""
        column: dict = {}
        for neg, _, k, parent, _ in heap:
            if k == opener or rows[k] != width:
                continue
            if parent != LOOKUP and trees[k].size >= self.max_nodes:
                continue
            if k not in column or -neg > column[k][0]:
                column[k] = (-neg, parent != LOOKUP and (k, parent) not in draws)
        return column

    def worth_drafting(self, history) -> bool:
        """Whether this step drafts: where the batch's steps that drafted have committed more tokens
        per second than those that did not (`history`, a `DraftingHistory`, which also times each
        kind again now and then). A fixed `budget` always drafts."""
        return self.budget is not None or history.worth()

    def _forward(self, ctxs, trees, draws, heap, first: tuple) -> None:
        """One batched draft forward for `first` (request, node) and, with `prefetch`, the other
        unexpanded first-child slots among the best in the heap; their draws are made ready."""
        wanted = [first]
        if self.prefetch:
            wanted += [
                (k, parent)
                for _, _, k, parent, j in heapq.nsmallest(PREFETCH, heap)
                if j == 0 and parent != LOOKUP and (k, parent) not in draws and (k, parent) != first
                and trees[k].size < self.max_nodes
            ]
        by_request: dict = {}
        for k, node in wanted:
            by_request.setdefault(k, []).append(node)
        items = []
        for k, nodes in by_request.items():
            todo = ctxs[k].missing(trees[k], nodes)
            if todo:
                items.append((k, trees[k], todo))
        for (k, tree, todo), logits in zip(items, expand_many(items) if items else []):
            ctxs[k].store(tree, todo, logits)
            ctxs[k].drafter.forwards += 1
        for k, node in wanted:
            draws[(k, node)] = DrawSequence.of(ctxs[k], trees[k], node, self.max_nodes)
