"""An online acceptance model: how often the target really accepts a draft node of draft probability q.

The builders value a node by its path's draft probabilities (docs/algorithms.md §3): taken at face value
they say how likely the *draft* thinks the path is, not how likely the *target* accepts it. At T = 0 the
shipped head is nearly calibrated; at T = 0.6 DySpec's trees with it are estimated at 2.74 tokens per step
where 1.76 are accepted (benchmarks/speed-mtbench-t06). `AcceptanceModel` learns, during one generation, the map

    q (the node's own draft probability, in 10 buckets) -> P(the target accepts the node | its parent was accepted)

from the verifier's outcomes (every child of every node on the accepted path is an observation), shrunk
toward q itself by `prior` pseudo-observations so that it starts at face value. A node's calibrated value
is the product of the map along its path; a tree's calibrated E[accepted length] is 1 + their sum.

`budget=auto` sizes trees with the calibrated values (builders/auto_size.py), the step statistics record
the calibrated estimate next to the builder's own, and the report plots both against the actual lengths.
It never changes which nodes a builder proposes or how they are verified, so it cannot change the output.
"""

from __future__ import annotations

import bisect

from .tree import TokenTree

EDGES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9)  # bucket upper edges; the last bucket ends at 1


class AcceptanceModel:
    """Per-bucket counts of examined and accepted children; `rate(q)` = shrunk acceptance rate."""

    def __init__(self, prior: float = 4.0) -> None:
        self.prior = prior
        self.examined = [0] * (len(EDGES) + 1)
        self.accepted = [0] * (len(EDGES) + 1)

    @staticmethod
    def bucket(q: float) -> int:
        return bisect.bisect_left(EDGES, q)

    def rate(self, q: float) -> float:
        """P(accepted | examined, draft probability q): (accepted + prior q) / (examined + prior)."""
        b = self.bucket(q)
        return (self.accepted[b] + self.prior * q) / (self.examined[b] + self.prior)

    def update(self, draft_probs: list[float], accepted: list[bool]) -> None:
        """One step's outcomes: the children of the nodes on the accepted path, and whether each was accepted."""
        for q, ok in zip(draft_probs, accepted):
            b = self.bucket(q)
            self.examined[b] += 1
            self.accepted[b] += bool(ok)

    def node_values(self, tree: TokenTree) -> list[float]:
        """Calibrated probability that each node is accepted (root: 1): the product of `rate` along its path."""
        values = [1.0] * tree.num_nodes
        for i in range(1, tree.num_nodes):  # parents precede children
            values[i] = values[tree.parents[i]] * self.rate(tree.draft_probs[i])
        return values

    def expected_length(self, tree: TokenTree) -> float:
        """Calibrated E[accepted length] of `tree`, bonus token included."""
        return sum(self.node_values(tree))
