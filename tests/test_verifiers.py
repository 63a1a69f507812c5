"""Every verifier reproduces the target distribution (Monte-Carlo on a small vocabulary).

The first committed token over 6000 trials is compared with the target's law by the chi-square test of
conftest (false-alarm rate FALSE_ALARM; laws 0.035 away in total variation are rejected), and the test is
shown to have teeth: a deliberately biased verifier (no residual update) and a lossy pairing (rejection on
a *selected* tree) fail it. The rejection verifiers with grafted point masses (engine/lookup.py,
docs/algorithms.md §9): the first token and the first two tokens of a chain two deep keep the target's laws;
accepting the grafted token outright, keeping it in the residual after rejecting it, judging it against the
draft's distribution or before the drawn children all fail the same test.
"""

import pytest
import torch
from arborspec.engine import verifiers
from arborspec.engine.lookup import graft
from arborspec.engine.sampling import SamplingConfig, gumbel_like, probs_from_logits, sample_without_replacement
from arborspec.engine.tree import TokenTree
from arborspec.engine.verifiers import VERIFIERS, choose_verifier
from arborspec.errors import ArborError

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


def first_token_counts(verify, t: torch.Tensor, d: torch.Tensor, k: int, mode: str, seed: int = 0,
                       chain: tuple[int, ...] = (), graft_with=graft) -> torch.Tensor:
    """How often each token is the first committed one over N_TRIALS one-level trees, each with `chain`
    grafted under its root by `graft_with`."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(len(t))
    for _ in range(N_TRIALS):
        tree = one_level_tree(d, k, mode, gen)
        graft_with(tree, list(chain))
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


# Grafted point masses: token 0 is the target's likeliest and among the draft's least likely, so a draw holds it in
# about one tree in five (then the chain walks down that child) and the point mass is judged in the others.
GRAFT = (dist(0.35, 0.25, 0.2, 0.1, 0.06, 0.04), dist(0.1, 0.3, 0.05, 0.3, 0.15, 0.1), 2, (0,))
SAMPLED = {"rejection": "without_replacement", "rejection-wr": "with_replacement"}


@pytest.mark.parametrize("name", SAMPLED)
def test_rejection_with_a_grafted_point_mass_is_lossless(name):
    t, d, k, chain = GRAFT
    counts = first_token_counts(VERIFIERS[name], t, d, k, SAMPLED[name], chain=chain)
    assert_follows(counts, t, what=name, detects=DETECTS)


@pytest.mark.parametrize("name", SAMPLED)
def test_a_point_mass_the_draft_cannot_draw_is_lossless(name):
    """The grafted token has draft probability 0 (the draft never proposes it): judged as a point mass only."""
    t, d, k = CASES["disjoint_supports"][0], CASES["disjoint_supports"][1], 2
    assert_follows(first_token_counts(VERIFIERS[name], t, d, k, SAMPLED[name], chain=(1,)), t, what=name,
                   detects=DETECTS)


def _always_accepted(r, y, generator):
    return True, r


def _kept_in_the_residual(r, y, generator):
    return verifiers._uniform(generator) < float(r[y]), r


def _point_masses_first(tree, node):
    kids = tree.children[node]
    return [c for c in kids if c in tree.point_masses] + [c for c in kids if c not in tree.point_masses]


def _unmarked(tree, chain):
    graft(tree, chain)
    tree.point_masses.clear()  # the verifier takes the grafted node for a draw from child_dists


@pytest.mark.parametrize("name", SAMPLED)
@pytest.mark.parametrize("control", ["accepted outright", "kept in the residual", "judged first",
                                     "judged against the draft"])
def test_wrong_point_mass_rules_fail_the_bound(monkeypatch, name, control):
    """Negative controls: each departs from the rule in one place and over-commits the grafted token. Judged
    first, the point mass is judged only in trees whose draws missed its token, which depends on the draws
    judged after it (docs/algorithms.md §9)."""
    t, d, k, chain = GRAFT
    graft_with = graft
    if control == "accepted outright":
        monkeypatch.setattr(verifiers, "_point_mass_round", _always_accepted)
    elif control == "kept in the residual":
        monkeypatch.setattr(verifiers, "_point_mass_round", _kept_in_the_residual)
    elif control == "judged first":
        monkeypatch.setattr(verifiers, "_judging_order", _point_masses_first)
    else:
        graft_with = _unmarked
    counts = first_token_counts(VERIFIERS[name], t, d, k, SAMPLED[name], chain=chain, graft_with=graft_with)
    assert_departs(counts, t, what=f"{name}, point mass {control}")


def two_level_tree(d0: torch.Tensor, d1: dict, k: int, mode: str, gen: torch.Generator) -> TokenTree:
    """`k` draws under the root from `d0`, `k` under each of them from `d1[token]`."""
    tree = one_level_tree(d0, k, mode, gen)
    for node in list(tree.children[0]):
        sub = one_level_tree(d1[tree.tokens[node]], k, mode, gen)
        tree.child_dists[node] = sub.child_dists[0]
        for kid in sub.children[0]:
            tree.add(node, sub.tokens[kid], draft_prob=sub.draft_probs[kid])
    return tree


def chain_counts(verify, t0, t1, d0, d1, k, mode, chain, seed=0):
    """Joint counts of the first two committed tokens over N_TRIALS two-level trees with `chain` grafted, and
    how many trees had the chain's second token grafted under a drawn node and under a grafted one. A walk that
    stops at the root commits one token: the second is the next step's, drawn from the target as a tree-less
    step would."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(len(t0), len(t0))
    under_drawn = under_grafted = 0
    flat = torch.full((len(t0),), 1.0 / len(t0))
    for _ in range(N_TRIALS):
        tree = two_level_tree(d0, d1, k, mode, gen)
        added = graft(tree, list(chain))
        if len(added) == 1:
            under_drawn += tree.parents[added[0]] not in tree.point_masses
        under_grafted += len(added) == 2
        rows = [t0] + [t1[tree.tokens[i]] if tree.depths[i] == 1 else flat for i in range(1, tree.num_nodes)]
        res = verify(tree, torch.log(torch.stack(rows)), T1, gen)
        path = [tree.tokens[i] for i in res.accepted] + [res.bonus]
        if len(path) == 1:
            path.append(int(torch.multinomial(t1[path[0]], 1, generator=gen)))
        counts[path[0], path[1]] += 1
    return counts, under_drawn, under_grafted


def chain_case():
    """Target and draft laws after the root and after each first token (6 tokens), and a chain (0, 4): the
    target likes both tokens, the draft rarely draws them."""
    t0, d0 = GRAFT[0], GRAFT[1]
    g = torch.Generator().manual_seed(11)
    t1 = {x: torch.softmax(torch.randn(6, generator=g) * 1.5, 0) for x in range(6)}
    d1 = {x: torch.softmax(torch.randn(6, generator=g) * 1.5, 0) for x in range(6)}
    t1[0] = dist(0.2, 0.15, 0.1, 0.1, 0.4, 0.05)
    d1[0] = dist(0.25, 0.3, 0.15, 0.15, 0.05, 0.1)
    return t0, t1, d0, d1, (0, 4)


@pytest.mark.parametrize("name", SAMPLED)
def test_a_grafted_chain_two_deep_keeps_the_sequence_law(name):
    """The chain's second token hangs under a drawn node (its first token drawn) or under a grafted one (with no
    draft distribution there); the first two tokens follow the target's joint law."""
    t0, t1, d0, d1, chain = chain_case()
    counts, under_drawn, under_grafted = chain_counts(VERIFIERS[name], t0, t1, d0, d1, 2, SAMPLED[name], chain)
    assert under_drawn > 500 and under_grafted > 3000
    joint = t0[:, None] * torch.stack([t1[x] for x in range(6)])
    assert_follows(counts.sum(1), t0, FALSE_ALARM / 2, f"{name} first token", DETECTS)
    assert_follows(counts, joint, FALSE_ALARM / 2, f"{name} first two tokens", DETECTS)


def test_a_chain_kept_in_the_residual_fails_the_sequence_law(monkeypatch):
    """Negative control of the test above: rejected point masses left in the residual over-commit the chain."""
    monkeypatch.setattr(verifiers, "_point_mass_round", _kept_in_the_residual)
    t0, t1, d0, d1, chain = chain_case()
    counts, _, _ = chain_counts(VERIFIERS["rejection"], t0, t1, d0, d1, 2, "without_replacement", chain)
    assert_departs(counts, t0[:, None] * torch.stack([t1[x] for x in range(6)]))


def test_a_node_with_only_point_masses_needs_no_draft_distribution():
    """A grafted chain on a tree the builder left bare: only point masses are judged, each accepted with the
    target's residual probability; without the point-mass mark the node's missing distribution is refused."""
    tree = TokenTree.from_root(0, "without_replacement")
    graft(tree, [2, 3])
    logits = torch.log(dist(0.0, 0.0, 1.0, 0.0)).expand(tree.num_nodes, -1).clone()
    logits[1] = torch.log(dist(0.0, 0.0, 0.0, 1.0))
    res = VERIFIERS["rejection"](tree, logits, T1, torch.Generator().manual_seed(0))
    assert res.accepted == [1, 2]  # both tokens certain under the target: both accepted
    tree.point_masses.clear()
    with pytest.raises(ArborError, match="draft distribution"):
        VERIFIERS["rejection"](tree, logits, T1, torch.Generator().manual_seed(0))


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
