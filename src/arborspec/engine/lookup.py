"""Context lookup: a chain of tokens copied from earlier in the context, grafted
onto the draft's tree.

Small models repeat themselves, and code repeats its identifiers and the signature it was asked for:
when the last n committed tokens (n = `max_n` down to `min_n`) occurred earlier in the prompt or the
answer, the tokens that followed their latest earlier occurrence are a guess at what comes next that
costs no draft forward (prompt lookup decoding, Saxena 2023; SAM-Decoding, Hu et al. 2024, adds such
retrieval to EAGLE's trees). `ContextLookup.propose` returns up to `max_tokens` of them; `graft`
hangs them under the root of the tree a builder made, walking down the children the tree already has
where they hold the chain's next token and adding nodes for the rest. The target verifies the
grafted nodes with the others in the same forward (docs/algorithms.md §9).

Lossless with every verifier. Greedy (T = 0) and target-sample-and-match never read draft
probabilities, so any tree is lossless for them. The rejection verifiers replay the distribution
each node's children were drawn from, which a grafted node was not drawn from: `graft` lists the
nodes it adds in `tree.point_masses`, and those verifiers judge each as a candidate proposed by a
point mass on its token, after the drawn children of its parent (accepted with probability R[g],
g then taken out of the residual R; `verifiers.py`, docs/algorithms.md §9). A chain token that a
drawn child already holds is that child, judged once, as drawn. Grafted nodes carry value 0 and
draft probability 0, and the decoder leaves them out of the acceptance model's calibration.

With `budget=auto` at temperature 0 the chain is priced like a tree's nodes (`LookupPrice`): its
k-th token is worth r^k, r the rate at which this generation's grafted tokens were accepted so far,
and only the prefix that raises the step's expected tokens per unit of time on the measured cost
curve is grafted; none, when copying does not pay (prose the context does not repeat), so that the
step verifies only what the draft proposed, or the root alone: a plain step. Greedy verification
accepts any tree, so the cut is lossless; above temperature 0 the whole chain is grafted, as a cut
that looks at the tree the draft drew could bias the rejection verifiers.
"""

from __future__ import annotations

from .tree import TokenTree

# the grafted tokens a generation starts from when pricing its chains: 1 accepted of 2 examined
PRIOR_ACCEPTED, PRIOR_EXAMINED = 1.0, 2.0


class ContextLookup:
    """Latest earlier occurrence of the context's last n tokens, for n = max_n .. min_n;
    indexed incrementally.

    One instance follows one growing sequence (the decoder makes one per generation): each `propose`
    indexes only the positions the context gained since the last call."""

    def __init__(self, max_tokens: int, min_n: int = 2, max_n: int = 4) -> None:
        if max_tokens < 1 or not 1 <= min_n <= max_n:
            raise ValueError(
                "lookup needs max_tokens >= 1 and 1 <= min_n <= max_n, got "
                f"{max_tokens}, {min_n}, {max_n}"
            )
        self.max_tokens, self.min_n, self.max_n = max_tokens, min_n, max_n
        self.indexed = 0  # n-grams ending (exclusive) at 1 .. indexed - 1 are in `ends`
        # n-gram -> end (exclusive) of its latest indexed occurrence
        self.ends: dict[tuple[int, ...], int] = {}

    def propose(self, context: list[int]) -> list[int]:
        """Up to `max_tokens` tokens that followed the latest earlier occurrence of the
        longest matching suffix.

        Indexed first: every n-gram `context[end - n:end]` with end < len(context), i.e. all but the
        suffix itself (which ends at len and must not match itself)."""
        for end in range(max(self.indexed, 1), len(context)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self.ends[tuple(context[end - n : end])] = end
        self.indexed = max(self.indexed, len(context))
        for n in range(self.max_n, self.min_n - 1, -1):
            if len(context) <= n:
                continue
            end = self.ends.get(tuple(context[-n:]))
            if end is not None:
                return context[end : end + self.max_tokens]
        return []


def graft(tree: TokenTree, chain: list[int]) -> list[int]:
    """Hang `chain` under the root of `tree`: follow the child holding each next token while there
    is one, then add the rest as new nodes (value 0, draft probability 0), each listed in
    `tree.point_masses`. Returns the indices of the added nodes."""
    node, added = 0, []
    for token in chain:
        child = next((c for c in tree.children[node] if tree.tokens[c] == token), None)
        if child is None:
            child = tree.add(node, token, 0.0, 0.0)
            tree.point_masses.add(child)
            added.append(child)
        node = child
    return added


class LookupPrice:
    """How much of a lookup chain pays its rows (module doc), for one generation: the online rate
    at which grafted tokens are accepted, and the prefix it buys."""

    def __init__(self) -> None:
        self.accepted, self.examined = PRIOR_ACCEPTED, PRIOR_EXAMINED

    @property
    def rate(self) -> float:
        """Accepted grafted tokens over examined ones (each chain examined up to its first
        rejected token), with the prior."""
        return self.accepted / self.examined

    def update(self, grafted: int, accepted: int) -> None:
        """A step grafted `grafted` tokens, of which the verifier accepted `accepted`."""
        if grafted:
            self.accepted += accepted
            self.examined += min(grafted, accepted + 1)

    def prefix(
        self, chain: list[int], expected: float, size: int, forwards: int, cost
    ) -> list[int]:
        """The prefix of `chain` to graft onto a tree of `size` nodes expected to commit `expected`
        tokens with `forwards` draft forwards: the k maximising `(expected + r + ... + r^k) /
        cost.step_cost(size + k, forwards)` (`cost`: an `engine.cost.CostCurve`; every chain token
        counted as a new row)."""
        best_k, best, value, gain = 0, expected / cost.step_cost(size, forwards), 1.0, 0.0
        for k in range(1, len(chain) + 1):
            value *= self.rate
            gain += value
            score = (expected + gain) / cost.step_cost(size + k, forwards)
            if score > best:
                best_k, best = k, score
        return chain[:best_k]
