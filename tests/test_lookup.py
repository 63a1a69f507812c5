"""Context lookup (engine/lookup.py, docs/algorithms.md §9): exact proposals and grafts on small cases, the
target's law kept under sample-and-match, nothing grafted for the rejection verifiers, grafted tokens accepted
where a weak draft's are not. Greedy identity with lookup for every builder, and grafted nodes kept out of the
acceptance model's calibration, are tests/test_greedy_identity.py's."""

from __future__ import annotations

import pytest
import torch

from arborspec.builders.registry import make_builder
from arborspec.drafters import ModelDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.lookup import ContextLookup, graft
from arborspec.engine.sampling import SamplingConfig
from arborspec.engine.tree import TokenTree
from arborspec.errors import ArborError

from conftest import assert_first_two_follow

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
    assert graft(tree, [3, 4, 5]) == [] and graft(tree, []) == []
    tree.validate()


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


@pytest.mark.slow
@pytest.mark.parametrize("name", ["opt-tree", "dyspec"])
def test_sample_and_match_with_lookup_follows_the_target_distribution(small_vocab_pair, name):
    """Above temperature 0, lookup grafts only under sample-and-match; the first two sampled tokens over 800
    seeds keep the target's laws (chi-square, conftest; laws 0.1 away in total variation are rejected)."""
    target, draft = small_vocab_pair
    cfg = SamplingConfig(0.8)
    prompt = [3, 7, 1, 3, 7]
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder(name, budget=4),
                             verifier="sample-match", lookup=3)
    assert_first_two_follow(dec, target, prompt, cfg, 800, name, detects=0.1)
    out = dec.generate(prompt, DecodeConfig(max_new_tokens=2, sampling=cfg, seed=0))
    assert out.steps[0].lookup_nodes > 0  # [3, 7] was seen: the first tree had a grafted chain


def test_nothing_is_grafted_for_the_rejection_verifiers(small_vocab_pair):
    target, draft = small_vocab_pair
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), make_builder("dyspec", budget=4), lookup=3)
    out = dec.generate([3, 7, 1, 3, 7], DecodeConfig(max_new_tokens=12, sampling=SamplingConfig(0.8), seed=1))
    assert out.steps and all(s.lookup_nodes == 0 for s in out.steps)


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
