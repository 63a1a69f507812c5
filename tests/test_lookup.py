"""Context lookup (engine/lookup.py, docs/algorithms.md §9): exact proposals and grafts on small cases (grafted
nodes marked as point masses, kept through subtrees and renumbering), the target's law kept under
sample-and-match and under the rejection verifiers, which graft too, grafted tokens accepted where a weak
draft's are not. Greedy identity with lookup for every builder, and grafted nodes kept out of the acceptance
model's calibration, are tests/test_greedy_identity.py's; the point-mass rule's own laws and negative controls
are tests/test_verifiers.py's."""

from __future__ import annotations

import pytest
import torch
from arborspec.builders.registry import make_builder
from arborspec.drafters import ModelDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.cost import CostCurve
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.lookup import ContextLookup, LookupPrice, graft
from arborspec.engine.sampling import SamplingConfig
from arborspec.engine.tree import TokenTree
from arborspec.errors import ArborError

from conftest import assert_departs, assert_first_two_follow, exact_first_two, first_two_counts

LOOPING = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]  # a prompt that repeats itself: lookup has something to copy


def test_proposals_copy_what_followed_the_latest_longest_match():
    look = ContextLookup(4, min_n=2, max_n=3)
    assert look.propose([1, 2, 3, 4, 5, 1, 2]) == [3, 4, 5, 1]           # [1, 2] seen at the start
    assert look.propose([1, 2, 3, 4, 5, 1, 2, 3]) == [4, 5, 1, 2]        # grown: [2, 3] and [1, 2, 3] match
    assert look.propose([1, 2, 3, 4, 5, 1, 2, 3, 9, 2, 3]) == [9, 2, 3]  # [2, 3] latest after position 5
    assert ContextLookup(4).propose([7, 8, 9]) == []                     # nothing seen twice
    assert ContextLookup(4, max_n=3).propose([5, 5, 5, 5]) == [5]        # [5, 5, 5] ended at 3: one token follows
    assert ContextLookup(2, min_n=3).propose([1, 2, 9, 1, 2]) == []      # a 2-token match is too short
    assert ContextLookup(6, max_n=2).propose([4, 1, 2, 3, 0, 1, 2]) == [3, 0, 1, 2]


def test_incremental_index_equals_a_fresh_one():
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 5, (120,), generator=g).tolist()
    look = ContextLookup(5)
    for n in range(2, len(seq)):
        assert look.propose(seq[:n]) == ContextLookup(5).propose(seq[:n])


def test_graft_follows_the_trees_children_then_adds_the_rest():
    tree = TokenTree.from_root(9)
    a = tree.add(0, 3, 0.5, 0.5)
    tree.add(a, 8, 0.2, 0.4)
    assert graft(tree, [3, 4, 5]) == [3, 4]
    assert tree.tokens == [9, 3, 8, 4, 5] and tree.parents == [-1, 0, 1, 1, 3]
    assert tree.values[3:] == [0.0, 0.0] and tree.draft_probs[3:] == [0.0, 0.0]
    assert tree.point_masses == {3, 4}  # the added nodes, not the drawn child the chain walked down
    assert graft(tree, [3, 4, 5]) == [] and graft(tree, []) == []
    tree.validate()


def test_point_masses_survive_subtrees_and_renumbering():
    tree = TokenTree.from_root(9, "without_replacement")
    a = tree.add(0, 3, 0.5, 0.5)
    tree.add(a, 8, 0.2, 0.4)
    graft(tree, [3, 4, 5])
    assert tree.point_masses == {3, 4}
    order = [0, 1, 3, 4, 2]
    moved = tree.permuted(order)
    assert moved.point_masses == {2, 3} and [moved.tokens[n] for n in sorted(moved.point_masses)] == [4, 5]
    cut = tree.subtree([1, 3])
    assert cut.tokens == [9, 3, 4] and cut.point_masses == {2}


def test_lookup_accepts_tokens_a_weak_draft_misses(tiny_pair):
    """With a draft that agrees with nothing (another random model), the grafted chain is what gets accepted."""
    from conftest import tiny_llama

    target, _ = tiny_pair
    cfg = DecodeConfig(max_new_tokens=48)
    plain = autoregressive_generate(ModelAdapter(target), LOOPING, cfg)
    prompt = LOOPING + plain.output_ids[:24]  # the target's own text, which loops on a tiny random model
    runs = {}
    for lookup in (0, 6):
        dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(tiny_llama(9)), make_builder("opt-tree", budget=3),
                                 lookup=lookup)
        runs[lookup] = dec.generate(prompt, cfg)
    assert runs[6].output_ids == runs[0].output_ids
    assert sum(s.lookup_accepted for s in runs[6].steps) > 0
    assert runs[6].mean_accepted_length > runs[0].mean_accepted_length


# [13, 7] was seen: lookup grafts [12, 13, 7], and the target gives 12 about 0.35 where the draft gives it about
# 0.06, so the grafted node is judged as a point mass on most seeds and accepted on many
GRAFTED_PROMPT = [13, 7, 12, 13, 7]
RUNS = 900  # seeds: enough to tell apart a first-token law 0.1 away


def lookup_decoder(pair, name, verifier=None):
    target, draft = pair
    return SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder(name, budget=4),
                              verifier=verifier, lookup=3)


@pytest.mark.slow
@pytest.mark.parametrize("name,verifier", [("opt-tree", "sample-match"), ("dyspec", "sample-match"),
                                           ("dyspec", "rejection"), ("specinfer", "rejection-wr")])
def test_lookup_keeps_the_target_distribution(small_vocab_pair, name, verifier):
    """Above temperature 0, with sample-and-match and with the rejection verifiers (grafted nodes judged as point
    masses); the first two sampled tokens over 900 seeds keep the target's laws (chi-square, conftest; laws 0.1
    away in total variation are rejected)."""
    cfg = SamplingConfig(0.8)
    dec = lookup_decoder(small_vocab_pair, name, verifier)
    assert_first_two_follow(dec, small_vocab_pair[0], GRAFTED_PROMPT, cfg, RUNS, f"{name} {verifier}", detects=0.1)
    out = dec.generate(GRAFTED_PROMPT, DecodeConfig(max_new_tokens=2, sampling=cfg, seed=0))
    assert out.steps[0].lookup_nodes > 0  # the first tree had a grafted chain


@pytest.mark.slow
def test_a_point_mass_kept_in_the_residual_fails_the_decoder_check(small_vocab_pair, monkeypatch):
    """Negative control of the test above: a rejected grafted token left in the residual is over-committed."""
    from arborspec.engine import verifiers

    def kept(r, y, generator):
        return verifiers._uniform(generator) < float(r[y]), r

    monkeypatch.setattr(verifiers, "_point_mass_round", kept)
    cfg = SamplingConfig(0.8)
    p1, _ = exact_first_two(small_vocab_pair[0], GRAFTED_PROMPT, cfg)
    c1, _ = first_two_counts(lookup_decoder(small_vocab_pair, "dyspec"), GRAFTED_PROMPT, cfg, RUNS)
    assert_departs(c1, p1, what="dyspec with a point mass kept in the residual")


@pytest.mark.parametrize("name", ["dyspec", "specinfer"])
def test_the_rejection_verifiers_graft_too(small_vocab_pair, name):
    """DySpec (rejection) and SpecInfer (rejection-wr) above temperature 0 get the lookup's chain grafted, accept
    grafted tokens on some seeds, and calibrate only the draft's own nodes; at temperature 0 the output is plain
    decoding's."""
    dec = lookup_decoder(small_vocab_pair, name)
    steps = []
    for seed in range(6):
        out = dec.generate(LOOPING, DecodeConfig(max_new_tokens=12, sampling=SamplingConfig(0.8), seed=seed))
        assert out.config["verifier"] == ("rejection" if name == "dyspec" else "rejection-wr")
        steps += out.steps
    assert steps[0].lookup_nodes > 0 and sum(s.lookup_accepted for s in steps) > 0
    assert all(p > 0 for s in steps for p in s.examined_draft_probs)
    greedy = DecodeConfig(max_new_tokens=16)
    plain = autoregressive_generate(ModelAdapter(small_vocab_pair[0]), LOOPING, greedy)
    out = dec.generate(LOOPING, greedy)
    assert out.output_ids == plain.output_ids and sum(s.lookup_nodes for s in out.steps) > 0


def test_bad_lookup_values_are_refused(tiny_pair):
    from arborspec.bench.run import expand_methods

    target, draft = tiny_pair
    with pytest.raises(ArborError, match="lookup"):
        SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder("dyspec", budget=4), lookup=-1)
    with pytest.raises(ArborError, match="lookup"):
        expand_methods(["dyspec:budget=8:lookup=-2"])
    assert [m.lookup for m in expand_methods(["dyspec:budget=8:lookup=0,6"])] == [0, 6]


def test_report_section_counts_grafted_tokens():
    from arborspec.bench.report import lookup_lines

    runs = [{"method": "dyspec:lookup=4", "temperature": 0.0, "new_tokens": 10,
             "steps": {"lookup_nodes": [2, 0, 3], "lookup_accepted": [1, 0, 2]}},
            {"method": "dyspec", "temperature": 0.0, "new_tokens": 5, "steps": {"lookup_nodes": [0, 0]}}]
    assert "| `dyspec:lookup=4` | 0 | 1.67 | 1.00 | 30.0% |" in lookup_lines(runs)
    assert lookup_lines(runs[1:]) == []


# t(n)/t(1): a second row costs 0.3 of a forward, each further row 0.1 up to 8 rows
PRICED = CostCurve((1, 2, 8), (1.0, 1.3, 1.9), 1.0, 0.0)


def test_the_lookup_price_grafts_the_prefix_that_pays_exactly():
    price = LookupPrice()
    assert price.rate == 0.5  # the prior: 1 of 2
    chain = [5, 6, 7, 8]
    # root alone (E = 1): k tokens give (1 + 0.5 + ... + 0.5^k) / t(k + 1):
    # k = 0: 1.0; 1: 1.5 / 1.3 = 1.154; 2: 1.75 / 1.4 = 1.25; 3: 1.875 / 1.5 = 1.25 (not above); 4: 1.9375 / 1.6
    assert price.prefix(chain, 1.0, 0, 0, PRICED) == [5, 6]
    for _ in range(20):  # chains rejected at their first token: the rate falls towards 0
        price.update(4, 0)
    assert price.rate == pytest.approx(1 / 22)
    assert price.prefix(chain, 1.0, 0, 0, PRICED) == []  # copying no longer pays: a plain step
    sure = LookupPrice()
    for _ in range(50):
        sure.update(4, 4)  # every grafted token accepted: examined 4 of 4 each time
    assert sure.rate == pytest.approx(201 / 202)
    assert sure.prefix(chain, 1.0, 0, 0, PRICED) == chain
    sure.update(0, 0)  # nothing grafted: nothing learnt
    assert sure.rate == pytest.approx(201 / 202)


def test_auto_trees_at_t0_stop_grafting_what_is_never_accepted(tiny_pair):
    """budget=auto at T = 0 with a draft that agrees with nothing: on the target's own looping text the priced
    chains are grafted and accepted; the output stays plain decoding's either way; only auto prices them."""
    from conftest import tiny_llama

    target, _ = tiny_pair
    cfg = DecodeConfig(max_new_tokens=48)
    plain = autoregressive_generate(ModelAdapter(target), LOOPING, cfg)
    prompt = LOOPING + plain.output_ids[:24]
    expected = autoregressive_generate(ModelAdapter(target), prompt, cfg).output_ids
    for budget in ("auto", 1):
        dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(tiny_llama(9)),
                                 make_builder("dyspec", budget=budget), lookup=6, cost=PRICED)
        out = dec.generate(prompt, cfg)
        assert out.output_ids == expected
        assert sum(s.lookup_accepted for s in out.steps) > 0
        assert (dec.lookup_price is not None) == (budget == "auto")
