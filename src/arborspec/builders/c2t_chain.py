"""C2T in chain mode: a chain of the draft's top-1 tokens, stopped by C2T's classifier (Huo et al.
2025, "C2T", the configuration used at batch size > 1; docs/algorithms.md §3).

Each depth: the last node of the chain proposes its most likely child (one draft forward); the
child gets the classifier's confidence from the three features the tree mode uses (joint
probability, parent entropy over the top-1000 probabilities, depth; `c2t_classifier.py`). The
chain stops before the first child whose confidence is below beta, or at `budget` nodes, or at
`max_depth`. `topk` can only be 1.

`classifier` and `beta` are C2T's (`c2t.py`): a `.safetensors` path, the shipped file for the
embedded pair by default, or `none` for the joint probability as the confidence (then choose a
small beta, e.g. 0.05); `beta=None` takes the classifier's recommended threshold, else 0.5.

Nodes are *selected* (the top-1 token), not sampled: verifier `greedy` at temperature 0,
`sample-match` above (docs/algorithms.md §2, pairing rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..engine.contracts import DraftContext, TreeBuilder
from ..engine.tree import TokenTree
from ..errors import ArborError
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
class C2TChainBuilder(TreeBuilder):
    budget: int = 8  # the longest chain; max_depth, when given, caps it too
    # .safetensors path; None = shipped default; "none" = joint probability
    classifier: str | None = None
    # confidence threshold; None = the classifier's recommended_beta, else 0.5
    beta: float | None = None
    name = "c2t-chain"
    children_mode = "selected"
    paper = "Huo et al. 2025, C2T (chain mode)"
    _clf: C2TClassifier | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        require_positive(budget=self.budget, max_depth=self.max_depth)
        if self.topk not in (None, 1):
            raise ArborError(
                f"c2t-chain grows one child per node: topk must be 1 (or left out), got "
                f"{self.topk}; use method c2t for a tree with top-k children"
            )
        self._clf = builder_classifier(self.classifier, self.beta)

    @property
    def threshold(self) -> float:
        """beta as given, else the classifier's recommended threshold, else 0.5."""
        return builder_threshold(self.beta, self._clf)

    def build(self, ctx: DraftContext, root_token: int) -> TokenTree:
        check_builder_vocab(self._clf, ctx.vocab_size)
        tree = TokenTree.from_root(root_token, self.children_mode)
        node, threshold = 0, self.threshold
        for _ in range(self.depth_limit):
            cands = top_children(ctx, tree, [node], 1)  # one draft forward: the top-1 child
            if not len(cands):
                break
            features = c2t_features(cands)  # [1, 3]
            if not bool(self.confidence(features)[0] >= threshold):  # as C2T's tree mode compares
                break
            # node value = the joint-probability feature (float32), as the classifier saw it
            node = cands.add(tree, values=features[:, 0].tolist())[0]
        return tree

    def confidence(self, features: torch.Tensor) -> torch.Tensor:  # [C, 3] -> [C]
        return builder_confidence(self._clf, features)
