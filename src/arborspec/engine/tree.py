"""`TokenTree`: the one tree of draft tokens used by every builder, verifier and the engine.

Node 0 is the *root*: the last committed token, which the target has not seen
yet. Every other node is a draft token proposed as a continuation of its
parent. Children are kept in the order they were proposed, because the
rejection verifiers must see them in that order.

For a *sampled* tree (`children_mode` is "without_replacement" or
"with_replacement") `child_dists[node]` holds the exact draft distribution the
node's first child was drawn from; the verifier re-derives the residuals of
the later siblings from it (without replacement) or re-uses it (with
replacement). For a *selected* tree (top-k, rerank, classifier pruning) no
distribution is needed: such a tree is verified greedily or by
target-sample-and-match (see `verifiers.py`).

Nodes added after the builder, from outside its draws (the context lookup's grafted tokens,
`lookup.py`), are in `point_masses`: each was proposed by a point mass on its own token, and the
rejection verifiers judge it as such, after its parent's drawn children (docs/algorithms.md §9).

Tree size = number of draft nodes, root excluded. Depth of the root = 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

ChildrenMode = Literal["without_replacement", "with_replacement", "selected"]


@dataclass
class TokenTree:
    tokens: list[int]
    parents: list[int]
    depths: list[int]
    values: list[float]  # estimated probability that the node gets accepted (root: 1.0)
    children: list[list[int]]
    children_mode: ChildrenMode = "selected"
    # node -> [V] probs its children came from
    child_dists: dict[int, torch.Tensor] = field(default_factory=dict)
    # D(token | parent path) of each node (root: 1.0)
    draft_probs: list[float] = field(default_factory=list)
    # nodes proposed by a point mass on their own token, not drawn from their parent's child_dists
    point_masses: set[int] = field(default_factory=set)

    @classmethod
    def from_root(cls, root_token: int, children_mode: ChildrenMode = "selected") -> TokenTree:
        return cls([int(root_token)], [-1], [0], [1.0], [[]], children_mode, {}, [1.0], set())

    # ------------------------------------------------------------------ building
    def add(self, parent: int, token: int, value: float = 0.0, draft_prob: float = 0.0) -> int:
        """Append a child of `parent` (after its existing children) and return its index."""
        if not 0 <= parent < len(self.tokens):
            raise IndexError(f"parent {parent} not in tree of {len(self.tokens)} nodes")
        idx = len(self.tokens)
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.values.append(float(value))
        self.children.append([])
        self.children[parent].append(idx)
        self.draft_probs.append(float(draft_prob))
        return idx

    # ------------------------------------------------------------------ queries
    @property
    def num_nodes(self) -> int:
        """All nodes, root included (= rows of the verification forward)."""
        return len(self.tokens)

    @property
    def size(self) -> int:
        """Draft nodes, root excluded (the tree budget counts these)."""
        return len(self.tokens) - 1

    @property
    def depth(self) -> int:
        return max(self.depths)

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's first child down to `node` (root excluded)."""
        path = []
        while node > 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def path_tokens(self, node: int) -> list[int]:
        return [self.tokens[i] for i in self.path_to(node)]

    def ancestors_mask(self) -> torch.Tensor:
        """[N, N] bool: entry (i, j) is True when j is i itself or an ancestor of i."""
        n = self.num_nodes
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            mask[i, i] = True
            p = self.parents[i]
            if p >= 0:
                # parents always precede children, so row p is complete already
                mask[i] |= mask[p]
        return mask

    def position_ids(self, offset: int, device=None) -> torch.Tensor:
        """[1, N] positions: `offset + depth(node)`; offset is the root's position."""
        return (torch.tensor(self.depths, dtype=torch.long, device=device) + offset).unsqueeze(0)

    def attention_mask(self, past_len: int, dtype: torch.dtype, device=None) -> torch.Tensor:
        """[1, 1, N, past_len + N] additive mask: 0 where a node may attend, dtype-min elsewhere."""
        n = self.num_nodes
        allowed = torch.ones(n, past_len + n, dtype=torch.bool, device=device)
        allowed[:, past_len:] = self.ancestors_mask().to(device)
        return additive_mask(allowed, dtype)[None, None]

    def estimated_accept_length(self) -> float:
        """Sum of node values + 1 (the bonus token): the builder's own E[accepted length]."""
        return 1.0 + sum(self.values[1:])

    def validate(self) -> None:
        """Raise if the structure is inconsistent (cheap; used in tests and on user shapes)."""
        n = self.num_nodes
        assert len(self.parents) == len(self.depths) == len(self.values) == len(self.children) == n
        assert self.parents[0] == -1 and self.depths[0] == 0
        for i in range(1, n):
            p = self.parents[i]
            assert 0 <= p < i, f"node {i} has parent {p}: parents must precede children"
            assert self.depths[i] == self.depths[p] + 1
            assert i in self.children[p]
        assert all(0 < i < n for i in self.point_masses), "a point mass must be a draft node"
        for node, kids in enumerate(self.children):
            toks = [self.tokens[k] for k in kids]
            if self.children_mode != "with_replacement":
                assert len(set(toks)) == len(toks), f"node {node} has duplicate children {toks}"

    # ------------------------------------------------------------------ subtrees and reordering
    def subtree(self, keep: list[int]) -> TokenTree:
        """A new tree of the root and the nodes `keep` (each node's parent must be kept too).

        Node order, sibling order, the recorded draft distributions and the point masses are kept,
        so a sampled tree stays verifiable as long as each node keeps a *prefix* of its draws.
        """
        keep = sorted(set(keep) - {0})
        out = TokenTree.from_root(self.tokens[0], self.children_mode)
        new_of = {0: 0}
        for i in keep:
            if self.parents[i] not in new_of:
                raise ValueError(f"node {i} is kept without its parent {self.parents[i]}")
            new_of[i] = out.add(
                new_of[self.parents[i]], self.tokens[i], self.values[i], self.draft_probs[i]
            )
        out.child_dists = {
            new_of[n]: d
            for n, d in self.child_dists.items()
            if n in new_of and out.children[new_of[n]]
        }
        out.point_masses = {new_of[n] for n in self.point_masses if n in new_of}
        return out

    def permuted(self, order: list[int]) -> TokenTree:
        """A copy with nodes renumbered so that new node k is old node `order[k]`.

        `order` must start with 0 and list every parent before its children.
        Sibling order (which the verifiers depend on) is preserved.
        """
        assert order[0] == 0 and sorted(order) == list(range(self.num_nodes))
        new_of = {old: new for new, old in enumerate(order)}
        tree = TokenTree(
            tokens=[self.tokens[o] for o in order],
            parents=[-1 if self.parents[o] < 0 else new_of[self.parents[o]] for o in order],
            depths=[self.depths[o] for o in order],
            values=[self.values[o] for o in order],
            children=[[new_of[c] for c in self.children[o]] for o in order],
            children_mode=self.children_mode,
            child_dists={new_of[k]: v for k, v in self.child_dists.items()},
            draft_probs=[self.draft_probs[o] for o in order],
            point_masses={new_of[n] for n in self.point_masses},
        )
        tree.validate()
        return tree


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool "may attend" -> additive float mask in the model dtype (the safe form
    for sdpa and eager)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)
