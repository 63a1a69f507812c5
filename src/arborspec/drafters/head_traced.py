"""The draft head's forwards replayed from TorchScript traces, as the int8 target's are.

Why (docs/algorithms.md §11): the head is one decoder layer, a few small products; on a CPU most
of its forward is the Python that dispatches them through the modules (a one-row forward of the
embedded pair's int8 head over a 200-row cache: 0.83 ms eager, 0.31 ms replayed;
benchmarks/results/verify-probes.json). A speculative
step runs it about twice (`begin`, `expand`), so the replay shortens every step.

The replay records the head body's forward once (`engine/traced.frozen_trace`) and runs the same
operators on the same tensors in the same order, so its hidden states and cache rows are those
of the eager forward with the same inputs, bit for bit (tests/test_head_traced.py). Its inputs:
token ids, the features, positions, the additive mask, and the head's cache rows of its one layer
(keys, values); it returns the hidden states and the layer's rows with the new ones appended,
which become the drafter's cache. One trace per kind of forward: one request or several (the
batched head drafter, drafters/head_batch.py, whose cache holds a row per request), one row or
several (the attention decides by the number of query rows). A mask is always passed (a causal
chunk gets its causal mask), so no decision depends on the cache length.

Used by `HeadDrafter` on CPU (`HeadDrafter(head, trace=None)`); the first forward of a generation
(the prompt, from an empty cache) runs eagerly. `trace=False` turns it off.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..engine.traced import frozen_trace, replay


def cache_holding(keys: torch.Tensor, values: torch.Tensor, config) -> DynamicCache:
    """A head cache whose one layer is transformers' `DynamicLayer` holding these rows (its update
    appends the new ones)."""
    layer = DynamicLayer()
    layer.keys, layer.values, layer.is_initialized = keys, values, True
    cache = DynamicCache(config=config)
    cache.layers = [layer]
    return cache


class _Traceable(nn.Module):
    """The head as a function of tensors: (ids, feats, positions, mask, keys, values) -> (hidden,
    keys, values), over `cache_holding` the given rows."""

    def __init__(self, head) -> None:
        super().__init__()
        self.head = head
        # the target's embedding, which the head calls by reference: a submodule here, so the
        # tracer takes its weight as the module's (a free tensor that requires grad is refused)
        self.embedding = head._target[0]

    def forward(self, ids, feats, positions, mask, keys, values):
        cache = cache_holding(keys, values, self.head.body.config)
        hidden = self.head(ids, feats, positions, mask, cache)
        layer = cache.layers[0]
        return hidden, layer.keys, layer.values


class TracedHead:
    """A `DraftHead`'s forwards through traces (module doc)."""

    def __init__(self, head) -> None:
        self.head = head
        # (several requests, several rows) -> trace
        self.traces: dict[tuple[bool, bool], torch.jit.ScriptModule] = {}

    @staticmethod
    def supports(cache: DynamicCache) -> bool:
        """A cache of one layer holding rows (the prompt's forward, from an empty cache, runs
        eagerly)."""
        layers = getattr(cache, "layers", None)
        return (
            layers is not None
            and len(layers) == 1
            and type(layers[0]) is DynamicLayer
            and layers[0].is_initialized
            and layers[0].keys is not None
            and layers[0].keys.numel() > 0
        )

    def __call__(
        self,
        ids: torch.Tensor,  # [B, N]
        feats: torch.Tensor,  # [B, N, H]
        positions: torch.Tensor,  # [B, N]
        mask: torch.Tensor,  # [B, 1, N, past + N] additive
        cache: DynamicCache,
    ) -> torch.Tensor:  # [B, N, H]
        layer = cache.layers[0]
        args = (ids, feats, positions, mask, layer.keys, layer.values)
        key = (ids.shape[0] > 1, ids.shape[1] > 1)
        trace = self.traces.get(key)
        if trace is None:
            trace = self.traces[key] = frozen_trace(_Traceable(self.head), args)
        hidden, layer.keys, layer.values = replay(trace, args)
        return hidden
