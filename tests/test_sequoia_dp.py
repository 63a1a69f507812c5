"""Sequoia's dynamic program against brute force, and F(tree) against a simulated positional verifier."""

from __future__ import annotations

import random

import numpy as np
import pytest
from arborspec.builders.sequoia_dp import (
    DEFAULT_ACCEPTANCE,
    choose_size,
    default_shape,
    optimal_shape,
    solve,
    tree_score,
)
from arborspec.builders.shapes import load_shape, save_shape, validate_shape
from arborspec.errors import ArborError


def ordered_trees(nodes: int) -> list[list[tuple[int, ...]]]:
    """Every ordered rooted tree with `nodes` nodes (root included), as lists of index paths."""
    if nodes == 1:
        return [[]]
    out = []
    # the root's children hold nodes-1 nodes, split into an ordered sequence of subtrees
    for sizes in compositions(nodes - 1):
        forests = [[]]
        for i, s in enumerate(sizes):
            forests = [f + [(i,)] + [(i,) + q for q in sub] for f in forests for sub in ordered_trees(s)]
        out += forests
    return out


def compositions(n: int) -> list[list[int]]:
    if n == 0:
        return [[]]
    return [[first] + rest for first in range(1, n + 1) for rest in compositions(n - first)]


def brute_force(p, size: int, depth: int, max_children: int) -> float:
    best = -np.inf
    for tree in ordered_trees(size + 1):
        if tree and max(len(q) for q in tree) > depth:
            continue
        if any(q[-1] >= max_children for q in tree):
            continue
        best = max(best, tree_score([list(q) for q in tree], p))
    return best


def random_decreasing(rng: random.Random, k: int) -> list[float]:
    raw = sorted((rng.random() for _ in range(k)), reverse=True)
    scale = rng.uniform(0.3, 1.0) / sum(raw)
    return [x * scale for x in raw]


def test_catalan_count():
    assert [len(ordered_trees(n)) for n in range(1, 9)] == [1, 1, 2, 5, 14, 42, 132, 429]


@pytest.mark.parametrize("seed", range(6))
def test_dp_matches_brute_force(seed):
    rng = random.Random(seed)
    k = 8 if seed % 2 == 0 else 3  # k = 3 makes the branching cap bite
    p = random_decreasing(rng, k)
    for size in range(1, 8):
        for depth in [1, 2, 3, size]:  # depth = size is the unbounded variant
            expected = brute_force(p, size, depth, k)
            if not np.isfinite(expected):
                with pytest.raises(ArborError):
                    optimal_shape(p, size, depth)
                continue
            shape, score = optimal_shape(p, size, depth)
            assert score == pytest.approx(expected, abs=1e-12), (size, depth)
            assert len(shape) == size and max(len(q) for q in shape) <= depth
            assert tree_score(shape, p) == pytest.approx(score, abs=1e-12)


def test_dp_exact_for_unsorted_vector():
    # The last-branch decomposition does not rely on p being sorted.
    p = [0.2, 0.5, 0.1]
    for size in range(1, 8):
        shape, score = optimal_shape(p, size)
        assert score == pytest.approx(brute_force(p, size, size, 3), abs=1e-12)


def simulate(shape, p, trials: int, rng: np.random.Generator) -> np.ndarray:
    """Accepted length (bonus included) of a verifier that accepts child k with probability p_k exactly."""
    counts = {}
    for q in shape:
        counts[tuple(q[:-1])] = max(counts.get(tuple(q[:-1]), 0), q[-1] + 1)
    cum = np.cumsum(p)
    lengths = np.empty(trials)
    for t in range(trials):
        node, length = (), 1
        while counts.get(node, 0):
            k = int(np.searchsorted(cum, rng.random(), side="right"))  # accepted child index, or >= len(p): none
            if k >= counts[node]:
                break
            node, length = node + (k,), length + 1
        lengths[t] = length
    return lengths


def test_score_equals_simulated_accepted_length():
    rng = np.random.default_rng(0)
    p = [0.55, 0.2, 0.1, 0.05]
    for shape in [optimal_shape(p, 12, 4)[0], [[0], [0, 0], [0, 0, 0]], [[0], [1], [2], [1, 0], [1, 0, 0]]]:
        lengths = simulate(shape, p, 20000, rng)
        stderr = lengths.std() / np.sqrt(lengths.size)
        assert abs(lengths.mean() - tree_score(shape, p)) < 4 * stderr + 1e-3


def test_shape_json_round_trip(tmp_path):
    shape, score = optimal_shape(DEFAULT_ACCEPTANCE, 24, 6)
    path = tmp_path / "shape.json"
    save_shape(path, shape, acceptance=list(DEFAULT_ACCEPTANCE), expected_accepted_length=score)
    loaded, meta = load_shape(path)
    assert loaded == validate_shape(shape)
    assert meta["expected_accepted_length"] == pytest.approx(score)
    assert tree_score(loaded, meta["acceptance"]) == pytest.approx(score)


def test_default_shape_fills_budget_and_depth():
    for budget, depth in [(1, 1), (16, 8), (64, 6), (8, 2)]:
        shape = default_shape(budget, depth)
        assert len(shape) == budget and max(len(q) for q in shape) <= depth
        assert validate_shape(shape) == shape


def test_table_monotone_in_size_and_depth():
    table = solve([0.6, 0.2, 0.1], 30, 6)
    g = table.best[1:, 2:]  # depth >= 1, size >= 1
    g = np.where(np.isfinite(g), g, -1)
    assert np.all(np.diff(g, axis=1)[g[:, 1:] > 0] >= -1e-12)  # more nodes never hurt (feasible part)
    assert np.all(np.diff(g, axis=0) >= -1e-12)  # a looser depth bound never hurts


def test_choose_size_picks_argmax_of_hand_made_costs():
    p = [0.7, 0.2, 0.05]
    # Verification is free up to 8 tokens, then jumps: the best tree has <= 7 nodes.
    t = [0.0] + [1.0] * 8 + [3.0] * 40  # t[k], k tokens
    c = 0.05
    n, d = choose_size(p, t, c, max_size=32, max_depth=6)
    table = solve(p, 33, 6)
    rates = {(m, e): table.score(m, e) / (t[m + 1] + e * c) for m in range(1, 33) for e in range(1, min(6, m) + 1)}
    assert (n, d) == max(rates, key=lambda key: (rates[key], -key[0]))
    assert n <= 7
    # Free verification and a free draft: the largest tree wins (F grows with every node).
    n, d = choose_size(p, lambda k: 1.0, 0.0, 16, 16)
    assert n == 16


def test_bad_acceptance_vector():
    with pytest.raises(ArborError):
        optimal_shape([1.2, 0.1], 4, 2)
    with pytest.raises(ArborError):
        optimal_shape([], 4, 2)
