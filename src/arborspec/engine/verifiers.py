"""Verifiers: walk the tree from the root and decide which draft tokens the target accepts.

Vocabulary (as in vLLM's rejection sampler):
* **accepted** tokens: draft nodes on the accepted path, root excluded;
* **bonus** token: the one token drawn from the target (or from its residual)
  at the node where the walk stops. Committed per step = accepted + 1.

All four verifiers produce tokens distributed exactly as the target's
(docs/algorithms.md §2), provided the tree was built the way the verifier assumes:

| verifier        | lossless for                                    | reference |
|-----------------|-------------------------------------------------|-----------|
| `greedy`        | any tree, target temperature 0                  | -         |
| `sample-match`  | any tree (children *selected* or sampled)       | naive / top-k verification |
| `rejection`     | children sampled *without* replacement from `child_dists[node]` and its residuals | Sequoia Alg. 1, DySpec Alg. 3 |
| `rejection-wr`  | children sampled i.i.d. *with* replacement from `child_dists[node]` | SpecInfer |

The rejection verifiers also take nodes added from outside the draws, such as the context
lookup's grafted tokens (`lookup.py`), as long as the tree lists them in `point_masses`: each is a
candidate proposed by a point mass on its own token. At a node they judge the drawn children
first, in draw order, each against the distribution it was drawn from, then the point masses, each
accepted with probability R[g] (its proposal puts mass 1 on g) and on rejection removed from the
residual R. Every candidate is judged against its own proposal, fixed before its coin is tossed,
so the committed token still follows the target (docs/algorithms.md §2, §9).

Every random draw comes from the `torch.Generator` passed in. Only the target
rows the walk visits are turned into probabilities.
"""  # noqa: E501 (the table's rows cannot wrap)

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import ArborError
from .lm_head import greedy_token
from .sampling import SamplingConfig, generator_device, probs_from_logits, sample
from .tree import TokenTree

RESIDUAL_EPS = 1e-9


@dataclass
class VerifyResult:
    accepted: list[int]  # node indices of the accepted path, root excluded, root->leaf
    bonus: int  # token id drawn where the walk stopped

    @property
    def accepted_length(self) -> int:
        """Tokens committed by this step, bonus included."""
        return len(self.accepted) + 1


# A node-level rule: (target probs at node [V], tree, node, generator) -> (accepted child or None,
# bonus probs)
NodeRule = Callable[
    [torch.Tensor, TokenTree, int, torch.Generator | None], tuple[int | None, torch.Tensor | int]
]


def _walk(
    tree: TokenTree, target_logits: torch.Tensor, cfg: SamplingConfig, generator, rule: NodeRule
) -> VerifyResult:
    """Shared walk: at each node apply `rule`; descend into the accepted child or
    stop with a bonus."""
    node, accepted = 0, []
    while True:
        probs = probs_from_logits(target_logits[node], cfg)  # [V]
        child, bonus = rule(probs, tree, node, generator) if tree.children[node] else (None, probs)
        if child is None:
            token = bonus if isinstance(bonus, int) else sample(bonus, generator)
            return VerifyResult(accepted, token)
        accepted.append(child)
        node = child


def _match_rule(probs, tree, node, generator):
    # Draw z ~ T; accept the child equal to z, else z is the bonus token.
    z = sample(probs, generator)
    for child in tree.children[node]:
        if tree.tokens[child] == z:
            return child, z
    return None, z


def _residual(r: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """norm(max(R - D, 0)); when it sums to ~0 (then R == D up to rounding, and the rejection
    that led here had probability ~0) keep R: a defined, NaN-free choice."""
    res = (r - d).clamp_(min=0)
    total = float(res.sum())
    return res / total if total > RESIDUAL_EPS else r


def _uniform(generator) -> float:
    return float(torch.rand((), generator=generator, device=generator_device(generator)))


def _judging_order(tree: TokenTree, node: int) -> list[int]:
    """The children of `node` in the order a rejection verifier judges them: the drawn ones in
    draw order, then the point masses. A point mass is grafted after the draws and only where no
    draw holds its token, so whether it is there depends on the draws: judged last, that decision
    is part of the history its round starts from (docs/algorithms.md §9)."""
    kids = tree.children[node]
    if not tree.point_masses:
        return kids
    return [c for c in kids if c not in tree.point_masses] + [
        c for c in kids if c in tree.point_masses
    ]


def _point_mass_round(r: torch.Tensor, y: int, generator) -> tuple[bool, torch.Tensor]:
    """One round of speculative sampling against the proposal δ_y: accept y with probability
    min(1, R[y] / δ_y[y]) = R[y]; on rejection the residual norm(max(R - δ_y, 0)), R with y
    zeroed."""
    if _uniform(generator) < float(r[y]):
        return True, r
    # norm(max(R - δ_y, 0)) is R with y zeroed (R[y] <= 1), renormalised; `_residual`'s fallback
    res = r.clone()
    res[y] = 0.0
    total = float(res.sum())
    return False, res / total if total > RESIDUAL_EPS else r


def _rejection_rule(with_replacement: bool) -> NodeRule:
    def rule(probs, tree, node, generator):
        r = probs.clone()
        d = None  # the distribution the next drawn child came from
        spent = False  # d has no mass left to have proposed further siblings from
        for child in _judging_order(tree, node):
            y = tree.tokens[child]
            if child in tree.point_masses:
                accepted, r = _point_mass_round(r, y, generator)
                if accepted:
                    return child, y
                continue
            if spent:
                continue
            if d is None:
                if node not in tree.child_dists:
                    raise ArborError(
                        "a rejection verifier needs the draft distribution of every expanded "
                        "node: this tree was not built by sampling; use the greedy or "
                        "sample-match verifier"
                    )
                d = tree.child_dists[node].to(r.device, torch.float32).clone()
            if d[y] <= 0:
                raise RuntimeError(
                    f"child token {y} has draft probability 0: the tree was not "
                    "sampled from child_dists"
                )
            # accept y with probability min(1, R[y] / D[y])
            if _uniform(generator) * float(d[y]) < float(r[y]):
                return child, y
            r = _residual(r, d)
            if not with_replacement:
                d[y] = 0.0
                total = float(d.sum())
                spent = total <= 0
                if not spent:
                    d /= total
        return None, r

    return rule


def greedy(tree, target_logits, cfg, generator=None) -> VerifyResult:
    """Descend while a child holds the target's argmax token; that token is the bonus where none
    does. Rows are read through `greedy_token` (engine/lm_head.py): the screened argmax plain
    decoding uses too."""
    node, accepted = 0, []
    while True:
        best = greedy_token(target_logits, node)
        child = next((c for c in tree.children[node] if tree.tokens[c] == best), None)
        if child is None:
            return VerifyResult(accepted, best)
        accepted.append(child)
        node = child


def sample_match(tree, target_logits, cfg, generator=None) -> VerifyResult:
    return _walk(tree, target_logits, cfg, generator, _match_rule)


def rejection(tree, target_logits, cfg, generator=None) -> VerifyResult:
    return _walk(tree, target_logits, cfg, generator, _rejection_rule(with_replacement=False))


def rejection_with_replacement(tree, target_logits, cfg, generator=None) -> VerifyResult:
    return _walk(tree, target_logits, cfg, generator, _rejection_rule(with_replacement=True))


VERIFIERS: dict[str, Callable[..., VerifyResult]] = {
    "greedy": greedy,
    "sample-match": sample_match,
    "rejection": rejection,
    "rejection-wr": rejection_with_replacement,
}

# Which verifiers are lossless for each way of producing children (the pairing rule,
# docs/algorithms.md §2). The rule holds for any draft distribution, including one that is zero
# outside a reduced draft vocabulary (FR-Spec, the draft head's `vocab_ids`): rejection verifiers
# replay the exact distribution the children were drawn from (a point mass for a node in
# `point_masses`), and sample-match / greedy never read draft probabilities (docs/algorithms.md §6).
# Nodes grafted after the builder (engine/lookup.py) keep every pairing lossless: greedy and
# sample-match never read draft probabilities, the rejection verifiers judge them as point masses.
LOSSLESS = {
    "without_replacement": {"rejection", "sample-match"},
    "with_replacement": {"rejection-wr", "sample-match"},
    "selected": {"sample-match"},
}
DEFAULT = {
    "without_replacement": "rejection",
    "with_replacement": "rejection-wr",
    "selected": "sample-match",
}


def choose_verifier(children_mode: str, cfg: SamplingConfig, requested: str | None = None) -> str:
    """Pick the default verifier for a builder, or check that a requested one is lossless."""
    if requested is None:
        return "greedy" if cfg.greedy else DEFAULT[children_mode]
    if requested not in VERIFIERS:
        raise ArborError(f"unknown verifier {requested!r}: choose one of {', '.join(VERIFIERS)}")
    if cfg.greedy:
        return "greedy"  # every verifier reduces to greedy acceptance at temperature 0
    if requested == "greedy":
        raise ArborError(
            "the greedy verifier is only lossless at temperature 0: drop --verifier "
            "or set --temperature 0"
        )
    if requested not in LOSSLESS[children_mode]:
        raise ArborError(
            f"verifier {requested!r} is not lossless for a tree whose children are "
            f"{children_mode.replace('_', ' ')}: use "
            f"{' or '.join(sorted(LOSSLESS[children_mode]))}"
        )
    return requested
