"""`budget=auto`: the tree size that maximises expected accepted tokens per unit of step time.

A step that verifies a tree of n draft nodes costs, in units of one plain target
forward, `t(n + 1) + f * c` (the measured cost curve `engine/cost.CostCurve`: n nodes
plus the root, and f draft forwards of relative cost c) and is expected to commit
`E[A](n) = 1 + sum of the values of its n nodes` tokens (the builder's own estimate,
bonus included). `budget=auto` keeps the n, up to the builder's `budget` (now a cap),
that maximises the step's rate `E[A](n) / (t(n + 1) + f * c)` (docs/algorithms.md §7).

Selected trees (OPT-Tree) are grown, then cut to their best-scoring prefix in an order in which
every prefix is a valid tree: calibrated value (else the builder's own path probability)
descending, then depth, then index (a calibrated value is a product of rates <= 1 along the
path, so it never exceeds the parent's and every prefix is parent-closed; `auto_subtree`).
Their verifiers (greedy, target-sample-and-match) accept any tree, so the cut is lossless.

Sampled trees (DySpec, DySpec-threshold) are verified by rejection sampling, which stays
lossless only if whether a draw is kept is settled before the draw is seen: a cut by the kept
nodes' own values keeps likely draws more often than the draft draws them. They are never cut;
`GrowthRule` makes each draw, and pays each draft forward, only when its *expected* value,
computed from what is known before the draw, pays for it (docs/algorithms.md §7).

The values come from the generation's online acceptance model when the engine keeps one
(engine/acceptance.py: the builder's values calibrated against the verifier's outcomes so far),
else from the builder's own values. The size never changes how the verifier treats a tree it
is given; greedy identity and distribution tests cover every `budget=auto` builder
(tests/test_auto_size.py).
"""

from __future__ import annotations

import torch

from ..engine.acceptance import EDGES, AcceptanceModel
from ..engine.cost import READ_ROWS, CostCurve
from ..engine.tree import TokenTree
from ..errors import ArborError
from .base import rank_nodes


def step_rate(cost: CostCurve, expected: float, size: int, draft_forwards: int) -> float:
    """What `budget=auto` maximises over the sizes n of one step (docs/algorithms.md §7): the rate
    `E[A](n) / cost(n)` of a tree of `size` nodes expected to commit `expected` tokens, with
    `draft_forwards` draft forwards paid (plus the curve's learnt cost of each committed token
    beyond the `READ_ROWS` the curve's timed forwards include)."""
    return expected / (
        cost.step_cost(size, draft_forwards) + cost.token_cost * (expected - READ_ROWS)
    )


def require_cost(name: str, cost: CostCurve | None) -> CostCurve:
    """The cost curve a `budget=auto` builder was given; a one-line error without one."""
    if cost is None:
        raise ArborError(
            f"{name} with auto=true needs the measured cost curve: run it through the decoder "
            "(SpeculativeDecoder measures it) or pass cost= to the DraftContext"
        )
    return cost


def best_prefix(gains: list[float], cost: CostCurve, draft_forwards: int) -> tuple[int, float]:
    """The n in 0..len(gains) maximising the step rate (`step_rate`) of `E[A] = 1 + sum(gains[:n])`
    (`gains` in ranking order; the smallest such n on ties), and that rate."""
    best_n, best, expected = 0, step_rate(cost, 1.0, 0, draft_forwards), 1.0
    for n, gain in enumerate(gains, start=1):
        expected += gain
        score = step_rate(cost, expected, n, draft_forwards)
        if score > best:
            best_n, best = n, score
    return best_n, best


def best_size(gains: list[float], cost: CostCurve, draft_forwards: int) -> int:
    """The n of `best_prefix`."""
    return best_prefix(gains, cost, draft_forwards)[0]


def ranking(tree: TokenTree, values: list[float] | None = None) -> list[int]:
    """Non-root nodes of a selected tree in an order where every prefix is a valid tree: by `values`
    (the calibrated ones; else the builder's own), then depth, then index. Any parent-closed subset
    of a selected tree is a valid tree, and a calibrated value never exceeds its parent's."""
    return rank_nodes(tree, values)


def calibrated_values(tree: TokenTree, acceptance: AcceptanceModel | None) -> list[float]:
    """Per node, the acceptance model's calibrated value when one is given, else
    the builder's own."""
    return acceptance.node_values(tree) if acceptance is not None else tree.values


def layer_to_draft(
    tree: TokenTree,
    layer: list[int],
    cost: CostCurve,
    draft_forwards: int,
    acceptance: AcceptanceModel | None,
    cap: int,
) -> list[int]:
    """For a builder that grows layer by layer (OPT-Tree): the nodes of `layer` whose children could
    still raise the best score of the tree so far (its best prefix of at most `cap` nodes,
    calibrated values) after paying one more draft forward; empty: stop growing.

    A node is dropped when it is worth less than the cheapest average price of a node beyond the
    best prefix (`best rate x (step cost(m) - step cost(n)) / (m - n)`, minimised over m): its
    children, worth less still, can never pay for their rows. Then the layer as a whole: at most one
    child of a node is accepted, so the children are worth at most their parent each and at most the
    layer's total value together; the best tree of m nodes holds some j children and the m - j best
    nodes already there (a full tree gains by swapping its weakest); if no m beats the score, the
    layer is not worth its forward."""
    values = calibrated_values(tree, acceptance)
    gains = [values[i] for i in ranking(tree, values)[:cap]]
    n, score = best_prefix(gains, cost, draft_forwards + 1)
    base = cost.step_cost(n, draft_forwards + 1)
    price = min(
        ((cost.step_cost(m, draft_forwards + 1) - base) / (m - n) for m in range(n + 1, cap + 1)),
        default=0.0,
    )
    layer = [i for i in layer if values[i] >= score * price]
    top = max((values[i] for i in layer), default=0.0)
    total = sum(values[i] for i in layer)
    prefix = [0.0]
    for gain in gains:
        prefix.append(prefix[-1] + gain)
    best = best_prefix(gains, cost, draft_forwards)[1]
    for m in range(1, cap + 1):
        expected = 1.0 + max(
            prefix[min(m - j, len(gains))] + min(total, j * top) for j in range(m + 1)
        )
        if step_rate(cost, expected, m, draft_forwards + 1) > best:
            return layer
    return []


def auto_subtree(
    tree: TokenTree, cost: CostCurve, draft_forwards: int, acceptance: AcceptanceModel | None = None
) -> TokenTree:
    """The best-scoring prefix of `tree`'s ranking (see `best_size`); node gains are the acceptance
    model's calibrated values when one is given (engine/acceptance.py), else the builder's own.

    Only for trees of *selected* children (verified greedily or by target-sample-and-match, which
    accept any tree): the cut depends on the kept nodes' own values, which a rejection-verified tree
    of sampled children must not (`GrowthRule`)."""
    if tree.children_mode != "selected":
        raise ArborError(
            f"auto_subtree cuts selected trees only, got {tree.children_mode!r} children: "
            "grow sampled trees with GrowthRule instead"
        )
    values = calibrated_values(tree, acceptance)
    order = ranking(tree, values)
    n = best_size([values[i] for i in order], cost, draft_forwards)
    if n == len(order):
        return tree
    return tree.subtree(order[:n])


_EDGES = torch.tensor(EDGES, dtype=torch.float64)


class DrawMoments:
    """Per acceptance bucket (engine/acceptance.EDGES), the draft mass of a node's distribution D
    and the sum of D^2 over it: enough to give the expected calibrated value of the node's next draw
    without replacement before the draw is made (`expected_rate`)."""

    def __init__(self, dist: torch.Tensor) -> None:
        d = dist.detach().to("cpu", torch.float64)
        big = d[d > EDGES[0]]  # the few tokens above the first bucket
        buckets = torch.bucketize(big, _EDGES)  # = AcceptanceModel.bucket
        mass = torch.bincount(buckets, weights=big, minlength=len(EDGES) + 1)
        square = torch.bincount(buckets, weights=big * big, minlength=len(EDGES) + 1)
        mass[0] = float(d.sum()) - float(mass[1:].sum())  # the rest of the vocabulary
        square[0] = float(torch.dot(d, d)) - float(square[1:].sum())
        self.mass, self.square = mass.tolist(), square.tolist()

    def expected_rate(self, rate, drawn: list[float], rank: int) -> float:
        """E[rate(D(y), rank)] for the next draw y, drawn from D without the tokens already drawn
        (their draft probabilities `drawn`), i.e. from D restricted to the rest and renormalised.
        `rate` is affine in q within a bucket (the acceptance model's shrinkage; q itself without a
        model), so per bucket the expectation is the rate at the bucket's mean q:
        `sum over buckets of mass x rate(square / mass) / remaining mass`."""
        mass, square = list(self.mass), list(self.square)
        for q in drawn:
            b = AcceptanceModel.bucket(q)
            mass[b] -= q
            square[b] -= q * q
        total = sum(m for m in mass if m > 1e-12)
        if total <= 1e-12:
            return 0.0
        return (
            sum(
                m * rate(min(1.0, max(0.0, sq / m)), rank)
                for m, sq in zip(mass, square)
                if m > 1e-12
            )
            / total
        )


class GrowthRule:
    """`budget=auto` for trees of *sampled* children (DySpec, DySpec-threshold): which draws to
    make, decided before each draw is seen (docs/algorithms.md §7).

    A rejection-verified tree is lossless only if whether a node's k-th draw is kept depends on
    nothing but what was known before that draw: the earlier draws, other branches, the parent. A
    cut chosen after the tree is grown, by the values of the nodes it keeps, keeps likely draws more
    often than the draft draws them and biases the output (`tests/test_auto_size.py`). So every
    decision here uses values known beforehand:

    * a draw of a drafted node is made only if its *expected* calibrated value
      (`DrawMoments.expected_rate` x the parent's calibrated value) is at least `price`: the best
      step rate so far times the cheapest average cost of a node beyond the current size;
    * a draft forward for a node's children is paid only if they are expected to repay it: the
      node's calibrated value times the mean calibrated rate of the first two children of the nodes
      grown so far (`kappa`; at most one child is accepted, so at most the node's value) must buy
      the forward and a row.

    Nodes are valued as the acceptance model values them when there is one (a node's calibrated
    value is its parent's times `rate(q, rank)`), else by the builder's own values.
    """

    def __init__(
        self, cost: CostCurve, acceptance: AcceptanceModel | None, cap: int, ordered: bool = False
    ) -> None:
        """`ordered`: the draws are the draft's most likely tokens in order
        (temperature 0, `draw_value`)."""
        self.cost, self.acceptance, self.cap, self.ordered = cost, acceptance, cap, ordered
        self.values = [1.0]  # calibrated value per node, the root's 1 first
        self.prefix = [1.0]  # calibrated E[A] of the first k nodes grown, k = 0, 1, ...
        # best prefix score per number of draft forwards, kept up to date
        self._best: dict[int, float] = {}
        # per parent: calibrated rates of its first two children, summed
        self._first_two: dict[int, float] = {}

    @property
    def expected(self) -> float:
        return self.prefix[-1]

    def rate(self, q: float, rank: int) -> float:
        return self.acceptance.rate(q, rank) if self.acceptance is not None else q

    def add(self, tree: TokenTree, node: int) -> None:
        """Record `node` (the newest in `tree`)."""
        q, parent = tree.draft_probs[node], tree.parents[node]
        rank = len(tree.children[parent]) - 1  # `node` is its parent's newest child
        rate = self.rate(q, rank)
        self.values.append(self.values[parent] * rate)
        self.prefix.append(self.prefix[-1] + self.values[-1])
        if rank < 2:
            self._first_two[parent] = self._first_two.get(parent, 0.0) + rate
        size = len(self.prefix) - 1
        for forwards, best in self._best.items():
            self._best[forwards] = max(best, step_rate(self.cost, self.prefix[-1], size, forwards))

    def best(self, draft_forwards: int) -> float:
        """The best score of a prefix grown so far, with `draft_forwards` draft forwards paid."""
        if draft_forwards not in self._best:
            self._best[draft_forwards] = max(
                step_rate(self.cost, e, k, draft_forwards) for k, e in enumerate(self.prefix)
            )
        return self._best[draft_forwards]

    def price(self, size: int, draft_forwards: int) -> float:
        """The least a node must be expected to be worth to join a tree of `size` nodes: the best
        rate so far times the cheapest average cost per node of growing to some m > size nodes
        (`(cost(m) - cost(size)) / (m - size)`); infinite at the cap."""
        cheapest = self.cost.cheapest_growth(size, draft_forwards, self.cap)
        exchange = self.best(draft_forwards)
        # a node worth v adds v tokens and v x token_cost of cost: it pays when
        # v (1 - exchange x token_cost) covers exchange x its share of the rows
        return exchange * cheapest / max(1e-6, 1.0 - exchange * self.cost.token_cost)

    def expected_draw(self, parent: int, moments: DrawMoments, drawn: list[float]) -> float:
        """The expected calibrated value of `parent`'s next draw, given the draft probabilities of
        its earlier draws (`drawn`)."""
        return self.values[parent] * moments.expected_rate(self.rate, drawn, len(drawn))

    def moments(self, dist: torch.Tensor) -> DrawMoments | None:
        """What `draw_value` needs of a node's draft distribution: its `DrawMoments`; None for
        ordered draws, which are valued without them."""
        return None if self.ordered else DrawMoments(dist)

    def draw_value(
        self, parent: int, moments: DrawMoments | None, probs: list[float], k: int
    ) -> float:
        """The calibrated value of `parent`'s draw k as known before it is made. Ordered draws
        (temperature 0: the k-th most likely token, nothing random; verified greedily, which any
        tree passes losslessly) are valued exactly from their draft probability `probs[k]`; a random
        draw by its expectation (`expected_draw`), since looking at it first would bias the
        rejection verifier."""
        if self.ordered:
            return self.values[parent] * self.rate(probs[k], k)
        return self.expected_draw(parent, moments, probs[:k])

    def keep(self, size: int, expected_value: float, draft_forwards: int) -> bool:
        """Whether a draw expected to be worth `expected_value` joins a tree of `size` nodes."""
        return size < self.cap and expected_value >= self.price(size, draft_forwards)

    @property
    def kappa(self) -> float:
        """The mean calibrated rate of the first two children of the nodes with children so
        far (1 before any)."""
        return (
            min(1.0, sum(self._first_two.values()) / len(self._first_two))
            if self._first_two
            else 1.0
        )

    def children_worth(self, node: int) -> float:
        """What `node`'s children are expected to add: its calibrated value times `kappa`."""
        return self.values[node] * self.kappa

    def worth_forward(self, size: int, gain: float, draft_forwards: int, paid: int) -> bool:
        """Whether children expected to add `gain` repay one more draft forward (`draft_forwards`
        paid after it) and a row: the tree with them scores above the tree as it is
        with `paid` forwards."""
        if size >= self.cap:
            return False
        return step_rate(self.cost, self.expected + gain, size + 1, draft_forwards) > step_rate(
            self.cost, self.expected, size, paid
        )
