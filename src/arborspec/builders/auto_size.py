"""`budget=auto`: the tree size that maximises expected accepted tokens per unit of step time.

A step that verifies a tree of n draft nodes costs, in units of one plain target
forward, `t(n + 1) + f * c` (the measured cost curve `engine/cost.CostCurve`: n nodes
plus the root, and f draft forwards of relative cost c) and is expected to commit
`E[A](n) = 1 + sum of the values of its n nodes` tokens (the builder's own estimate,
bonus included). `budget=auto` keeps the n, up to the builder's `budget` (now a cap),
that maximises `E[A](n) - lam x (t(n + 1) + f * c)`, lam being the generation's tokens per
unit of cost so far (engine/long_run.py): the sizes that maximise the whole generation's
throughput, not each step's own rate (`objective=long-run`, the default; `objective=step`,
and the first steps of a generation, maximise the step's rate `E[A](n) / (t(n + 1) + f * c)`;
docs/algorithms.md §7).

Which n nodes: the best-ranked ones, in an order in which every node comes after its
parent and after its earlier siblings, so every prefix is a tree the builder's verifier
accepts as is:

* selected trees (OPT-Tree): calibrated value (else the builder's own path probability) descending, then
  depth, then index (a calibrated value is a product of rates <= 1 along the path, so it never exceeds the
  parent's and every prefix is parent-closed);
* sampled trees (DySpec): the probability that the verifier *looks at* the node
  (its slot value: parent value x draft mass not drawn before it) descending, then
  index. A node keeps a prefix of its draws, as the rejection verifier requires.

The expected lengths come from the generation's online acceptance model when the engine
keeps one (engine/acceptance.py: the builder's values calibrated against the verifier's
outcomes so far), else from the builder's own values; the ranking is always the builder's.

The size never changes what the verifier does with a tree, so `budget=auto` is as
lossless as the builder (greedy identity and distribution tests cover it).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.acceptance import AcceptanceModel
from ..engine.cost import CostCurve
from ..engine.tree import TokenTree
from ..errors import ArborError
from .base import rank_nodes


OBJECTIVES = ("long-run", "step")


@dataclass(frozen=True)
class Objective:
    """What `budget=auto` maximises over the sizes n of one step (docs/algorithms.md §7).

    `long_run` None: the step's own rate `E[A](n) / cost(n)`. A number lam (the generation's tokens per unit of
    modelled cost so far, engine/long_run.py): `E[A](n) - lam x cost(n)`, the rule that maximises the
    generation's throughput (the two agree when lam is the step's own best rate)."""

    cost: CostCurve
    long_run: float | None = None

    def of(self, expected: float, step_cost: float) -> float:
        """The score of a tree expected to commit `expected` tokens at `step_cost`."""
        return expected / step_cost if self.long_run is None else expected - self.long_run * step_cost

    def score(self, expected: float, size: int, draft_forwards: int) -> float:
        return self.of(expected, self.cost.step_cost(size, draft_forwards))

    def can_beat(self, expected: float, size: int, bound: float, cap: int, draft_forwards: int, best: float) -> bool:
        """Whether some size m in size+1 .. cap, with every node beyond `size` worth `bound`, scores above `best`."""
        costs = self.cost.step_costs(draft_forwards, cap)
        return any(self.of(expected + (m - size) * bound, costs[m]) > best for m in range(size + 1, cap + 1))

    def exchange(self, best_score: float) -> float:
        """Tokens a unit of cost must buy to be worth paying: the step's best rate, or lam."""
        return best_score if self.long_run is None else self.long_run


def as_objective(objective: Objective | CostCurve) -> Objective:
    """A bare cost curve means the step's own rate."""
    return objective if isinstance(objective, Objective) else Objective(objective)


def objective_for(name: str, cost: CostCurve, long_run: float | None) -> Objective:
    """The objective a builder's `objective` parameter names ("long-run": lam = `long_run` once the
    generation has one, else the step's own rate; "step": always the step's own rate)."""
    return Objective(cost, long_run if name == "long-run" else None)


def check_objective(name: str) -> None:
    if name not in OBJECTIVES:
        raise ArborError(f"objective must be one of {', '.join(OBJECTIVES)}, got {name!r}")


def require_cost(name: str, cost: CostCurve | None) -> CostCurve:
    """The cost curve a `budget=auto` builder was given; a one-line error without one."""
    if cost is None:
        raise ArborError(f"{name} with auto=true needs the measured cost curve: run it through the decoder "
                         "(SpeculativeDecoder measures it) or pass cost= to the DraftContext")
    return cost


def best_prefix(gains: list[float], objective: Objective | CostCurve, draft_forwards: int) -> tuple[int, float]:
    """The n in 0..len(gains) maximising the objective's score of `E[A] = 1 + sum(gains[:n])` (by default
    `E[A] / cost.step_cost(n, draft_forwards)`; `gains` in ranking order; the smallest such n on ties), and
    that score."""
    objective = as_objective(objective)
    best_n, best, expected = 0, objective.score(1.0, 0, draft_forwards), 1.0
    for n, gain in enumerate(gains, start=1):
        expected += gain
        score = objective.score(expected, n, draft_forwards)
        if score > best:
            best_n, best = n, score
    return best_n, best


def best_size(gains: list[float], objective: Objective | CostCurve, draft_forwards: int) -> int:
    """The n of `best_prefix`."""
    return best_prefix(gains, objective, draft_forwards)[0]


def cannot_improve(expected: float, size: int, bound: float, cap: int, objective: Objective | CostCurve,
                   draft_forwards: int, best: float) -> bool:
    """True when no tree grown further (sizes size+1 .. cap) can beat the score `best`, given that every node
    still to come is worth at most `bound` and at least `draft_forwards` draft forwards are paid."""
    return not as_objective(objective).can_beat(expected, size, bound, cap, draft_forwards, best)


def slot_values(tree: TokenTree) -> list[float]:
    """Per node, the estimated probability that the verifier examines it: parent value x draft mass
    not drawn before it (root: 1). For a sampled tree this never grows along a path or a sibling list."""
    out = [1.0] * tree.num_nodes
    for parent, kids in enumerate(tree.children):
        drawn = 0.0
        for kid in kids:
            out[kid] = tree.values[parent] * max(0.0, 1.0 - drawn)
            drawn += tree.draft_probs[kid]
    return out


def ranking(tree: TokenTree, values: list[float] | None = None) -> list[int]:
    """Non-root nodes in an order where every prefix is a valid tree for the tree's verifier (see module doc).
    A selected tree may be ranked by other per-node `values` (the calibrated ones), provided no node is worth more
    than its parent: any parent-closed subset of a selected tree is a valid tree."""
    if tree.children_mode == "selected":
        return rank_nodes(tree, values)
    slots = slot_values(tree)
    return sorted(range(1, tree.num_nodes), key=lambda i: (-slots[i], i))


def calibrated_values(tree: TokenTree, acceptance: AcceptanceModel | None) -> list[float]:
    """Per node, the acceptance model's calibrated value when one is given, else the builder's own."""
    return acceptance.node_values(tree) if acceptance is not None else tree.values


def layer_to_draft(tree: TokenTree, layer: list[int], objective: Objective | CostCurve, draft_forwards: int,
                   acceptance: AcceptanceModel | None, cap: int) -> list[int]:
    """For a builder that grows layer by layer (OPT-Tree): the nodes of `layer` whose children could still
    raise the best score of the tree so far (its best prefix of at most `cap` nodes, calibrated values) after
    paying one more draft forward; empty: stop growing.

    A node is dropped when it is worth less than the cheapest average price of a node beyond the best prefix
    (`exchange x (step cost(m) - step cost(n)) / (m - n)`, minimised over m; the exchange is the best rate,
    or lam for the long-run objective): its children, worth less still, can never pay for their rows. Then
    the layer as a whole: at most one child of a node is accepted, so the children are worth at most their
    parent each and at most the layer's total value together; the best tree of m nodes holds some j children
    and the m - j best nodes already there (a full tree gains by swapping its weakest); if no m beats the
    score, the layer is not worth its forward."""
    objective = as_objective(objective)
    cost = objective.cost
    values = calibrated_values(tree, acceptance)
    gains = [values[i] for i in ranking(tree, values)[:cap]]
    n, score = best_prefix(gains, objective, draft_forwards + 1)
    base = cost.step_cost(n, draft_forwards + 1)
    price = min(((cost.step_cost(m, draft_forwards + 1) - base) / (m - n) for m in range(n + 1, cap + 1)),
                default=0.0)
    layer = [i for i in layer if values[i] >= objective.exchange(score) * price]
    top = max((values[i] for i in layer), default=0.0)
    total = sum(values[i] for i in layer)
    prefix = [0.0]
    for gain in gains:
        prefix.append(prefix[-1] + gain)
    best = best_prefix(gains, objective, draft_forwards)[1]
    for m in range(1, cap + 1):
        expected = 1.0 + max(prefix[min(m - j, len(gains))] + min(total, j * top) for j in range(m + 1))
        if objective.score(expected, m, draft_forwards + 1) > best:
            return layer
    return []


def auto_subtree(tree: TokenTree, objective: Objective | CostCurve, draft_forwards: int,
                 acceptance: AcceptanceModel | None = None) -> TokenTree:
    """The best-scoring prefix of `tree`'s ranking (see `best_size`); node gains are the acceptance model's
    calibrated values when one is given (engine/acceptance.py), else the builder's own."""
    values = calibrated_values(tree, acceptance)
    order = ranking(tree, values)
    n = best_size([values[i] for i in order], objective, draft_forwards)
    if n == len(order):
        return tree
    return tree.subtree(order[:n])


class GrowthStop:
    """When a tree grown node by node in ranking order (DySpec's heap) can stop: no larger tree can
    beat the best prefix grown so far (`cannot_improve`), both priced with the draft forwards paid now.

    Nodes are valued as `auto_subtree` will value them, by the acceptance model when there is one:
    a node's calibrated value is its parent's times `rate(q)`. The nodes still to come are bounded by
    the best open slot's value (the builder's own), scaled by the calibrated-to-own ratio of the
    nodes so far: with a draft that over-states its acceptance (T > 0) the tree stops where its
    calibrated value stops paying, instead of growing to the cap and drafting nodes the cut discards.
    """

    def __init__(self, objective: Objective | CostCurve, acceptance: AcceptanceModel | None, cap: int) -> None:
        self.objective, self.acceptance, self.cap = as_objective(objective), acceptance, cap
        self.values = [1.0]  # calibrated value per node, the root's 1 first
        self.prefix = [1.0]  # calibrated E[A] of the first k nodes grown, k = 0, 1, ...
        self.own_sum = 0.0
        self._best: dict[int, float] = {}  # best prefix score per number of draft forwards, kept up to date

    @property
    def expected(self) -> float:
        return self.prefix[-1]

    def add(self, tree: TokenTree, node: int) -> None:
        """Record `node` (the newest in `tree`)."""
        q, parent = tree.draft_probs[node], tree.parents[node]
        rank = len(tree.children[parent]) - 1  # `node` is its parent's newest child
        rate = self.acceptance.rate(q, rank) if self.acceptance is not None else q
        self.values.append(self.values[parent] * rate)
        self.prefix.append(self.prefix[-1] + self.values[-1])
        self.own_sum += tree.values[node]
        size = len(self.prefix) - 1
        for forwards, best in self._best.items():
            self._best[forwards] = max(best, self.objective.score(self.prefix[-1], size, forwards))

    def best(self, draft_forwards: int) -> float:
        """The best score of a prefix grown so far, with `draft_forwards` draft forwards paid."""
        if draft_forwards not in self._best:
            self._best[draft_forwards] = max(self.objective.score(e, k, draft_forwards) for k, e in enumerate(self.prefix))
        return self._best[draft_forwards]

    def done(self, tree: TokenTree, best_open_slot: float, draft_forwards: int, paid: int | None = None) -> bool:
        """True when growing past `tree.size` nodes, paying `draft_forwards` forwards, cannot beat the best
        prefix so far with `paid` forwards (default: the same)."""
        scale = (self.expected - 1.0) / self.own_sum if self.own_sum > 0 else 1.0
        best = self.best(draft_forwards if paid is None else paid)
        return cannot_improve(self.expected, tree.size, best_open_slot * scale, self.cap, self.objective,
                              draft_forwards, best)

    def can_pay(self, tree: TokenTree, slot_value: float, draft_forwards: int, paid: int | None = None) -> bool:
        """Whether nodes worth `slot_value` (the builder's own), with `draft_forwards` forwards paid, could
        still beat the best prefix so far with `paid` forwards: what a slot must be worth to have its
        distribution drafted."""
        return not self.done(tree, slot_value, draft_forwards, paid)
