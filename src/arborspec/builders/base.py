"""What every tree builder shares: the `TreeBuilder` base class and the `DraftContext` it draws from.

A builder turns draft distributions into a `TokenTree` rooted at the last
committed token. It declares `children_mode`:

* "without_replacement" — siblings were *sampled* one after another from the
  renormalised residual of the parent's draft distribution (verifier: `rejection`);
* "with_replacement" — siblings are i.i.d. draws (verifier: `rejection-wr`);
* "selected" — nodes were *chosen* by their own probability or a score
  (verifier: `greedy` at temperature 0, `sample-match` above).

The engine picks the verifier from this declaration and refuses lossy pairings.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from ..drafters import Drafter
from ..errors import ArborError
from ..engine.sampling import SamplingConfig, gumbel_like, probs_from_logits, sample_without_replacement
from ..engine.tree import ChildrenMode, TokenTree


class DraftContext:
    """The draft side of one step: cached per-node draft probabilities and keyed random noise.

    `probs(tree, nodes)` returns `[K, V]` draft probabilities (after the draft-side
    sampling transform) at each node, running the drafter only for nodes not
    seen before in this step. `gumbel(tree, node)` returns Gumbel noise keyed by
    the node's token path and the step's seed, so that two builders growing the
    same node see the same random draws (what makes DySpec's greedy and
    threshold variants comparable).
    """

    def __init__(self, drafter: Drafter, cfg: SamplingConfig, generator: torch.Generator, root_logits: torch.Tensor):
        self.drafter, self.cfg, self.generator = drafter, cfg, generator
        self.step_seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
        self._probs: dict[tuple[int, ...], torch.Tensor] = {(): probs_from_logits(root_logits, cfg)}
        self.vocab_size = root_logits.shape[-1]

    def probs(self, tree: TokenTree, nodes: list[int]) -> torch.Tensor:  # [K, V]
        keys = [tuple(tree.path_tokens(n)) for n in nodes]
        todo = [n for n, key in zip(nodes, keys) if key not in self._probs]
        todo = list(dict.fromkeys(todo))
        if todo:
            logits = self.drafter.expand(tree, todo)
            for n, row in zip(todo, probs_from_logits(logits, self.cfg)):
                self._probs[tuple(tree.path_tokens(n))] = row
        return torch.stack([self._probs[key] for key in keys])

    def is_expanded(self, tree: TokenTree, node: int) -> bool:
        return tuple(tree.path_tokens(node)) in self._probs

    def gumbel(self, tree: TokenTree, node: int) -> torch.Tensor:  # [V]
        key = hash((self.step_seed, tuple(tree.path_tokens(node)))) & ((1 << 63) - 1)
        gen = torch.Generator().manual_seed(key)
        return gumbel_like(torch.empty(self.vocab_size), gen)


def draw_children(ctx: DraftContext, tree: TokenTree, node: int, k: int) -> list[int]:
    """Sample up to k children of `node` without replacement and add them to the tree.

    Uses the node's keyed Gumbel noise, records the parent's draft distribution
    in `tree.child_dists` (what the `rejection` verifier replays), and gives each
    child DySpec's value estimate: `v_slot * R[y]`, where R is the residual
    (renormalised, earlier siblings removed) and `v_slot` the value of the
    sampling slot, which starts at the node's value and shrinks by `(1 - R[y])`.
    """
    probs = ctx.probs(tree, [node])[0]
    tokens = sample_without_replacement(probs, k, ctx.gumbel(tree, node))
    if not tokens:
        return []
    tree.child_dists[node] = probs
    added, slot_value, residual_mass = [], tree.values[node], 1.0
    for y in tokens:
        r_y = float(probs[y]) / residual_mass
        added.append(tree.add(node, y, value=slot_value * r_y, draft_prob=float(probs[y])))
        slot_value *= 1.0 - r_y
        residual_mass -= float(probs[y])
        if residual_mass <= 0:
            break
    return added


class TreeBuilder(ABC):
    """Base class: subclasses are dataclasses of their parameters, registered by name."""

    name: ClassVar[str]
    children_mode: ClassVar[ChildrenMode]
    paper: ClassVar[str] = ""

    @abstractmethod
    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        """Grow a tree rooted at `root_token` from the draft distributions in `ctx`."""

    @property
    @abstractmethod
    def max_depth(self) -> int:
        """Upper bound on the depth of the trees this builder makes (for context-length checks)."""

    @classmethod
    def from_budget(cls, budget: int, **params) -> "TreeBuilder":
        """The builder at a node budget (tree size); used by benchmark sweeps."""
        return cls(budget=budget, **params)

    def describe(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self) if f.repr)
        return f"{self.name}({fields})"


def require_positive(**values: int | float) -> None:
    for key, value in values.items():
        if value is None or value < 1:
            raise ArborError(f"{key} must be >= 1, got {value}")

