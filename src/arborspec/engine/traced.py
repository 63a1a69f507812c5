"""Decoder forwards replayed from a TorchScript trace: the same operators, without the Python.

Why (docs/algorithms.md §11): on a CPU most of a small forward of the int8 target is not
arithmetic. Its ~120 int8 products read the weights near memory speed; the rest of a one-row
forward is ~2,000 small operators, each dispatched from Python through transformers' modules and
arborspec's int8 wrappers. A trace records the operators one eager forward dispatches (the
unmodified modelling code runs once, under the tracer) and replays them from C++: no module
calls, no Python per operator.

The replay runs *the same operators on the same tensors in the same order*: no fusion, no
reordering (`torch.jit.optimized_execution(False)` runs the recorded graph as it is), so its
results are the eager forward's bit for bit (tests/test_traced.py). That is what the int8 target
needs, whose tree verification relies on every row being computed as when alone.

What a trace may not bake in, it takes as inputs:

* the KV cache: each `InPlaceLayer`'s two buffers (engine/kv_cache.py) and the column the forward
  writes at. Inside the trace a layer writes its new rows through `_write_rows`, a TorchScript
  *function*, so the write position and the cache length stay values of the replay rather than
  the constants of the traced forward; buffers grow outside, before the call;
* the attention mask and the positions.

The trace is frozen (`torch.jit.freeze` without the passes that may change numerics): the
submodules' calls inlined into one graph, their weights its constants (the same tensors, not
copies).

A forward's sizes (rows, batch, cache length) are read from its tensors in the replay. Python
decisions that depend on them are recorded as taken when traced: the float64 attention decides
between one query row and several, so a trace is kept per `TraceKey` (batch of one or more, one
row or more, mask or none, a batch packed into one row or not, `engine/packed_rows.py`, where
its tokens sit being an input, and its attention split in two calls or not; rows enough for
oneDNN's int8 kernel or not) and made on the first forward of its kind (about a second for the
embedded target). Traces live in memory with the adapter that made them, for the process.

`torch.jit.trace` is deprecated by PyTorch in favour of `torch.compile` and `torch.export`, which
do not give this path bit-identical results here (docs/evaluation.md (h)); every forward the
trace cannot take runs eagerly (`TracedDecoder.supports`), and `ModelAdapter(trace=False)`
turns it off.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..common.hf_cache import cache_kwargs
from .int8 import onednn_rows
from .kv_cache import InPlaceLayer
from .packed_rows import PackedRows, grid_states, packed, packing


def _write_rows(buffer: torch.Tensor, states: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """`states [B, H, N, D]` into `buffer` at columns start..start+N; the buffer's first
    start + N columns."""
    first = int(start)
    end = first + states.size(2)
    buffer[:, :, first:end] = states
    return buffer[:, :, :end]


with warnings.catch_warnings():  # PyTorch's deprecation of TorchScript (module doc)
    warnings.simplefilter("ignore")
    _write_rows = torch.jit.script(_write_rows)


class _TracedLayer(DynamicLayer):
    """A cache layer inside the trace: an `InPlaceLayer`'s buffers and the write column, both
    inputs of the traced forward."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, start: torch.Tensor) -> None:
        super().__init__()
        self.key_buffer, self.value_buffer, self.start = keys, values, start
        self.keys, self.values = keys, values
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        # a packed batched forward's tokens go to their requests' rows (engine/packed_rows.py)
        key_states, value_states = grid_states(key_states, value_states)
        self.keys = _write_rows(self.key_buffer, key_states, self.start)
        self.values = _write_rows(self.value_buffer, value_states, self.start)
        return self.keys, self.values


class _Traceable(nn.Module):
    """The decoder as a function of tensors only: (ids, positions, [mask,] [the packing's
    `packs` tensors,] start, buffers...) -> last hidden states `[B, N, H]` (`[1, S, H]` packed)."""

    def __init__(self, decoder: nn.Module, masked: bool, packs: int) -> None:
        super().__init__()
        self.decoder, self.masked, self.packs = decoder, masked, packs

    def forward(self, input_ids, position_ids, *rest):
        mask, rest = (rest[0], rest[1:]) if self.masked else (None, rest)
        pack = PackedRows.of_tensors(rest[: self.packs]) if self.packs else None
        rest = rest[self.packs :]
        start, buffers = rest[0], rest[1:]
        cache = DynamicCache(config=self.decoder.config)
        cache.layers = [
            _TracedLayer(buffers[i], buffers[i + 1], start) for i in range(0, len(buffers), 2)
        ]
        # the batch's rows packed into one (engine/packed_rows.py)
        with nullcontext() if pack is None else packing(pack):
            out = self.decoder(
                input_ids=input_ids,
                position_ids=position_ids,
                attention_mask=mask,
                use_cache=True,
                **cache_kwargs(self.decoder, cache),
            )
        return out[0] if isinstance(out, tuple) else out.last_hidden_state


@dataclass(frozen=True)
class TraceKey:
    """The Python decisions a trace records: several sequences or one, several query rows or one,
    whether a mask is passed (and its kind), whether the batch's tokens are packed into one row
    (engine/packed_rows.py; where they sit is an input of the replay; several sequences and several
    rows then count the batch's layout, not the packed row), whether the forward has
    rows enough for oneDNN's int8 kernel (`int8.onednn_rows`; which kernel each product runs is
    then decided in the replay), the cache buffers' dtype (the attention's conversion of
    float32 buffers is recorded; float64 ones need none), and whether a packed forward's
    attention is split in two calls (`packed_rows.AttentionSplit`; where it splits is an input)."""

    batched: bool
    rows: bool
    mask: tuple[torch.dtype, int, int] | None  # dtype, dimensions, heads
    packs: bool = False
    many: bool = False
    storage: torch.dtype = torch.float64  # the cache buffers' dtype (engine/kv_cache.py)
    split: bool = False  # a packed forward's attention in two calls (`AttentionSplit`)

    @classmethod
    def of(
        cls,
        input_ids: torch.Tensor,
        mask: torch.Tensor | None,
        pack: PackedRows | None = None,
        storage: torch.dtype = torch.float64,
    ) -> TraceKey:
        kind = None if mask is None else (mask.dtype, mask.dim(), mask.shape[1])
        many = onednn_rows(input_ids.numel())
        batch, rows = input_ids.shape if pack is None else pack.grid.shape
        split = pack is not None and pack.split is not None
        return cls(batch > 1, rows > 1, kind, pack is not None, many, storage, split)


class TracedDecoder:
    """A model's decoder forwards through traces (module doc), one per `TraceKey`."""

    def __init__(self, model) -> None:
        self.decoder = model.get_decoder()
        self.traces: dict[TraceKey, torch.jit.ScriptModule] = {}

    @staticmethod
    def supports(cache, input_ids: torch.Tensor, mask) -> bool:
        """Whether this forward can run from a trace: every cache layer an `InPlaceLayer`, holding
        rows (every forward writes all layers, so the first tells; a prefill from an empty cache
        runs eagerly: its attention takes the causal flag, which a trace of a later forward did not
        record), one mask tensor or none, and a plain chunk (no mask) of one row only. Padded rows
        being skipped are skipped by a trace of its own, which takes the real rows as an input."""
        layers = getattr(cache, "layers", None)
        if (
            not layers
            or any(type(layer) is not InPlaceLayer for layer in layers)
            or not layers[0].is_initialized
            or layers[0].length == 0
        ):
            return False
        if mask is None:
            return input_ids.shape[1] == 1
        return isinstance(mask, torch.Tensor)

    def __call__(
        self,
        input_ids: torch.Tensor,  # [B, N]
        position_ids: torch.Tensor,  # [B, N]
        mask: torch.Tensor | None,
        cache,
    ) -> torch.Tensor:  # [B, N, H]
        layers = cache.layers
        pack = packed(input_ids.numel()) if input_ids.shape[0] == 1 else None
        start = layers[0].length
        end = start + (input_ids.shape[1] if pack is None else pack.grid.shape[1])
        buffers = []
        for layer in layers:
            layer.reserve(end)
            buffers += layer.buffers
        args = (input_ids, position_ids) + (() if mask is None else (mask,))
        packing_args = () if pack is None else pack.tensors()
        args += packing_args
        args += (torch.tensor(start),) + tuple(buffers)
        key = TraceKey.of(input_ids, mask, pack, buffers[0].dtype)
        trace = self.traces.get(key)
        if trace is None:
            trace = self.traces[key] = self._trace(args, mask is not None, len(packing_args))
        hidden = replay(trace, args)
        for layer in layers:
            layer.extend_to(end)
        return hidden

    def _trace(self, args: tuple, masked: bool, packs: int) -> torch.jit.ScriptModule:
        """Record one forward (its writes land in the cache, and are written again by the replay
        that follows with the same values)."""
        return frozen_trace(_Traceable(self.decoder, masked, packs), args)


def frozen_trace(module: nn.Module, args: tuple) -> torch.jit.ScriptModule:
    """`module` recorded on `args` and frozen (module doc): one flat graph, the submodules' calls
    inlined and their weights constants of it (~1 ms less per forward of the embedded target than
    calling 400 submodule methods); no pass that could change a value."""
    with warnings.catch_warnings():
        # the tracer's notes on Python values it records as constants (module doc), and
        # PyTorch's deprecation of tracing
        warnings.simplefilter("ignore")
        trace = torch.jit.trace(module, args, check_trace=False)
        return torch.jit.freeze(trace.eval(), optimize_numerics=False)


def replay(trace: torch.jit.ScriptModule, args: tuple):
    """Run a `frozen_trace` as recorded: no fusion, no reordering (module doc)."""
    with torch.jit.optimized_execution(False):
        return trace(*args)
