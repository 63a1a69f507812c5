"""A batched forward whose new tokens are packed into one row (docs/algorithms.md §10).

In a batched step each request feeds its own number of tokens (its tree; a request decoded
plainly feeds one). transformers' modules take `[B, N]` inputs, so a padded forward feeds every
request N tokens, N the largest tree, and a padded token costs what a real one costs in the
linears, the norms, the rotary embeddings and the MLP. A packed forward feeds the step's S real
tokens as one row `[1, S]` instead, each at its own position: everything that works token by
token runs on the real tokens only. Two places need the batch, and see it through `packed()`:

* the cache layer (engine/kv_cache.py, engine/traced.py) lays the new keys and values out as
  `[B, H, N, D]` (`to_grid`: each request's tokens in its own row, zeros in the padding) and
  writes them as a padded forward would;
* the float64 attention (engine/invariant_attention.py) lays the queries out the same way, attends
  over the batch's cache with the padded forward's `[B, 1, N, W + N]` mask, and packs its output
  back (`from_grid`).

The attention is the one part whose cost grows with the padded grid, B x N query slots: one
request with a long tree (a lookup proposal of six tokens beside trees of two) makes every other
request attend with as many slots. Where it pays (`split_width`), the queries are attended in two
calls instead (`AttentionSplit`): every request's first M slots, `[B, M]`, M the next longest
tree, and the long tree's slots past M, `[1, N - M]`, over its request's cache alone.

Every real token's values are then the padded forward's bit for bit: per token the same
operations on the same inputs (the int8 linears and the norms compute each row on its own,
engine/int8.py), and the same attention over the same grid (a padded query still attends to
itself only, to a zero key instead of its padded token's). A split attention computes each query
row over the same keys, values and mask row in float64, in a call of another shape: the same
values up to the kernel's summation order, which rounding to the model's dtype removes, as for a
tree forward against plain decoding (engine/invariant_attention.py). Tests: tests/test_batch.py,
tests/test_int8.py, tests/test_traced.py.

Only the int8 target's path packs (its float64 attention and `InPlaceLayer`s read `packed()`);
a model on transformers' own attention and cache layers runs the padded forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

# What a second call of the float64 attention costs, in query slots of the first: a tree longer
# than every other is attended alone when that saves more slots than this (docs/algorithms.md §10)
SPLIT_CALL_SLOTS = 8


def split_width(sizes: list[int]) -> int | None:
    """M, where one request's tree is longer than every other (M the next longest) and attending
    its slots past M in a call of their own saves at least `SPLIT_CALL_SLOTS` query slots of the
    grid `[B, N]`; None where one call over the grid is as good."""
    if len(sizes) < 2:
        return None
    m, width = sorted(sizes)[-2:]
    if m == 0 or (len(sizes) - 1) * (width - m) < SPLIT_CALL_SLOTS:
        return None
    return m


@dataclass(frozen=True)
class AttentionSplit:
    """A packed forward's queries attended in two calls (module doc).

    `head [B, M]`: the packed token at each request's first M slots (S at a padded slot), the
    grid's first M columns; `request`: the one request with more (a one-element tensor), whose
    slots past M are the second call's; `index [S]`: each packed token's row in the two calls'
    outputs flattened and concatenated, the head's `[B x M]` first."""

    head: torch.Tensor
    request: torch.Tensor
    index: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.head, self.request, self.index)


@dataclass(frozen=True)
class PackedRows:
    """Where a packed forward's tokens sit in the padded grid `[B, N]`.

    `grid [B, N]`: the packed token at each slot, S (one past the last token) at a padded slot;
    `index [S]`: each packed token's slot `b * N + j` in the flattened grid; `split`: how the
    attention takes the queries where not as the grid (module doc)."""

    grid: torch.Tensor
    index: torch.Tensor
    split: AttentionSplit | None = None

    @classmethod
    def of(
        cls, sizes: list[int], device: torch.device | str = "cpu", split: bool = True
    ) -> PackedRows:
        """Request b's `sizes[b]` tokens at slots (b, 0..sizes[b] - 1), requests in order; the
        attention split at `split_width(sizes)` where there is one (and `split`)."""
        width, total = max(sizes, default=0), sum(sizes)
        grid = torch.full((len(sizes), width), total, dtype=torch.long)
        index = torch.empty(total, dtype=torch.long)
        start = 0
        for b, size in enumerate(sizes):
            grid[b, :size] = torch.arange(start, start + size)
            index[start : start + size] = torch.arange(b * width, b * width + size)
            start += size
        m = split_width(sizes) if split else None
        rows = cls(grid, index, None if m is None else _split(grid, sizes, m))
        return rows.to(device)

    def to(self, device: torch.device | str) -> PackedRows:
        split = self.split
        if split is not None:
            split = AttentionSplit(*(t.to(device) for t in split.tensors()))
        return PackedRows(self.grid.to(device), self.index.to(device), split)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The packing's tensors (a traced forward's inputs, engine/traced.py)."""
        return (self.grid, self.index) + (() if self.split is None else self.split.tensors())

    @classmethod
    def of_tensors(cls, tensors: tuple[torch.Tensor, ...]) -> PackedRows:
        """The inverse of `tensors`."""
        split = AttentionSplit(*tensors[2:5]) if len(tensors) > 2 else None
        return cls(tensors[0], tensors[1], split)

    @property
    def tokens(self) -> int:
        """S, the tokens of the packed row."""
        return self.index.shape[0]


def _split(grid: torch.Tensor, sizes: list[int], m: int) -> AttentionSplit:
    batch, width = grid.shape
    long = max(range(batch), key=lambda b: sizes[b])
    index = torch.empty(sum(sizes), dtype=torch.long)
    start = 0
    for b, size in enumerate(sizes):
        first = min(size, m)
        index[start : start + first] = torch.arange(b * m, b * m + first)
        start += first
        if b == long:
            index[start : start + size - m] = torch.arange(batch * m, batch * m + size - m)
            start += size - m
    return AttentionSplit(grid[:, :m].contiguous(), torch.tensor([long]), index)


_PACKED: ContextVar[PackedRows | None] = ContextVar("arborspec_packed_rows", default=None)


@contextmanager
def packing(rows: PackedRows) -> Iterator[None]:
    """Within this block, forwards of `rows.tokens` tokens in one row are packed batched forwards
    (module doc)."""
    token = _PACKED.set(rows)
    try:
        yield
    finally:
        _PACKED.reset(token)


def packed(tokens: int) -> PackedRows | None:
    """The packing of a forward of `tokens` tokens in one row, None where it is not packed."""
    rows = _PACKED.get()
    return rows if rows is not None and rows.tokens == tokens else None


def to_grid(states: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """`[1, H, S, D]` -> `[B, H, N, D]`: each slot's token, zeros at the padded slots."""
    flat = states[0].transpose(0, 1)  # [S, H, D]
    flat = torch.cat([flat, flat.new_zeros(1, flat.shape[1], flat.shape[2])])
    batch, width = grid.shape[0], grid.shape[1]
    laid = flat.index_select(0, grid.reshape(-1))
    return laid.view(batch, width, flat.shape[1], flat.shape[2]).transpose(1, 2)


def grid_states(keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache layer's new keys and values `[1, H, S, D]` of a packed forward laid out over the
    batch (`to_grid`); those of any other forward as they are."""
    rows = packed(keys.shape[2]) if keys.shape[0] == 1 else None
    if rows is None:
        return keys, values
    return to_grid(keys, rows.grid), to_grid(values, rows.grid)


def from_grid(out: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`[B, N, H, D]` (transformers' attention output layout) -> `[1, S, H, D]`, the packed
    tokens' rows."""
    flat = out.reshape(out.shape[0] * out.shape[1], out.shape[2], out.shape[3])
    return flat.index_select(0, index).unsqueeze(0)
