"""DFS reordering (DySpec App. C): a valid renumbering that keeps tree semantics and saves mask blocks."""

from __future__ import annotations

import random

import pytest
import torch

from arborspec.engine.adapter import ModelAdapter
from arborspec.builders.dyspec import DySpecBuilder
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.drafters import ModelDrafter
from arborspec.engine.reorder import dfs_order, mask_blocks, subtree_sizes
from arborspec.engine.sampling import SamplingConfig
from arborspec.engine.tree import TokenTree


def tree_from_parents(parents: list[int]) -> TokenTree:
    tree = TokenTree.from_root(100, "without_replacement")
    for i, p in enumerate(parents[1:], start=1):
        tree.add(p, token=i, value=1.0 / (1 + i), draft_prob=0.5)
        tree.child_dists[p] = torch.full((8,), float(p))
    return tree


def random_tree(rng: random.Random, n: int) -> TokenTree:
    return tree_from_parents([-1] + [rng.randrange(i) for i in range(1, n)])


def by_path(tree: TokenTree) -> dict:
    """path -> (children tokens in order, value, draft prob, child dist or None): numbering removed."""
    out = {}
    for i in range(tree.num_nodes):
        dist = tree.child_dists.get(i)
        out[tuple(tree.path_tokens(i))] = ([tree.tokens[c] for c in tree.children[i]], tree.values[i],
                                           tree.draft_probs[i], None if dist is None else float(dist[0]))
    return out


def test_hand_computed_example():
    # root 0: children 1, 3, 4; 1 -> 2 -> 5; 3 -> 6.   Rows = self + ancestors, block 2 (8 x 8 padded):
    # original rows {0} {0,1} {0,1,2} {0,3} {0,4} {0,1,2,5} {0,3,6}: tiles per row pair 1 + 2 + 3 + 3 = 9
    # DFS (heaviest first) 0 1 2 5 3 6 4 -> rows {0} {0,1} {0,1,2} {0,1,2,3} {0,4} {0,4,5} {0,6}: 1 + 2 + 2 + 2 = 7
    tree = tree_from_parents([-1, 0, 1, 0, 0, 2, 3])
    order = dfs_order(tree)
    assert order == [0, 1, 2, 5, 3, 6, 4]
    assert mask_blocks(tree, 2) == 9
    assert mask_blocks(tree.permuted(order), 2) == 7
    assert mask_blocks(tree, 1) == int(tree.ancestors_mask().sum()) == 17
    assert mask_blocks(tree, 8) == 1


def test_heavier_subtree_first_ties_keep_sibling_order():
    tree = tree_from_parents([-1, 0, 0, 2, 0, 4])  # children of root: 1 (size 1), 2 (size 2), 4 (size 2)
    assert dfs_order(tree) == [0, 2, 3, 4, 5, 1]


@pytest.mark.parametrize("seed", range(20))
def test_dfs_order_is_a_valid_renumbering_with_same_semantics(seed):
    rng = random.Random(seed)
    tree = random_tree(rng, rng.randint(1, 40))
    order = dfs_order(tree)
    new = tree.permuted(order)  # validates: parents before children
    assert by_path(new) == by_path(tree)  # same tokens, sibling order, values and child distributions
    sizes = subtree_sizes(new)
    for node in range(new.num_nodes):
        assert max(new.path_to(node) + [0]) <= node  # ancestors have smaller indices
        # DFS: every subtree is one contiguous block of indices, starting at its root
        members = [i for i in range(new.num_nodes) if node == i or node in [0] + new.path_to(i)[:-1]]
        assert members == list(range(node, node + sizes[node]))
        visit = sorted(new.children[node])
        assert [sizes[c] for c in visit] == sorted((sizes[c] for c in visit), reverse=True)


def test_dfs_reduces_blocks_on_bfs_numbered_trees():
    rng = random.Random(0)
    before = after = 0
    for _ in range(20):
        tree = random_tree(rng, 64)
        bfs = sorted(range(tree.num_nodes), key=lambda i: (tree.depths[i], i))
        tree = tree.permuted(bfs)  # the layer-by-layer numbering most builders produce
        before += mask_blocks(tree, 8)
        after += mask_blocks(tree.permuted(dfs_order(tree)), 8)
    assert after < before


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_reordered_decoding_gives_identical_tokens(tiny_pair, temperature):
    target, draft = tiny_pair
    prompt = [1, 17, 42, 8, 23]
    cfg = DecodeConfig(max_new_tokens=20, sampling=SamplingConfig(temperature=temperature), seed=3)
    runs = [SpeculativeDecoder(ModelAdapter(target), ModelDrafter(draft), DySpecBuilder(budget=16), reorder_dfs=flag)
            .generate(prompt, cfg).output_ids for flag in (False, True)]
    assert runs[0] == runs[1]  # same children order and same random draws: the verifier cannot tell
    if temperature == 0.0:
        assert runs[1] == autoregressive_generate(ModelAdapter(target), prompt, cfg).output_ids
