"""What the builders share: the two ways of growing children, and parameter checks.

The contracts a builder implements (`TreeBuilder`, drawing through a `DraftContext`)
live in `engine/contracts.py`, because the decode loop consumes them. Here:

* *sampled* children (chain, Sequoia, DySpec): `DrawSequence` holds a node's keyed
  draws without replacement and DySpec's value estimate of each draw, computed
  once, in closed form, for every builder that samples (docs/algorithms.md §3);
  `draw_children` adds the first k of them;
* *selected* children (OPT-Tree, EAGLE-2, C2T and the C2T trainer): `top_children`
  lets every node of a layer propose its top-k children, as `Candidates` the
  builder then filters and adds; `rank_nodes` orders a selected tree's nodes so
  that every prefix is a valid subtree (OPT-Tree, EAGLE-2, `budget=auto`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from ..engine.contracts import DraftContext
from ..engine.sampling import probability_support, sample_without_replacement
from ..engine.tree import TokenTree
from ..errors import ArborError


# ---------------------------------------------------------------------------- sampled children
@dataclass
class DrawSequence:
    """The keyed draws of one node: its children-to-be, in the order they are sampled.

    Value estimate (DySpec App. D, eq. 9-10): with `tails[k]` the draft mass not drawn
    before draw k, the k-th *slot* of node p ("the k-th draw") is verified with
    estimated probability `value[p] * tails[k]`, and the node it produces is accepted
    with `value[p] * D[y]` (= slot value * R[y], R the residual `D / tails[k]`).
    """

    dist: torch.Tensor  # [V] full draft distribution D(.|node)
    tokens: list[int]  # the first draws without replacement (only tokens with D > 0)
    probs: list[float]  # D[token] of each draw
    tails: list[float]  # tails[k] = mass of D not drawn before draw k (tails[0] = 1)

    @classmethod
    def of(cls, ctx: DraftContext, tree: TokenTree, node: int, limit: int) -> DrawSequence:
        dist = ctx.probs(tree, [node])[0]
        if ctx.cfg.ordered_draws:  # no noise: the most likely tokens in order, those with D > 0
            top = torch.topk(dist, min(limit, dist.numel()))
            drawn = [(y, q) for y, q in zip(top.indices.tolist(), top.values.tolist()) if q > 0]
            tokens, probs = [y for y, _ in drawn], [q for _, q in drawn]
        else:
            support = probability_support(dist)  # noise only for the tokens that can be drawn
            tokens = sample_without_replacement(
                dist, limit, ctx.gumbel(tree, node, support.numel()), support
            )
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
    return tree.add(
        parent,
        draws.tokens[k],
        value=draws.child_value(tree.values[parent], k),
        draft_prob=draws.probs[k],
    )


def draw_children(ctx: DraftContext, tree: TokenTree, node: int, k: int) -> list[int]:
    """Sample up to k children of `node` without replacement (keyed noise) and add them to the tree.

    Records the parent's draft distribution in `tree.child_dists` (what the `rejection`
    verifier replays) and gives each child the `DrawSequence` value estimate.
    """
    draws = DrawSequence.of(ctx, tree, node, k)
    return [add_draw(tree, draws, node, i) for i in range(len(draws))]


# ---------------------------------------------------------------------------- selected children
@dataclass
class Candidates:
    """Children proposed by a layer of frontier nodes, not yet in the tree.

    Parallel lists, one entry per candidate, each parent's candidates best first;
    `joint` is the candidate's path probability `p_hat = value[parent] * D[token]`.
    """

    dists: torch.Tensor  # [F, V] draft distributions of the frontier nodes (float32, CPU)
    rows: list[int]  # frontier row (index into `dists`) of each candidate's parent
    parents: list[int]
    tokens: list[int]
    depths: list[int]
    draft_probs: list[float]  # D(token | parent path)
    joint: list[float]

    def __len__(self) -> int:
        return len(self.tokens)

    def add(
        self, tree: TokenTree, order: list[int] | None = None, values: list[float] | None = None
    ) -> list[int]:
        """Add candidates `order` (indices; default all, in proposal order); node value =
        `values[i]`, default the joint probability. Returns the new node indices."""
        values = self.joint if values is None else values
        return [
            tree.add(
                self.parents[i], self.tokens[i], value=values[i], draft_prob=self.draft_probs[i]
            )
            for i in (range(len(self)) if order is None else order)
        ]


def top_children(ctx: DraftContext, tree: TokenTree, nodes: list[int], k: int) -> Candidates:
    """Each of `nodes` proposes its k most likely children (one batched draft forward); never a
    zero-probability token."""
    dists = ctx.probs(tree, nodes).float().cpu()  # [F, V]
    top = dists.topk(min(k, dists.shape[-1]), dim=-1)  # values / indices [F, k]
    cands = Candidates(dists, [], [], [], [], [], [])
    for row, (node, probs, tokens) in enumerate(
        zip(nodes, top.values.tolist(), top.indices.tolist())
    ):
        for prob, token in zip(probs, tokens):
            if prob <= 0:
                break
            cands.rows.append(row)
            cands.parents.append(node)
            cands.tokens.append(token)
            cands.depths.append(tree.depths[node] + 1)
            cands.draft_probs.append(prob)
            cands.joint.append(tree.values[node] * prob)
    return cands


def rank_nodes(tree: TokenTree, values: list[float] | None = None) -> list[int]:
    """Non-root nodes, best first: by value (default the tree's own, = p_hat; or other per-node
    `values`, e.g. calibrated ones) descending, then depth, then index. Every prefix is
    parent-closed as long as no node is worth more than its parent."""
    values = tree.values if values is None else values
    return sorted(range(1, tree.num_nodes), key=lambda i: (-values[i], tree.depths[i], i))


# ---------------------------------------------------------------------------- parameters
def require_positive(**values: int | float | None) -> None:
    """One-line ArborError unless every given value is >= 1 (None: not given, not checked)."""
    for key, value in values.items():
        if value is not None and value < 1:
            raise ArborError(f"{key} must be >= 1, got {value}")
