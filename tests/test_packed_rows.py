"""The layout of a packed batched forward (engine/packed_rows.py): exact values on small cases."""

import torch
from arborspec.engine.packed_rows import PackedRows, from_grid, packed, packing, split_width, to_grid


def test_packed_rows_place_each_request_in_its_own_row():
    rows = PackedRows.of([2, 0, 3])
    assert rows.grid.tolist() == [[0, 1, 5], [5, 5, 5], [2, 3, 4]]
    assert rows.index.tolist() == [0, 1, 6, 7, 8]
    assert rows.tokens == 5


def test_to_grid_and_from_grid_invert_each_other_with_zeros_in_the_padding():
    rows = PackedRows.of([1, 3])
    states = torch.arange(2 * 4 * 3, dtype=torch.float32).view(1, 2, 4, 3)  # [1, H=2, S=4, D=3]
    grid = to_grid(states, rows.grid)  # [B=2, H=2, N=3, D=3]
    assert grid.shape == (2, 2, 3, 3)
    assert torch.equal(grid[0, :, 0], states[0, :, 0]) and torch.equal(grid[1, :, :3], states[0, :, 1:])
    assert not grid[0, :, 1:].any()  # request 0's padded slots
    out = grid.transpose(1, 2)  # the attention's output layout [B, N, H, D]
    assert torch.equal(from_grid(out, rows.index), states.transpose(1, 2))


def test_packing_applies_to_forwards_of_its_own_token_count_only():
    rows = PackedRows.of([2, 1])
    assert packed(3) is None
    with packing(rows):
        assert packed(3) is rows and packed(4) is None
    assert packed(3) is None


def test_one_long_tree_is_split_off_where_that_saves_enough_query_slots():
    assert split_width([8, 2, 2, 2]) == 2  # 3 x 6 slots saved
    assert split_width([7, 1, 1, 1]) == 1
    assert split_width([6, 1, 2]) == 2  # 2 x 4: just enough
    assert split_width([5, 2, 2]) is None  # 2 x 3 < SPLIT_CALL_SLOTS
    assert split_width([8, 8, 2, 2]) is None  # two long trees: one call
    assert split_width([8, 0, 0, 0]) is None  # the others feed nothing
    assert split_width([8]) is None and split_width([3, 3, 3]) is None


def test_a_split_attention_takes_every_slot_once_and_packs_back_in_order():
    rows = PackedRows.of([2, 6, 1])  # split at 2: request 1's slots 2..5 attended on their own
    split = rows.split
    assert split.head.tolist() == [[0, 1], [2, 3], [8, 9]]
    assert split.request.tolist() == [1]
    tail_slots = rows.grid[split.request, 2:]  # what the attention's second call takes
    assert tail_slots.tolist() == [[4, 5, 6, 7]]
    assert split.index.tolist() == [0, 1, 2, 3, 6, 7, 8, 9, 4]
    assert PackedRows.of([2, 6, 1], split=False).split is None
    states = torch.arange(2 * 9 * 3, dtype=torch.float32).view(1, 2, 9, 3)  # [1, H=2, S=9, D=3]
    head, tail = to_grid(states, split.head), to_grid(states, tail_slots)  # [3, 2, 2, 3], [1, 2, 4, 3]
    flat = torch.cat([head.transpose(1, 2).flatten(0, 1), tail.transpose(1, 2).flatten(0, 1)])
    assert torch.equal(flat.index_select(0, split.index), states[0].transpose(0, 1))
    assert not head[2, :, 1].any()  # request 2's padded slot
    again = PackedRows.of_tensors(rows.tensors())
    assert all(torch.equal(a, b) for a, b in zip(again.tensors(), rows.tensors()))
