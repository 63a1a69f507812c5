"""Every verifier reproduces the target distribution (Monte-Carlo on a small vocabulary).

The first committed token over 6000 trials is compared with the target's law by the chi-square test of
conftest (false-alarm rate FALSE_ALARM; laws 0.035 away in total variation are rejected), and the test is
shown to have teeth: a deliberately biased verifier (no residual update) and a lossy pairing (rejection on
a *selected* tree) fail it.
"""

import pytest
import torch

from arborspec.engine import verifiers
from arborspec.errors import ArborError
from arborspec.engine.sampling import SamplingConfig, gumbel_like, probs_from_logits, sample_without_replacement
from arborspec.engine.tree import TokenTree
from arborspec.engine.verifiers import VERIFIERS, choose_verifier

from conftest import FALSE_ALARM, assert_departs, assert_follows

N_TRIALS = 6000
DETECTS = 0.035  # total variation the checks detect at N_TRIALS
T1 = SamplingConfig(1.0)


def one_level_tree(d: torch.Tensor, k: int, mode: str, gen: torch.Generator) -> TokenTree:
    tree = TokenTree.from_root(0, mode)
    if mode == "without_replacement":
        kids = sample_without_replacement(d, k, gumbel_like(d, gen))
    elif mode == "with_replacement":
        kids = torch.multinomial(d, k, replacement=True, generator=gen).tolist()
    else:  # selected: the k most likely draft tokens
        kids = torch.topk(d, min(k, int((d > 0).sum()))).indices.tolist()
    tree.child_dists[0] = d
    for y in kids:
        tree.add(0, y, draft_prob=float(d[y]))
    return tree


def first_token_counts(verify, t: torch.Tensor, d: torch.Tensor, k: int, mode: str, seed: int = 0) -> torch.Tensor:
    """How often each token is the first committed one over N_TRIALS one-level trees."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(len(t))
    for _ in range(N_TRIALS):
        tree = one_level_tree(d, k, mode, gen)
        logits = torch.log(t).expand(tree.num_nodes, -1)
        res = verify(tree, logits, T1, gen)
        counts[tree.tokens[res.accepted[0]] if res.accepted else res.bonus] += 1
    return counts


def dist(*xs) -> torch.Tensor:
    x = torch.tensor(xs, dtype=torch.float32)
    return x / x.sum()


CASES = {
    "generic": (dist(0.35, 0.25, 0.2, 0.1, 0.06, 0.04), dist(0.1, 0.3, 0.05, 0.3, 0.15, 0.1), 3),
    "draft_equals_target": (dist(0.4, 0.3, 0.2, 0.1, 0, 0), dist(0.4, 0.3, 0.2, 0.1, 0, 0), 2),
    "disjoint_supports": (dist(0.5, 0.3, 0.2, 0, 0, 0), dist(0, 0, 0, 0.6, 0.3, 0.1), 3),
    "one_hot_draft": (dist(0.2, 0.5, 0.3, 0, 0, 0), dist(0, 1, 0, 0, 0, 0), 3),
    "more_children_than_support": (dist(0.3, 0.3, 0.2, 0.1, 0.1, 0), dist(0.6, 0, 0.4, 0, 0, 0), 5),
}
MODES = {"rejection": "without_replacement", "rejection-wr": "with_replacement", "sample-match": "selected"}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", MODES)
def test_verifier_is_lossless(name, case):
    t, d, k = CASES[case]
    assert_follows(first_token_counts(VERIFIERS[name], t, d, k, MODES[name]), t, what=name, detects=DETECTS)


def test_sample_match_is_lossless_on_sampled_trees():
    t, d, k = CASES["generic"]
    assert_follows(first_token_counts(VERIFIERS["sample-match"], t, d, k, "without_replacement"), t, detects=DETECTS)


def test_top_p_on_both_sides():
    torch.manual_seed(3)
    cfg = SamplingConfig(0.9, top_p=0.8)
    t = probs_from_logits(torch.randn(8) * 2, cfg)
    d = probs_from_logits(torch.randn(8) * 2, cfg)
    for name, mode in MODES.items():  # three checks on their own samples: the false-alarm rate split over them
        assert_follows(first_token_counts(VERIFIERS[name], t, d, 3, mode), t, FALSE_ALARM / 3, name, DETECTS)


def test_a_biased_verifier_fails_the_bound(monkeypatch):
    """Drawing the bonus from T instead of the residual is a classic bug: the test must catch it."""
    t, d, k = CASES["generic"]
    monkeypatch.setattr(verifiers, "_residual", lambda r, dd: r)
    assert_departs(first_token_counts(VERIFIERS["rejection"], t, d, k, "without_replacement"), t)


def test_rejection_on_a_selected_tree_is_lossy():
    """The pairing rule: top-k selected children verified by rejection are biased."""
    t, d, k = CASES["generic"]
    assert_departs(first_token_counts(VERIFIERS["rejection"], t, d, k, "selected"), t)


def test_greedy_accepts_the_argmax_child():
    tree = TokenTree.from_root(0)
    tree.add(0, 3)
    b = tree.add(0, 1)
    tree.add(b, 2)
    logits = torch.full((4, 5), -5.0)
    logits[0, 1] = 5  # root -> 1 (node 2)
    logits[2, 2] = 5  # node 2 -> 2 (node 3)
    logits[3, 4] = 5  # bonus after node 3
    for name in VERIFIERS:
        if name.startswith("rejection"):
            continue
        res = VERIFIERS[name](tree, logits, SamplingConfig(0.0), torch.Generator().manual_seed(0))
        assert res.accepted == [2, 3] and res.bonus == 4 and res.accepted_length == 3


def test_rejection_reduces_to_greedy_at_temperature_zero():
    gen = torch.Generator().manual_seed(0)
    d = dist(0.3, 0.3, 0.2, 0.2)
    for _ in range(50):
        tree = one_level_tree(d, 2, "without_replacement", gen)
        logits = torch.tensor([[0.0, 3.0, 1.0, 0.0]]).expand(tree.num_nodes, -1)
        res = VERIFIERS["rejection"](tree, logits, SamplingConfig(0.0), gen)
        token = tree.tokens[res.accepted[0]] if res.accepted else res.bonus
        assert token == 1


def test_residual_of_equal_distributions_is_defined():
    r = dist(0.5, 0.5)
    out = verifiers._residual(r, r.clone())
    assert torch.isfinite(out).all() and abs(float(out.sum()) - 1) < 1e-6


def test_pairing_rule_is_enforced():
    sampled, greedy = SamplingConfig(0.7), SamplingConfig(0.0)
    assert choose_verifier("without_replacement", sampled) == "rejection"
    assert choose_verifier("with_replacement", sampled) == "rejection-wr"
    assert choose_verifier("selected", sampled) == "sample-match"
    assert choose_verifier("selected", greedy) == "greedy"
    with pytest.raises(ArborError, match="not lossless"):
        choose_verifier("selected", sampled, "rejection")
    with pytest.raises(ArborError, match="not lossless"):
        choose_verifier("without_replacement", sampled, "rejection-wr")
    with pytest.raises(ArborError, match="temperature 0"):
        choose_verifier("selected", sampled, "greedy")
    with pytest.raises(ArborError, match="unknown verifier"):
        choose_verifier("selected", sampled, "bogus")
