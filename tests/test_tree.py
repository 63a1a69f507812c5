"""TokenTree: structure, positions and the additive tree mask."""

import torch
from arborspec.engine.tree import TokenTree


def small_tree() -> TokenTree:
    #      0(root=7)
    #     /        \
    #   1(3)      2(4)
    #   /  \
    # 3(5) 4(6)
    t = TokenTree.from_root(7)
    a = t.add(0, 3, 0.5)
    t.add(0, 4, 0.2)
    t.add(a, 5, 0.3)
    t.add(a, 6, 0.1)
    return t


def test_structure_and_paths():
    t = small_tree()
    t.validate()
    assert t.size == 4 and t.num_nodes == 5 and t.depth == 2
    assert t.children == [[1, 2], [3, 4], [], [], []]
    assert t.path_to(4) == [1, 4] and t.path_tokens(4) == [3, 6]
    assert abs(t.estimated_accept_length() - 2.1) < 1e-9


def test_positions_and_mask():
    t = small_tree()
    assert t.position_ids(10).tolist() == [[10, 11, 11, 12, 12]]
    mask = t.attention_mask(2, torch.float32)
    assert mask.shape == (1, 1, 5, 7)
    allowed = (mask[0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 0, 1, 0, 0],
        [1, 1, 1, 1, 0, 1, 0],
        [1, 1, 1, 1, 0, 0, 1],
    ]
    assert mask.min() == torch.finfo(torch.float32).min


def test_permuted_keeps_semantics():
    t = small_tree()
    p = t.permuted([0, 2, 1, 4, 3])
    assert p.tokens == [7, 4, 3, 6, 5]
    assert p.children[0] == [2, 1]  # sibling (proposal) order preserved
    assert sorted(tuple(p.path_tokens(i)) for i in range(1, 5)) == sorted(tuple(t.path_tokens(i)) for i in range(1, 5))
