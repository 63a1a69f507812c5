"""C2T: grow the tree layer by layer, keeping the children a tiny classifier trusts (Huo et al.
2025, "C2T", Sec. 4.2).

Each layer: every frontier node proposes its `topk` children (one
batched draft forward for the layer); each candidate gets the classifier's
confidence from (joint probability, parent entropy over the top-1000
probabilities, depth) — see `c2t_classifier.py`; candidates with confidence
>= beta pass (first pruning), and at most `topk` of them, the most confident,
form the next layer (second pruning). Growth stops at `max_depth` layers,
when nothing passes, or at `budget` nodes.

The classifier comes from `classifier=PATH`, else the shipped file for the
embedded pair (`assets/c2t/embedded.safetensors`, made by `arborspec
train-c2t`). `classifier=none` uses the joint probability itself as the
confidence (then choose a small beta, e.g. 0.05). `beta=None` takes the
classifier's recommended threshold, else 0.5.

Children are *selected* by score, not sampled: verifier `greedy` at
temperature 0, `sample-match` above (docs/algorithms.md §2, pairing rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..engine.contracts import DraftContext, TreeBuilder
from ..engine.tree import TokenTree
from .base import require_positive, top_children
from .c2t_classifier import (
    C2TClassifier,
    builder_classifier,
    builder_confidence,
    builder_threshold,
    c2t_features,
    check_builder_vocab,
)
from .registry import register


@register
@dataclass(kw_only=True)
class C2TBuilder(TreeBuilder):
    budget: int = 64
    topk: int = 8  # top-k children per node, and at most k nodes per layer (second pruning)
    max_depth: int = 8
    # .safetensors path; None = shipped default; "none" = joint probability
    classifier: str | None = None
    # confidence threshold (first pruning); None = the classifier's recommended_beta, else 0.5
    beta: float | None = None
    name = "c2t"
    children_mode = "selected"
    paper = "Huo et al. 2025, C2T (Sec. 4.2)"
    _clf: C2TClassifier | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        require_positive(budget=self.budget, topk=self.topk, max_depth=self.max_depth)
        self._clf = builder_classifier(self.classifier, self.beta)

    @property
    def threshold(self) -> float:
        """beta as given, else the classifier's recommended threshold, else 0.5."""
        return builder_threshold(self.beta, self._clf)

    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        check_builder_vocab(self._clf, ctx.vocab_size)
        tree = TokenTree.from_root(root_token, self.children_mode)
        frontier = [0]
        for _ in range(self.max_depth):
            room = self.budget - tree.size
            if not frontier or room <= 0:
                break
            cands = top_children(ctx, tree, frontier, self.topk)
            features = c2t_features(cands)  # [C, 3]
            conf = self.confidence(features)  # [C]
            passing = (conf >= self.threshold).nonzero().squeeze(-1)
            order = passing[conf[passing].argsort(descending=True, stable=True)][
                : min(self.topk, room)
            ]
            # node value = the joint-probability feature (float32), as the classifier saw it
            frontier = cands.add(tree, order.tolist(), values=features[:, 0].tolist())
        return tree

    def confidence(self, features: torch.Tensor) -> torch.Tensor:  # [C, 3] -> [C]
        return builder_confidence(self._clf, features)
