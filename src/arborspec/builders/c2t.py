"""C2T: grow the tree layer by layer, keeping the children a tiny classifier trusts (Huo et al. 2025, "C2T", Sec. 4.2).

Each layer: every frontier node proposes its top-k children (one batched
draft forward for the layer); each candidate gets the classifier's
confidence from (joint probability, parent entropy over the top-1000
probabilities, depth) — see `c2t.py`; candidates with confidence >= beta pass
(first pruning), and at most k of them, the most confident, form the next
layer (second pruning). Growth stops at `depth` layers, when nothing passes,
or at `budget` nodes.

The classifier comes from `classifier=PATH`, else the shipped file for the
embedded pair (`assets/c2t/embedded.safetensors`, made by `arborspec
train-c2t`). `classifier=none` uses the joint probability itself as the
confidence (then choose a small beta, e.g. 0.05).

Children are *selected* by score, not sampled: verifier `greedy` at
temperature 0, `sample-match` above (ALGORITHMS.md §2, pairing rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..offline.c2t import DEFAULT_CLASSIFIER, C2TClassifier, add_candidates, load_classifier, propose
from ..errors import ArborError
from .registry import register
from ..engine.tree import TokenTree
from .base import DraftContext, TreeBuilder, require_positive


@register
@dataclass
class C2TBuilder(TreeBuilder):
    classifier: str | None = None  # .safetensors path; None = shipped default; "none" = joint probability
    beta: float | None = None  # confidence threshold (first pruning); None = the classifier's recommended_beta, else 0.5
    k: int = 8  # top-k children per node, and at most k nodes per layer (second pruning)
    depth: int = 8
    budget: int = 64
    name = "c2t"
    children_mode = "selected"
    paper = "Huo et al. 2025, C2T (Sec. 4.2)"
    _clf: C2TClassifier | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        require_positive(k=self.k, depth=self.depth, budget=self.budget)
        if isinstance(self.classifier, str) and self.classifier.lower() == "none":
            self._clf = None
        elif self.classifier is None:
            if not DEFAULT_CLASSIFIER.is_file():
                raise ArborError(
                    f"no C2T classifier at {DEFAULT_CLASSIFIER}: run `arborspec train-c2t` for the pair, pass "
                    "classifier=PATH, or classifier=none for the joint-probability rule"
                )
            self._clf = load_classifier(DEFAULT_CLASSIFIER)
        else:
            self._clf = load_classifier(self.classifier)
        if self.beta is None:
            self.beta = float(self._clf.meta.get("recommended_beta", 0.5)) if self._clf is not None else 0.5
        if not 0 <= self.beta <= 1:
            raise ArborError(f"beta must be in [0, 1], got {self.beta}")

    @property
    def max_depth(self) -> int:
        return self.depth

    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        self._check_vocab(ctx.vocab_size)
        tree = TokenTree.from_root(root_token, self.children_mode)
        frontier = [0]
        for _ in range(self.depth):
            room = self.budget - tree.size
            if not frontier or room <= 0:
                break
            cands = propose(ctx, tree, frontier, self.k)
            conf = self.confidence(cands.features)  # [C]
            passing = (conf >= self.beta).nonzero().squeeze(-1)
            order = passing[conf[passing].argsort(descending=True, stable=True)][: min(self.k, room)]
            frontier = add_candidates(tree, cands, order.tolist())
        return tree

    def confidence(self, features: torch.Tensor) -> torch.Tensor:  # [C, 3] -> [C]
        if self._clf is None:
            return features[:, 0]
        return self._clf.confidence(features)

    def _check_vocab(self, vocab_size: int) -> None:
        want = self._clf.meta.get("vocab_size") if self._clf is not None else None
        if want is not None and want != vocab_size:
            raise ArborError(f"the C2T classifier was trained for a vocabulary of {want} tokens, this pair has "
                             f"{vocab_size}: train one for this pair with `arborspec train-c2t`")
