"""The layout of a packed batched forward (engine/packed_rows.py): exact values on small cases."""

import torch

from arborspec.engine.packed_rows import PackedRows, from_grid, packed, packing, to_grid


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
