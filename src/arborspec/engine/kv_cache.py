"""The target's KV cache: transformers' `DynamicCache`, with, for float64-attention models, a layer
that writes its keys and values in place into buffers that grow by doubling.

Why (docs/algorithms.md §8): the batch-invariant attention (`invariant_attention.py`) computes in
float64. Over transformers' `DynamicLayer` every forward first copied the whole cache of every layer
once more (`torch.cat`) to append its new rows, more for a tree (its cache view is strided after a
crop), and converted it to float64 again. `InPlaceLayer` writes only the new rows, after the kept
ones; a crop or a compaction (`ModelAdapter.compact`, which copies the accepted rows into place
through `keys`/`values`) moves no memory. `keys`/`values` are views of the first `length` rows of
the buffers.

The buffers' dtype is the layer's `storage`. A single sequence's cache keeps float64, so the
attention reads it as it is; a batch of two sequences or more keeps float32, the dtype the model
computes them in, converted as the attention reads them (engine/batch_rows.py): the same values
either way. A one-row attention streams the whole cache from memory, and over a batch reading half
the bytes and converting them costs less than reading float64, while one sequence alone decodes
faster over float64, in a batch of one as alone.

Only the layer's storage changes: the modelling code is transformers' own, and an `InPlaceLayer` is
a `DynamicLayer` for everything that reads it (`get_seq_length`, masks, `crop`).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from .invariant_attention import NAME as FLOAT64_ATTENTION
from .packed_rows import grid_states

MIN_CAPACITY = 256  # rows allocated at first; the buffer doubles when it is full


class InPlaceLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are views `[B, H, length, D]` of buffers grown by
    doubling, in `storage` (module doc; the states written to them are converted, exactly).

    Only appending changes: `DynamicLayer`'s own `crop` (a shorter view), `get_seq_length` (the
    view's length) and `reset` (drops the views; the next update allocates afresh) work on the
    views as they are."""

    def __init__(self, storage: torch.dtype = torch.float64) -> None:
        super().__init__()
        self.storage = storage

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = self.storage, key_states.device
        self._buffers = [
            self._allocate(states, MIN_CAPACITY) for states in (key_states, value_states)
        ]
        self.keys, self.values = (buffer[:, :, :0] for buffer in self._buffers)
        self.is_initialized = True

    def _allocate(self, states: torch.Tensor, rows: int) -> torch.Tensor:
        return states.new_empty((*states.shape[:2], rows, states.shape[3]), dtype=self.storage)

    @property
    def length(self) -> int:
        """The rows kept (the views' length)."""
        return self.keys.shape[2]

    @property
    def buffers(self) -> list[torch.Tensor]:
        """The key and value buffers (their first `length` rows are `keys` and `values`)."""
        return self._buffers

    def reserve(self, end: int) -> None:
        """Buffers of at least `end` rows: when full, twice what is needed, the kept rows
        copied over."""
        if end <= self._buffers[0].shape[2]:
            return
        start = self.length
        for i, kept in enumerate((self.keys, self.values)):
            grown = self._allocate(kept, 2 * end)
            grown[:, :, :start] = kept
            self._buffers[i] = grown
        self.extend_to(start)

    def extend_to(self, end: int) -> None:
        """The views over the buffers' first `end` rows (after rows were written there)."""
        keys, values = self._buffers
        self.keys, self.values = keys[:, :, :end], values[:, :, :end]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # a packed batched forward's tokens go to their requests' rows (engine/packed_rows.py)
        key_states, value_states = grid_states(key_states, value_states)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.length
        end = start + key_states.shape[2]
        self.reserve(end)
        self._buffers[0][:, :, start:end] = key_states
        self._buffers[1][:, :, start:end] = value_states
        self.extend_to(end)
        return self.keys, self.values


def uses_float64_attention(model) -> bool:
    """Whether `model` runs the float64 attention (the int8 target), whose cache `new_cache`
    keeps in `InPlaceLayer`s."""
    return getattr(model.config, "_attn_implementation", None) == FLOAT64_ATTENTION


def new_cache(model) -> DynamicCache:
    """An empty cache for `model` whose attention layers are all full layers: `InPlaceLayer`s under
    the float64 attention, else transformers' `DynamicLayer`s.

    For a sliding-window layer transformers builds a `DynamicSlidingWindowLayer`, which drops its
    oldest rows: rows would then no longer sit at their positions, and a compaction copies rows by
    index. The adapter keeps every row and cuts the window out of the mask instead
    (engine/attention_masks.py). Layers of any other kind are left as they are, for the adapter to
    refuse."""
    cache = DynamicCache(config=model.config)
    full = InPlaceLayer if uses_float64_attention(model) else DynamicLayer
    cache.layers = [
        full() if type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) else layer
        for layer in cache.layers
    ]
    return cache


CACHE_LAYERS = (DynamicLayer, InPlaceLayer)  # the layer types a tree forward can compact
