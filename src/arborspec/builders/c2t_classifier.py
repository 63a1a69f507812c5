"""C2T's classifier and its three features: what the online builder needs, and the file format (Huo
et al. 2025, "C2T", Sec. 4.1).

Each candidate node is described by three features:
  1. joint probability: the product of draft probabilities along its path
     (after the draft-side sampling transform, the distributions the builder sees);
  2. entropy of its parent's draft distribution, summed over that
     distribution's top-1000 probabilities (`-sum p log p`, not renormalised);
  3. depth (root = 0, so the root's children have depth 1).
The classifier is `Linear(3, 48) -> ReLU -> Linear(48, 1)` followed by a sigmoid
("confidence"). It is saved as safetensors with its JSON metadata (pair,
vocabulary, metrics, training config) in the file header.

What both C2T builders (`c2t.py`, `c2t_chain.py`) share is here too: the classifier their
`classifier=` parameter names, their threshold, the confidence of a candidate.

Training lives offline (`offline/c2t.py`); this module never imports it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..common.vocab import check_vocab_size
from ..errors import ArborError
from .base import Candidates

FEATURES = ("joint_probability", "parent_entropy_top1000", "depth")
ENTROPY_TOP = 1000
HIDDEN = 48
CLASSIFIER_FORMAT = "arborspec-c2t/1"
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "assets" / "c2t"
# for target "embedded" + draft "embedded-draft"
DEFAULT_CLASSIFIER = SHIPPED_DIR / "embedded.safetensors"
RETRAIN = "train one for this pair with `arborspec train-c2t`"


def top_entropy(probs: torch.Tensor, top: int = ENTROPY_TOP) -> torch.Tensor:  # [K, V] -> [K]
    """`-sum p log p` over each row's `top` largest probabilities (zeros contribute 0)."""
    p = probs.float().topk(min(top, probs.shape[-1]), dim=-1).values
    return -(p * torch.log(p.clamp_min(1e-30))).sum(-1)


def c2t_features(cands: Candidates) -> torch.Tensor:  # [C, 3] float32
    """The three C2T features of every candidate."""
    if not cands.parents:
        return torch.zeros(0, len(FEATURES))
    entropy = top_entropy(cands.dists)[torch.tensor(cands.rows)]  # [C]
    return torch.stack(
        [torch.tensor(cands.joint), entropy, torch.tensor(cands.depths).float()], dim=-1
    )


def make_classifier(hidden: int = HIDDEN) -> nn.Sequential:
    return nn.Sequential(nn.Linear(len(FEATURES), hidden), nn.ReLU(), nn.Linear(hidden, 1))


@dataclass
class C2TClassifier:
    net: nn.Sequential
    meta: dict = field(default_factory=dict)

    @torch.no_grad()
    def confidence(self, features: torch.Tensor) -> torch.Tensor:  # [C, 3] -> [C]
        return torch.sigmoid(self.net(features.float())).squeeze(-1)


def save_classifier(path: str | Path, clf: C2TClassifier) -> None:
    """safetensors weights; the JSON metadata rides in the file header under "arborspec"."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        **clf.meta,
        "format": CLASSIFIER_FORMAT,
        "features": list(FEATURES),
        "entropy_top": ENTROPY_TOP,
    }
    tensors = {k: v.detach().contiguous().cpu() for k, v in clf.net.state_dict().items()}
    save_file(tensors, str(path), metadata={"arborspec": json.dumps(meta)})


def load_classifier(
    path: str | Path,
    target: str | None = None,
    draft: str | None = None,
    vocab_size: int | None = None,
) -> C2TClassifier:
    """Read a classifier file; one-line ArborError if malformed or made for another
    pair or vocabulary."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise ArborError(
            f"C2T classifier {str(path)!r} does not exist: train one with `arborspec train-c2t`"
        )
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise ArborError(
            f"C2T classifier {str(path)!r} is not a safetensors file ({exc})"
        ) from None
    try:
        meta = json.loads(header["arborspec"])
        assert meta.get("format") == CLASSIFIER_FORMAT and meta.get("features") == list(FEATURES)
    except (KeyError, json.JSONDecodeError, AssertionError, AttributeError):
        raise ArborError(
            f"{str(path)!r} is not an arborspec C2T classifier (missing or wrong metadata)"
        ) from None
    net = make_classifier(tensors["0.weight"].shape[0] if "0.weight" in tensors else HIDDEN)
    try:
        net.load_state_dict(tensors)
    except RuntimeError as exc:
        raise ArborError(
            f"C2T classifier {str(path)!r} has unexpected weights ({str(exc).splitlines()[0]})"
        ) from None
    for role, want in [("target", target), ("draft", draft)]:
        if want is not None and meta.get(role) != want:
            raise ArborError(
                f"C2T classifier {str(path)!r} was trained for {role} {meta.get(role)!r}, not "
                f"{want!r}: retrain with `arborspec train-c2t --{role} {want}`"
            )
    check_vocab_size(
        meta.get("vocab_size"), vocab_size, what=f"C2T classifier {str(path)!r}", fix=RETRAIN
    )
    return C2TClassifier(net.eval(), meta)


# ---------------------------------------------------------------------------- for the builders
def builder_classifier(
    spec: str | Path | None, beta: float | None
) -> C2TClassifier | None:
    """The classifier a builder's `classifier=` names: a file; None = the shipped file for the
    embedded pair; "none" = no classifier (the joint probability is the confidence). One-line
    ArborError when the file is missing or bad, or when the threshold it gives with `beta` is
    outside [0, 1]."""
    if isinstance(spec, str) and spec.lower() == "none":
        clf = None
    elif spec is not None:
        clf = load_classifier(spec)
    elif not DEFAULT_CLASSIFIER.is_file():
        raise ArborError(
            f"no C2T classifier at {DEFAULT_CLASSIFIER}: run `arborspec train-c2t` for the pair, "
            "pass classifier=PATH, or classifier=none for the joint-probability rule"
        )
    else:
        clf = load_classifier(DEFAULT_CLASSIFIER)
    threshold = builder_threshold(beta, clf)
    if not 0 <= threshold <= 1:
        raise ArborError(f"beta must be in [0, 1], got {threshold}")
    return clf


def builder_threshold(beta: float | None, clf: C2TClassifier | None) -> float:
    """beta as given, else the classifier's recommended threshold, else 0.5."""
    if beta is not None:
        return beta
    return float(clf.meta.get("recommended_beta", 0.5)) if clf is not None else 0.5


def builder_confidence(
    clf: C2TClassifier | None, features: torch.Tensor
) -> torch.Tensor:  # [C, 3] -> [C]
    """The classifier's confidence in each candidate; without one, its joint probability."""
    return features[:, 0] if clf is None else clf.confidence(features)


def check_builder_vocab(clf: C2TClassifier | None, vocab_size: int) -> None:
    """One-line ArborError when the classifier was trained on another vocabulary."""
    if clf is not None:
        check_vocab_size(
            clf.meta.get("vocab_size"), vocab_size, what="the C2T classifier", fix=RETRAIN
        )
