"""OPT-Tree and EAGLE-2: valid top-n subtrees (ties included), E(A) history, p_hat values, losslessness."""

from __future__ import annotations

import pytest
import torch
from arborspec.builders.eagle2 import Eagle2Builder
from arborspec.builders.opt_tree import OptTreeBuilder, top_subtree
from arborspec.drafters import ModelDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder
from arborspec.engine.sampling import SamplingConfig
from arborspec.engine.tree import TokenTree
from arborspec.engine.verifiers import VERIFIERS
from arborspec.errors import ArborError

from conftest import TableDrafter, assert_departs, assert_follows, perturbed_copy, random_table, table_ctx, tiny_llama


def tied_table(vocab: int, seed: int):
    """Quantised pseudo-random distributions: equal probabilities are common, and so are probability-1
    tokens (whose children tie with their parent)."""

    def table(path: tuple[int, ...]) -> torch.Tensor:
        gen = torch.Generator().manual_seed(hash((seed, *path)) & (2**62 - 1))
        w = torch.randint(0, 3, (vocab,), generator=gen).float()
        if float(torch.rand((), generator=gen)) < 0.3:
            w = torch.zeros(vocab)  # a certain token: child p_hat == parent p_hat
        w[int(torch.randint(vocab, (1,), generator=gen))] += 1.0
        return w / w.sum()

    return table


def drafter_of(vocab: int = 6, seed: int = 0, ties: bool = False) -> TableDrafter:
    return TableDrafter((tied_table if ties else random_table)(vocab, seed), vocab)


def path_prob(drafter: TableDrafter, tokens: list[int]) -> float:
    p = 1.0
    for i, tok in enumerate(tokens):
        p *= float(drafter.dist(tuple(tokens[:i]))[tok])
    return p


def assert_valid(tree: TokenTree) -> None:
    tree.validate()
    for i in range(1, tree.num_nodes):
        assert tree.values[i] <= tree.values[tree.parents[i]]


BUILDERS = {
    "opt-tree": lambda n: OptTreeBuilder(budget=n, delta=0.0, max_depth=6),
    "eagle2": lambda n: Eagle2Builder(budget=n, topk=3, max_depth=5),
}


@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_final_tree_is_a_valid_subtree_with_path_probabilities(name, ties):
    for seed in range(12):
        drafter = drafter_of(5, seed, ties)
        n = 3 + seed
        tree = BUILDERS[name](n).build(table_ctx(drafter), 0)
        assert_valid(tree)
        assert tree.size == n
        for i in range(1, tree.num_nodes):
            assert tree.values[i] == pytest.approx(path_prob(drafter, tree.path_tokens(i)), rel=1e-5)
            parent_dist = drafter.dist(tuple(tree.path_tokens(i)[:-1]))
            assert tree.draft_probs[i] == pytest.approx(float(parent_dist[tree.tokens[i]]), rel=1e-5)


def test_eagle2_keeps_the_top_n_of_everything_it_proposed():
    for seed in range(8):
        drafter = drafter_of(6, seed)
        everything = Eagle2Builder(budget=10_000, topk=3, max_depth=4).build(table_ctx(drafter), 0)
        kept = Eagle2Builder(budget=7, topk=3, max_depth=4).build(table_ctx(drafter), 0)
        assert everything.size == 3 + 3 * 3 * 3  # root's 3 + 3 expanded nodes x 3 children per later layer
        best = sorted(everything.values[1:], reverse=True)[:7]
        assert sorted(kept.values[1:], reverse=True) == pytest.approx(best)


def test_eagle2_expands_the_top_k_of_each_layer():
    drafter = drafter_of(6, 3)
    tree = Eagle2Builder(budget=10_000, topk=2, max_depth=3).build(table_ctx(drafter), 0)
    for depth in (1, 2):
        layer = [i for i in range(1, tree.num_nodes) if tree.depths[i] == depth]
        expanded = {i for i in layer if tree.children[i]}
        best = sorted(layer, key=lambda i: -tree.values[i])[:2]
        assert expanded == set(best)


def test_opt_tree_history_is_non_decreasing_and_matches_the_tree():
    for seed in range(10):
        builder = OptTreeBuilder(budget=6 + seed, delta=0.0, max_depth=8)
        result = builder.grow(table_ctx(drafter_of(6, seed)), 0)
        history = result.history
        assert history[0] == 1.0 and len(history) >= 2
        assert all(b >= a for a, b in zip(history, history[1:]))
        # final tree = top n of the work tree
        assert history[-1] == pytest.approx(result.tree.estimated_accept_length())
        assert builder.grow(table_ctx(drafter_of(6, seed)), 0).history == history  # nothing kept between calls


def test_opt_tree_stops_when_gain_is_below_delta():
    result = OptTreeBuilder(budget=8, delta=0.05, max_depth=20).grow(table_ctx(drafter_of(6, 1)), 0)
    gains = [b - a for a, b in zip(result.history, result.history[1:])]
    assert len(gains) < 20  # it stopped early ...
    assert all(g >= 0.05 for g in gains[:-1]) and gains[-1] < 0.05  # ... at the first layer that gained too little
    assert result.tree.depth <= len(gains)


def test_opt_tree_without_delta_grows_to_max_depth():
    result = OptTreeBuilder(budget=8, delta=0.0, max_depth=3).grow(table_ctx(drafter_of(6, 1)), 0)
    assert len(result.history) == 1 + 3


def test_opt_tree_layer_is_top_n_children():
    """Every kept node is among the n best children of its layer (checked against brute force)."""
    drafter = drafter_of(5, 4)
    n = 4
    tree = OptTreeBuilder(budget=n, delta=0.0, max_depth=3).build(table_ctx(drafter), 0)
    # brute force: layers by exhaustive expansion of the chosen previous layer
    layer, chosen = [()], set()
    for _ in range(3):
        cands = [(path_prob(drafter, list(p) + [y]), p + (y,)) for p in layer for y in range(5)]
        layer = [p for _, p in sorted(cands, key=lambda c: -c[0])[:n]]
        chosen |= set(layer)
    best = sorted(chosen, key=lambda p: (-path_prob(drafter, list(p)), len(p)))[:n]
    assert {tuple(tree.path_tokens(i)) for i in range(1, tree.num_nodes)} == set(best)


def test_top_subtree_breaks_ties_parent_first():
    tree = TokenTree.from_root(0)
    a = tree.add(0, 1, value=0.5)
    b = tree.add(a, 2, value=0.5)  # certain continuation: ties with its parent
    tree.add(b, 3, value=0.5)
    tree.add(0, 4, value=0.5)
    for n in range(1, 5):
        assert_valid(top_subtree(tree, n))


def test_bad_parameters():
    with pytest.raises(ArborError):
        OptTreeBuilder(budget=0)
    with pytest.raises(ArborError):
        Eagle2Builder(topk=0)


# ---------------------------------------------------------------- losslessness: selected trees need sample-match
def first_token_counts(builder, drafter, target: torch.Tensor, verifier: str, trials: int) -> torch.Tensor:
    """How often each token is the first committed one over `trials` seeds, verified against `target` [V]."""
    cfg = SamplingConfig(temperature=1.0)
    counts = torch.zeros_like(target)
    for seed in range(trials):
        tree = builder.build(table_ctx(drafter, seed), 0)
        if verifier == "rejection":  # the wrong pairing: pretend the selected children were sampled
            tree.child_dists = {i: drafter.dist(tuple(tree.path_tokens(i))) for i in range(tree.num_nodes)}
        logits = target.log().expand(tree.num_nodes, -1)  # [N, V]; only the root row matters here
        result = VERIFIERS[verifier](tree, logits, cfg, torch.Generator().manual_seed(seed))
        counts[tree.tokens[result.accepted[0]] if result.accepted else result.bonus] += 1
    return counts


TARGET6 = torch.tensor([0.05, 0.30, 0.05, 0.25, 0.15, 0.20])


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_sample_match_is_lossless_and_rejection_is_not(name):
    drafter = drafter_of(6, 2)
    builder = (OptTreeBuilder(budget=4, delta=0.0, max_depth=2) if name == "opt-tree"
               else Eagle2Builder(budget=4, topk=3, max_depth=2))
    # chi-square over 3500 seeds (conftest); laws 0.04 away in total variation are rejected
    assert_follows(first_token_counts(builder, drafter, TARGET6, "sample-match", 3500), TARGET6, detects=0.04)
    assert_departs(first_token_counts(builder, drafter, TARGET6, "rejection", 1500), TARGET6)  # the lossy pairing


def test_sampled_decoding_on_a_tiny_pair_matches_target_first_token():
    """End to end at temperature 1 with sample-match: first token vs the target softmax (vocab 16)."""
    target = tiny_llama(5, vocab=16, hidden=16, layers=1, init=0.8)
    draft = perturbed_copy(target, 6, 0.8)
    prompt = [1, 3, 7]
    with torch.no_grad():
        t_probs = target(torch.tensor([prompt])).logits[0, -1].float().softmax(-1)
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft),
                             OptTreeBuilder(budget=4, delta=0.0, max_depth=2))
    counts = torch.zeros(16)
    trials = 300
    for seed in range(trials):
        cfg = DecodeConfig(max_new_tokens=1, sampling=SamplingConfig(temperature=1.0), seed=seed)
        counts[dec.generate(prompt, cfg).output_ids[0]] += 1
    assert_follows(counts, t_probs, detects=0.12)  # chi-square over 300 seeds, conftest
    with pytest.raises(ArborError):  # the engine refuses the lossy pairing outright
        SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), OptTreeBuilder(budget=4),
                           verifier="rejection").generate(prompt, cfg)
