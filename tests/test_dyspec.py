"""DySpec builders: brute-force optimality (App. D), greedy == threshold, batching invariance, losslessness."""

from __future__ import annotations

import pytest
import torch
from arborspec.builders.dyspec import DySpecBuilder, DySpecThresholdBuilder
from arborspec.drafters import Drafter, ModelDrafter
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.contracts import DraftContext
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder
from arborspec.engine.sampling import SamplingConfig
from arborspec.engine.tree import TokenTree
from arborspec.engine.verifiers import VERIFIERS

from conftest import (
    TableDrafter,
    assert_departs,
    assert_follows,
    assert_greedy_identical,
    perturbed_copy,
    random_table,
    table_ctx,
    tiny_llama,
)


def dyspec_drafter(vocab: int = 5, seed: int = 0, power: float = 3.0) -> TableDrafter:
    """Pseudo-random draft distributions over a tiny vocabulary, with some exact zeros."""
    return TableDrafter(random_table(vocab, seed, power, zero_share=0.2, bump=0.05), vocab)


# ---------------------------------------------------------------- brute force (independent of the builder)
def draw_order(ctx: DraftContext, path: tuple[int, ...]) -> tuple[list[int], torch.Tensor]:
    """Tokens in the order the keyed noise draws them without replacement at `path`, and D(.|path)."""
    chain = TokenTree.from_root(0)
    node = 0
    for tok in path:
        node = chain.add(node, tok)
    probs = ctx.probs(chain, [node])[0]
    support = torch.nonzero(probs > 0).squeeze(-1)  # one keyed draw per support token, in vocabulary order
    keys = torch.log(probs[support]) + ctx.gumbel(chain, node, support.numel())
    return [int(support[i]) for i in torch.argsort(keys, descending=True)], probs


def best_slot_sum(ctx: DraftContext, m: int, max_depth: int = 99) -> float:
    """Max over all m-node trees reachable by the keyed sampling process of the sum of slot values
    (value of the k-th draw at x = p_hat(x) * (1 - mass of draws 0..k-1); DySpec App. D eq. 11)."""
    memo: dict = {}

    def info(path):
        if path not in memo:
            memo[path] = draw_order(ctx, path)
        return memo[path]

    def p_hat(path):
        return 1.0 if not path else p_hat(path[:-1]) * float(info(path[:-1])[1][path[-1]])

    def slot_value(parent, k):
        order, probs = info(parent)
        return p_hat(parent) * (1.0 - sum(float(probs[y]) for y in order[:k]))

    states = {frozenset([()]): 0.0}
    for _ in range(m):
        nxt: dict = {}
        for nodes, total in states.items():
            for x in nodes:
                if len(x) >= max_depth:
                    continue
                k = sum(1 for y in nodes if len(y) == len(x) + 1 and y[:-1] == x)
                order, _ = info(x)
                if k < len(order):
                    nxt[nodes | {x + (order[k],)}] = total + slot_value(x, k)
        states = nxt
    return max(states.values())


def tree_slot_values_by_node(tree: TokenTree) -> dict[int, float]:
    """Slot value of every non-root node, read back from the tree and its recorded child_dists."""
    out = {}
    for p, kids in enumerate(tree.children):
        mass = 0.0
        for c in kids:
            out[c] = tree.values[p] * (1.0 - mass)
            mass += float(tree.child_dists[p][tree.tokens[c]])
    return out


def tree_slot_values(tree: TokenTree) -> list[float]:
    return list(tree_slot_values_by_node(tree).values())


def canonical(tree: TokenTree) -> dict:
    """path -> (children tokens in order, value): node numbering removed."""
    return {tuple(tree.path_tokens(i)): ([tree.tokens[c] for c in tree.children[i]], tree.values[i])
            for i in range(tree.num_nodes)}


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("m", [3, 5, 6])
def test_greedy_matches_brute_force(seed, m):
    ctx = table_ctx(dyspec_drafter(5, seed), seed)
    tree = DySpecBuilder(budget=m).build(ctx, 0)
    assert tree.size == m
    tree.validate()
    for i in range(tree.num_nodes):  # the tree is one the sampling process can produce
        order, _ = draw_order(ctx, tuple(tree.path_tokens(i)))
        assert [tree.tokens[c] for c in tree.children[i]] == order[: len(tree.children[i])]
        if tree.children[i]:
            torch.testing.assert_close(tree.child_dists[i], ctx.probs(tree, [i])[0])
    assert sum(tree_slot_values(tree)) == pytest.approx(best_slot_sum(ctx, m), rel=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_greedy_respects_max_depth(seed):
    ctx = table_ctx(dyspec_drafter(5, seed), seed)
    tree = DySpecBuilder(budget=5, max_depth=2).build(ctx, 0)
    assert tree.depth <= 2
    assert sum(tree_slot_values(tree)) == pytest.approx(best_slot_sum(ctx, 5, max_depth=2), rel=1e-9)


def test_slot_values_never_increase_in_pop_order():
    ctx = table_ctx(dyspec_drafter(6, 3), 3)
    tree = DySpecBuilder(budget=20).build(ctx, 0)
    popped = [tree_slot_values_by_node(tree)[i] for i in range(1, tree.num_nodes)]  # node index = pop order
    assert all(a >= b - 1e-12 for a, b in zip(popped, popped[1:]))


def frontier_best(tree: TokenTree, ctx: DraftContext) -> float:
    """Best slot value the greedy builder left in its heap (next sibling or first child of any node)."""
    best = 0.0
    for i in range(tree.num_nodes):
        order, probs = draw_order(ctx, tuple(tree.path_tokens(i)))
        k = len(tree.children[i])
        if k < len(order):
            best = max(best, tree.values[i] * (1.0 - sum(float(probs[y]) for y in order[:k])))
    return best


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("m", [4, 10, 24])
def test_threshold_equals_greedy_at_mth_slot_value(seed, m):
    # a tie at the boundary (e.g. the last token left in a distribution: its slot and its first
    # child's slot are worth the same) makes "the m best slots" ambiguous: step down to an untied m
    while True:
        greedy = DySpecBuilder(budget=m).build(table_ctx(dyspec_drafter(6, seed), seed), 0)
        t = min(tree_slot_values(greedy))
        if frontier_best(greedy, table_ctx(dyspec_drafter(6, seed), seed)) < t * (1 - 1e-6):
            break
        m -= 1
    assert m >= 2
    drafter = dyspec_drafter(6, seed)
    thresh = DySpecThresholdBuilder(threshold=t * (1 - 1e-9), budget=10_000).build(table_ctx(drafter, seed), 0)
    assert canonical(thresh) == canonical(greedy)
    assert drafter.forwards <= thresh.depth  # one draft forward per layer


def test_threshold_cap_keeps_best_slots_and_a_valid_tree():
    for seed in range(5):
        tree = DySpecThresholdBuilder(threshold=0.01, budget=7).build(table_ctx(dyspec_drafter(6, seed), seed), 0)
        tree.validate()
        assert tree.size <= 7
        assert all(v >= 0.01 for v in tree_slot_values(tree))


@pytest.mark.parametrize("seed", range(8))
def test_batched_forwards_do_not_change_the_tree(seed):
    lazy, batched = dyspec_drafter(6, seed), dyspec_drafter(6, seed)
    a = DySpecBuilder(budget=24, prefetch=False).build(table_ctx(lazy, seed), 0)
    b = DySpecBuilder(budget=24, prefetch=True).build(table_ctx(batched, seed), 0)
    assert canonical(a) == canonical(b)
    expanded = sum(1 for i in range(1, a.num_nodes) if a.children[i])
    assert lazy.forwards == lazy.rows == expanded  # lazy: one forward per expanded node, nothing wasted
    assert batched.forwards <= lazy.forwards and batched.rows >= expanded


def test_prefetch_saves_forwards_overall():
    lazy = batched = 0
    for seed in range(8):
        for flag in (False, True):
            d = dyspec_drafter(6, seed)
            DySpecBuilder(budget=24, prefetch=flag).build(table_ctx(d, seed), 0)
            batched, lazy = (batched + d.forwards, lazy) if flag else (batched, lazy + d.forwards)
    assert batched < lazy


# ---------------------------------------------------------------- losslessness (rejection verifier)
def first_token_counts(builder, drafter, target: torch.Tensor, verifier: str, trials: int, mutate=None) -> torch.Tensor:
    """How often each token is the first committed one over `trials` seeds, verified against `target` [V]."""
    cfg = SamplingConfig(temperature=1.0)
    counts = torch.zeros_like(target)
    for seed in range(trials):
        tree = builder.build(table_ctx(drafter, seed), 0)
        if mutate is not None:
            mutate(tree)
        logits = target.log().expand(tree.num_nodes, -1)  # [N, V]; only the root row matters here
        result = VERIFIERS[verifier](tree, logits, cfg, torch.Generator().manual_seed(10**6 + seed))
        counts[tree.tokens[result.accepted[0]] if result.accepted else result.bonus] += 1
    return counts


TARGET6 = torch.tensor([0.05, 0.30, 0.05, 0.25, 0.15, 0.20])


@pytest.mark.parametrize("builder", [DySpecBuilder(budget=6), DySpecThresholdBuilder(threshold=0.12, budget=8)],
                         ids=["greedy", "threshold"])
def test_rejection_verifier_is_lossless_on_dyspec_trees(builder):
    """The first token over 2500 seeds follows the target (chi-square, conftest; laws 0.045 away are rejected)."""
    counts = first_token_counts(builder, dyspec_drafter(6, 2, power=6), TARGET6, "rejection", 2500)
    assert_follows(counts, TARGET6, detects=0.045)


def untempered(tree: TokenTree) -> None:
    """A plausible bug: record D before the draft-side transform (here: a temperature of 2)."""
    for p, d in tree.child_dists.items():
        tree.child_dists[p] = d.sqrt() / d.sqrt().sum()


@pytest.mark.parametrize("verifier,mutate", [("rejection-wr", None), ("rejection", untempered)],
                         ids=["with-replacement-verifier", "untempered-child-dists"])
def test_distribution_check_catches_a_wrong_pairing(verifier, mutate):
    """Negative controls: the same check rejects these lossy pairings at 1200 seeds (they are ~0.08 and ~0.15
    away from the target in total variation)."""
    counts = first_token_counts(DySpecBuilder(budget=6), dyspec_drafter(6, 2, power=6), TARGET6, verifier, 1200, mutate)
    assert_departs(counts, TARGET6)


# ---------------------------------------------------------------- real (tiny) models
class PathDrafter(Drafter):
    """Draft logits by a full forward over prompt + path, memoised: exact and cheap for many seeds."""

    def __init__(self, model, prompt: list[int]) -> None:
        self.model, self.prompt, self.memo = model, prompt, {}
        self.vocab_size = model.config.vocab_size

    def logits(self, path: tuple[int, ...]) -> torch.Tensor:  # [V]
        if path not in self.memo:
            with torch.no_grad():
                ids = torch.tensor([self.prompt + list(path)])
                self.memo[path] = self.model(ids).logits[0, -1].float()
        return self.memo[path]

    def begin(self, committed):
        return self.logits(())

    def expand(self, tree, nodes):
        return torch.stack([self.logits(tuple(tree.path_tokens(n))) for n in nodes])


@pytest.fixture(scope="module")
def small_pair():
    target = tiny_llama(3, vocab=24, hidden=32, layers=1, init=0.6)
    return target, perturbed_copy(target, 4, 0.6)


@pytest.mark.parametrize("builder", [DySpecBuilder(budget=8), DySpecThresholdBuilder(threshold=0.1, budget=8)],
                         ids=["greedy", "threshold"])
def test_first_token_follows_target_on_tiny_model_pair(small_pair, builder):
    target, draft = small_pair
    prompt = [1, 5, 9, 4]
    with torch.no_grad():
        t_probs = target(torch.tensor([prompt])).logits[0, -1].float().softmax(-1)
    drafter = PathDrafter(draft, prompt)
    # chi-square over 2000 seeds (conftest); laws 0.065 away in total variation are rejected
    assert_follows(first_token_counts(builder, drafter, t_probs, "rejection", 2000), t_probs, detects=0.065)
    if isinstance(builder, DySpecBuilder):  # the check has teeth: a mis-recorded child_dists (~0.3 away) is caught
        assert_departs(first_token_counts(builder, drafter, t_probs, "rejection", 600, untempered), t_probs)


@pytest.mark.parametrize("builder", [DySpecThresholdBuilder(threshold=0.08, budget=12),
                                     DySpecBuilder(budget=6, max_depth=2)],
                         ids=["threshold", "capped"])
def test_greedy_decoding_identical_to_target_with_its_own_parameters(tiny_pair, builder):
    """A threshold and a depth cap (the default parameters: tests/test_greedy_identity.py)."""
    target, draft = tiny_pair
    assert_greedy_identical(target, draft, builder)


def test_sampled_decoding_repeats_with_a_seed(tiny_pair):
    target, draft = tiny_pair
    dec = SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), DySpecBuilder(budget=10))
    cfg = DecodeConfig(max_new_tokens=12, sampling=SamplingConfig(temperature=0.8), seed=7)
    assert dec.generate([1, 3, 5], cfg).output_ids == dec.generate([1, 3, 5], cfg).output_ids
