"""The target's KV cache: transformers' `DynamicCache`, with, for float64-attention models, a layer that keeps
its keys and values in float64 in a buffer that grows by doubling.

Why (docs/algorithms.md §8): the batch-invariant attention (`invariant_attention.py`) computes in float64.
Over transformers' `DynamicLayer` it converted the whole float32 cache of every layer to float64 on every
forward, after `torch.cat` had copied the whole cache once more to append the new rows: two passes over
the cache per layer and forward, more for a tree (its cache view is strided after a crop), that a plain
forward pays too. `Float64Layer` converts only the new rows (float32 -> float64 is exact, so the
attention reads the very values it read before) and writes them in place after the kept ones; a crop or a
compaction (`ModelAdapter.compact`, which copies the accepted rows into place through `keys`/`values`)
moves no memory. `keys`/`values` are views of the first `length` rows of the buffers.

Only the layer's storage changes: the modelling code is transformers' own, and a `Float64Layer` is a
`DynamicLayer` for everything that reads it (`get_seq_length`, masks, `crop`).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .invariant_attention import NAME as FLOAT64_ATTENTION

MIN_CAPACITY = 256  # rows allocated at first; the buffer doubles when it is full


class Float64Layer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are float64 views `[B, H, length, D]` of buffers grown by doubling."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = torch.float64, key_states.device
        self._keys = self._values = None
        self.length = 0
        self._view()
        self.is_initialized = True

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, need: int) -> None:
        capacity = max(MIN_CAPACITY, 2 * need)
        keys = key_states.new_empty((*key_states.shape[:2], capacity, key_states.shape[3]), dtype=torch.float64)
        values = value_states.new_empty((*value_states.shape[:2], capacity, value_states.shape[3]), dtype=torch.float64)
        if self.length:
            keys[:, :, : self.length] = self._keys[:, :, : self.length]
            values[:, :, : self.length] = self._values[:, :, : self.length]
        self._keys, self._values = keys, values

    def _view(self) -> None:
        if self._keys is None:
            self.keys = self.values = torch.empty(0, dtype=torch.float64, device=self.device)
        else:
            self.keys = self._keys[:, :, : self.length]
            self.values = self._values[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if self._keys is None or end > self._keys.shape[2]:
            self._grow(key_states, value_states, end)
        self._keys[:, :, start:end] = key_states  # float32 -> float64: exact
        self._values[:, :, start:end] = value_states
        self.length = end
        self._view()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self.length = max(0, self.length + tokens_to_remove)
        self._view()

    def reset(self) -> None:
        self._keys = self._values = None
        self.length = 0
        self.is_initialized = False
        self.keys = self.values = None

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("arborspec's caches hold one sequence")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("arborspec's caches hold one sequence")


def uses_float64_cache(model) -> bool:
    """Whether `model` runs the float64 attention (the int8 target), whose cache `new_cache` keeps in float64."""
    return getattr(model.config, "_attn_implementation", None) == FLOAT64_ATTENTION


def new_cache(model) -> DynamicCache:
    """An empty cache for `model`: `Float64Layer`s under the float64 attention, else transformers' own layers."""
    cache = DynamicCache(config=model.config)
    if uses_float64_cache(model):
        cache.layers = [Float64Layer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


CACHE_LAYERS = (DynamicLayer, Float64Layer)  # the layer types a tree forward can compact
