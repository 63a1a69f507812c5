"""An online acceptance model: how often the target really accepts a draft node
of draft probability q.

The builders value a node by its path's draft probabilities (docs/algorithms.md §3): taken at face
value they say how likely the *draft* thinks the path is, not how likely the *target* accepts it,
and above temperature 0 they can over-state acceptance by far (docs/algorithms.md §7, "Calibrated
values"). `AcceptanceModel` learns, during one generation, the map

    (q, r) -> P(the target accepts the node | its parent was accepted)

(q: the node's own draft probability, in 10 buckets; r: its rank among its siblings, 1st, 2nd, 3rd
or later) from the verifier's outcomes (every child of every node on the accepted path is an
observation). Two levels of shrinkage: the rate of q's bucket over all ranks is shrunk toward q
itself by `prior` pseudo-observations (so the model starts at face value), and the (bucket, rank)
rate toward that by `rank_prior`. The rank matters above temperature 0: a later sibling is examined
only after the earlier ones were rejected, against the target's residual distribution, which has no
mass where the draft over-weights, so a 2nd child of draft probability 0.3 is accepted less often
than a 1st child of 0.3. A node's calibrated value is the product of the map along its path; a
tree's calibrated E[accepted length] is 1 + their sum.

Starting each generation at face value makes its first steps' estimates the worst. So a decoder
hands the model it ended a generation with, scaled down to `CARRY` observations (`carried`), to its
next generation at the same sampling settings (engine/decode.py).

`budget=auto` sizes trees with the calibrated values (builders/auto_size.py), the step statistics
record the calibrated estimate next to the builder's own, and the report plots both against the
actual lengths. It never changes which nodes a builder proposes or how they are verified, so it
cannot change the output.
"""

from __future__ import annotations

import bisect

from .tree import TokenTree

# observations a decoder's next generation inherits at most (`AcceptanceModel.carried`)
CARRY = 128.0
# bucket upper edges; the last bucket ends at 1
EDGES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9)
RANKS = 3  # sibling ranks told apart: 1st, 2nd, 3rd and later


class AcceptanceModel:
    """Counts of examined and accepted children per q bucket and per (bucket, rank); `rate(q, rank)`
    = the shrunk acceptance rate (module doc)."""

    def __init__(self, prior: float = 4.0, rank_prior: float = 8.0) -> None:
        self.prior, self.rank_prior = prior, rank_prior
        self.examined = [0] * (len(EDGES) + 1)
        self.accepted = [0] * (len(EDGES) + 1)
        self.examined_by_rank = [[0] * RANKS for _ in self.examined]
        self.accepted_by_rank = [[0] * RANKS for _ in self.examined]

    @staticmethod
    def bucket(q: float) -> int:
        return bisect.bisect_left(EDGES, q)

    def rate(self, q: float, rank: int = 0) -> float:
        """P(accepted | examined, draft probability q, sibling rank `rank` (0 = first)): the
        bucket's rate `(accepted + prior q) / (examined + prior)`, then the rank's
        `(accepted + rank_prior x that) / (examined + rank_prior)` within the bucket."""
        b, r = self.bucket(q), min(rank, RANKS - 1)
        pooled = (self.accepted[b] + self.prior * q) / (self.examined[b] + self.prior)
        return (self.accepted_by_rank[b][r] + self.rank_prior * pooled) / (
            self.examined_by_rank[b][r] + self.rank_prior
        )

    def update(
        self, draft_probs: list[float], accepted: list[bool], ranks: list[int] | None = None
    ) -> None:
        """One step's outcomes: the children of the nodes on the accepted path, whether each was
        accepted, and each one's sibling rank (None: all first)."""
        for q, ok, rank in zip(draft_probs, accepted, ranks or [0] * len(draft_probs)):
            b, r = self.bucket(q), min(rank, RANKS - 1)
            self.examined[b] += 1
            self.accepted[b] += bool(ok)
            self.examined_by_rank[b][r] += 1
            self.accepted_by_rank[b][r] += bool(ok)

    def carried(self, cap: float = CARRY) -> AcceptanceModel:
        """A new model that starts where this one ended: the same rates, from counts scaled down to
        at most `cap` observations in all, so that the next generation's own outcomes
        soon outweigh them."""
        total = sum(self.examined)
        scale = min(1.0, cap / total) if total else 1.0
        out = AcceptanceModel(self.prior, self.rank_prior)
        out.examined = [n * scale for n in self.examined]
        out.accepted = [n * scale for n in self.accepted]
        out.examined_by_rank = [[n * scale for n in row] for row in self.examined_by_rank]
        out.accepted_by_rank = [[n * scale for n in row] for row in self.accepted_by_rank]
        return out

    def node_values(self, tree: TokenTree) -> list[float]:
        """Calibrated probability that each node is accepted (root: 1): the product of
        `rate` along its path."""
        values = [1.0] * tree.num_nodes
        for parent, kids in enumerate(tree.children):  # parents precede children
            for rank, kid in enumerate(kids):
                values[kid] = values[parent] * self.rate(tree.draft_probs[kid], rank)
        return values

    def expected_length(self, tree: TokenTree) -> float:
        """Calibrated E[accepted length] of `tree`, bonus included."""
        return sum(self.node_values(tree))
