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
"""

from __future__ import annotations

from .tree import TokenTree


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
