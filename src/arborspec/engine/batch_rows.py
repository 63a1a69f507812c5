"""Several sequences in one KV cache: the layout batched decoding runs on (docs/algorithms.md §10).

Row b of the batch holds its sequence's cached tokens in columns `[0, lens[b])`, each at the
position equal to its column. The cache is as wide as its longest row; the columns past a shorter
row's length are holes, which every forward masks out. A forward appends the same number of
columns N to every row (a row with fewer new tokens is padded with rows that attend only to
themselves); `settle` then moves the columns each row keeps to just after its valid prefix (the
accepted path of a tree, a chunk of committed tokens) and crops the cache to its new longest row.
Only the kept columns move: O(kept rows) per layer, as the single-sequence compaction
(`ModelAdapter.compact`).

Why padded rows rather than packed segments (one row holding every sequence back to back): the
modelling code is transformers' own and runs a `[B, ...]` cache with a `[B, 1, N, W+N]` mask;
packing the cache would give every forward a mask over the sum of all contexts (quadratic in the
batch) and make each row's compaction move every later sequence. Holes cost attention over
`max(lens) - lens[b]` masked columns per row, which `benchmarks/results/batch-layout.json` weighs
against repacking. The *queries* of a forward may be packed (`feed(pack=True)`,
engine/packed_rows.py): the new tokens then go through the model as one row and only the cache
layers and the attention see them laid out over the batch's rows.

A sequence joins with the cache of its own prefill (batch size 1), padded to the batch's width and
stacked; a sequence that leaves is cut out of every layer, and the cache shrinks to the longest row
left. Layers are transformers' `DynamicLayer`s or the `InPlaceLayer`s of the int8 target
(engine/kv_cache.py), kept in `storage_for(sequences)`: float64 for one sequence, float32 for more;
both are rebuilt through `_assign` on a join or a leave.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .kv_cache import MIN_CAPACITY, InPlaceLayer
from .packed_rows import PackedRows

# the dtype a batch's `InPlaceLayer`s keep (the float64 attention converts what it reads): with two
# sequences or more, a batched step over float32 buffers takes less time than over float64 ones;
# one sequence alone decodes faster over float64 buffers, as a single sequence's cache keeps them.
# The values are the same either way (engine/kv_cache.py).
BATCH_STORAGE = torch.float32
SINGLE_STORAGE = torch.float64


def storage_for(sequences: int) -> torch.dtype:
    """The dtype a batch of `sequences` keeps its `InPlaceLayer`s in."""
    return SINGLE_STORAGE if sequences <= 1 else BATCH_STORAGE


def _store_in(layer, storage: torch.dtype) -> None:
    """An `InPlaceLayer`'s buffers in `storage` from now on (its states converted, exactly)."""
    if isinstance(layer, InPlaceLayer) and layer.storage != storage:
        layer.storage = storage
        t = _tensors(layer)
        if t is not None:
            _assign(layer, *t)


@dataclass
class RowFeed:
    """What one row feeds in a forward: k tokens, their positions, what they attend to among the
    existing columns (`old`: `[k, W]` bool, W = the cache's width) and among the new ones
    (`new`: `[k, k]` bool)."""

    tokens: list[int]
    positions: list[int]
    old: torch.Tensor
    new: torch.Tensor

    @classmethod
    def chunk(cls, tokens: list[int], start: int, length: int, width: int) -> RowFeed:
        """A plain chunk after a row's `length` cached tokens: causal, at positions start, ..."""
        k = len(tokens)
        old = (torch.arange(width) < length).expand(k, width)
        causal = torch.ones(k, k, dtype=torch.bool).tril()
        return cls(tokens, list(range(start, start + k)), old, causal)


def _tensors(layer) -> tuple[torch.Tensor, torch.Tensor] | None:
    if not getattr(layer, "is_initialized", False) or layer.keys is None:
        return None
    return layer.keys, layer.values


def _assign(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Give `layer` these keys and values (an `InPlaceLayer`: in fresh buffers of its storage dtype
    with room to grow)."""
    if isinstance(layer, InPlaceLayer):
        rows = keys.shape[2]
        buffers = []
        for states in (keys, values):
            buffer = layer._allocate(states, max(MIN_CAPACITY, 2 * rows))
            buffer[:, :, :rows] = states
            buffers.append(buffer)
        layer._buffers = buffers
        layer.keys, layer.values = (buffer[:, :, :rows] for buffer in buffers)
        layer.dtype, layer.device = layer.storage, keys.device
    else:
        layer.keys, layer.values = keys, values
        layer.dtype, layer.device = keys.dtype, keys.device
    layer.is_initialized = True


def _pad(states: torch.Tensor, width: int) -> torch.Tensor:
    if states.shape[2] == width:
        return states
    pad = states.new_zeros((*states.shape[:2], width - states.shape[2], states.shape[3]))
    return torch.cat([states, pad], dim=2)


class BatchRows:
    """One KV cache for several sequences, a batch row each, keyed by the caller's keys."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.cache: DynamicCache | None = None
        self.keys: list[Hashable] = []  # the key of each batch row
        self.lens: list[int] = []  # valid columns of each row

    # ------------------------------------------------------------------ membership
    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.keys

    def row(self, key: Hashable) -> int:
        return self.keys.index(key)

    def length(self, key: Hashable) -> int:
        return self.lens[self.row(key)]

    @property
    def width(self) -> int:
        """Columns of the cache (its longest row, plus what a step appended and has not settled)."""
        return 0 if self.cache is None else self.cache.get_seq_length()

    @torch.inference_mode()
    def add(self, key: Hashable, cache: DynamicCache, length: int) -> None:
        """A sequence joins with the cache of its own prefill (batch size 1, `length` columns, or
        no tensors yet when `length` is 0)."""
        if key in self.keys:
            raise ValueError(f"{key!r} is in the batch already")
        storage = storage_for(len(self.keys) + 1)
        if self.cache is None:
            self.cache = cache
            for layer in cache.layers:
                _store_in(layer, storage)
        else:
            width = max(self.width, length)
            for mine, theirs in zip(self.cache.layers, cache.layers):
                if isinstance(mine, InPlaceLayer):
                    mine.storage = storage  # `_assign` below allocates in it
                a, b = _tensors(mine), _tensors(theirs)
                if b is None and a is None:
                    continue
                like = a if a is not None else b
                if a is None:  # every row so far is empty
                    a = tuple(
                        t.new_zeros((len(self.keys), *t.shape[1:2], 0, t.shape[3])) for t in b
                    )
                if b is None:
                    b = tuple(t.new_zeros((1, *t.shape[1:2], 0, t.shape[3])) for t in like)
                keys = torch.cat([_pad(a[0], width), _pad(b[0].to(a[0].dtype), width)])
                values = torch.cat([_pad(a[1], width), _pad(b[1].to(a[1].dtype), width)])
                _assign(mine, keys, values)
        self.keys.append(key)
        self.lens.append(length)

    @torch.inference_mode()
    def remove(self, key: Hashable) -> None:
        """Cut a sequence out of every layer; the cache shrinks to the longest row left."""
        b = self.row(key)
        self.keys.pop(b)
        self.lens.pop(b)
        if not self.keys:
            self.cache = None
            return
        keep = torch.tensor([i for i in range(len(self.keys) + 1) if i != b], device=self.device)
        width = max(self.lens)
        storage = storage_for(len(self.keys))
        for layer in self.cache.layers:
            if isinstance(layer, InPlaceLayer):
                layer.storage = storage  # `_assign` below allocates in it
            t = _tensors(layer)
            if t is None:
                continue
            index = keep.to(t[0].device)
            _assign(
                layer,
                t[0].index_select(0, index)[:, :, :width].contiguous(),
                t[1].index_select(0, index)[:, :, :width].contiguous(),
            )

    # ------------------------------------------------------------------ forwards
    def feed(
        self,
        run: Callable[..., torch.Tensor],
        feeds: list[RowFeed | None],
        pack: bool = False,
        split: bool = True,
    ) -> tuple[torch.Tensor, int]:
        """One forward of every row's feed (None: the row feeds nothing, a padded row). `run(ids
        [B, N], positions [B, N], allowed [B, N, W + N] bool, key_positions [B, W + N])` runs the
        model over the cache and returns its output `[B, N, ...]`. Returns that output and W, the
        column where the new tokens start.

        `pack`: where rows feed different numbers of tokens, the real tokens are packed into one
        row (engine/packed_rows.py): `run(ids [1, S], positions [1, S], allowed, key_positions,
        packed)` with the `PackedRows` as fifth argument, its output `[1, S, ...]`; the output is
        laid out as `[B, N, ...]` here all the same (zeros at the padded slots). `split`: whether
        the packing may split the attention (`PackedRows.of`)."""
        width = self.width
        sizes = [0 if f is None else len(f.tokens) for f in feeds]
        n = max(sizes, default=0)
        batch = len(self.keys)
        ids = torch.zeros(batch, n, dtype=torch.long)
        pos = torch.zeros(batch, n, dtype=torch.long)
        allowed = torch.zeros(batch, n, width + n, dtype=torch.bool)
        # a padded query attends to itself only
        allowed[:, :, width:] = torch.eye(n, dtype=torch.bool)
        for b, feed in enumerate(feeds):
            if feed is None:
                continue
            k = len(feed.tokens)
            ids[b, :k] = torch.tensor(feed.tokens, dtype=torch.long)
            pos[b, :k] = torch.tensor(feed.positions, dtype=torch.long)
            allowed[b, :k, :width] = feed.old
            allowed[b, :k, width : width + k] = feed.new
        keys = torch.cat([torch.arange(width).expand(batch, width), pos], dim=1)
        dev = self.device
        if not pack or batch < 2 or sum(sizes) == batch * n:
            return run(ids.to(dev), pos.to(dev), allowed.to(dev), keys.to(dev)), width
        rows = PackedRows.of(sizes, split=split)
        flat_ids = ids.view(-1)[rows.index][None]
        flat_pos = pos.view(-1)[rows.index][None]
        rows = rows.to(dev)
        out = run(flat_ids.to(dev), flat_pos.to(dev), allowed.to(dev), keys.to(dev), rows)[0]
        out = torch.cat([out, out.new_zeros(1, *out.shape[1:])])
        return out.index_select(0, rows.grid.reshape(-1)).view(batch, n, *out.shape[1:]), width

    def old_columns(self, key: Hashable, k: int) -> torch.Tensor:
        """`[k, W]`: a row's valid prefix, for `RowFeed.old`."""
        return (torch.arange(self.width) < self.length(key)).expand(k, self.width)

    @torch.inference_mode()
    def settle(self, kept: dict[Hashable, list[int]]) -> None:
        """Each row keeps `kept[key]` (ascending columns, each at or past the row's valid length;
        a missing key keeps nothing) just after its valid prefix; the cache is cropped to the
        longest row."""
        rows, src, dst = [], [], []
        for b, key in enumerate(self.keys):
            cols = kept.get(key, [])
            for i, col in enumerate(cols):
                if col != self.lens[b] + i:
                    rows.append(b)
                    src.append(col)
                    dst.append(self.lens[b] + i)
            self.lens[b] += len(cols)
        if self.cache is None:
            return
        if rows:
            index: dict[torch.device, tuple[torch.Tensor, ...]] = {}  # made once per device
            for layer in self.cache.layers:
                t = _tensors(layer)
                if t is None:
                    continue
                dev = t[0].device
                if dev not in index:
                    index[dev] = tuple(torch.tensor(x, device=dev) for x in (rows, src, dst))
                r, s, d = index[dev]
                for states in t:
                    states[r, :, d] = states[r, :, s]
        drop = self.width - max(self.lens, default=0)
        if drop > 0:
            self.cache.crop(-drop)
