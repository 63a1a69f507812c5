"""The attention masks a forward of the adapter hands the model, per layer type: full attention
and sliding-window attention (docs/algorithms.md §4).

The adapter keeps every layer's KV cache as a full layer (`engine/kv_cache.new_cache`): a
sliding-window cache layer drops its oldest rows, so its rows would no longer sit at their
positions and a compaction, which copies rows by index, would break. The window goes into the
mask instead. A query at position q sees a key at position k when the tree (or plain causality)
allows it and, in a sliding layer, when k > q - window (transformers'
`masking_utils.sliding_window_overlay`). Positions, not cache rows, measure the window: the draft
model's cache holds tree nodes fed by earlier forwards of the same step, whose positions are
their parents' plus one, not their rows.

transformers' models whose layers are of several types take `attention_mask` as a dict keyed by
layer type (`{"full_attention": ..., "sliding_attention": ...}`, Gemma 2 and 3, Qwen2); a model
whose layers are all of one type takes one 4D mask and uses it as it is (Mistral, Phi-3,
StarCoder2 with a `sliding_window`: every layer slides). `AttentionLayout.mask` gives one mask
where every layer sees the same pattern and the dict otherwise.

Any other layer type (chunked attention, linear attention or a recurrent state, layers without a
KV cache of their own) has no additive mask that expresses a tree over it, or a cache that
cannot be compacted: `AttentionLayout.of` refuses it in one line when the adapter is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ArborError
from .tree import additive_mask

try:  # how transformers' own cache reads the layer types (recent 5.x releases)
    from transformers.cache_utils import get_layer_types_and_kwargs
except ImportError:  # pragma: no cover - earlier 5.x releases
    get_layer_types_and_kwargs = None

FULL = "full_attention"
SLIDING = "sliding_attention"
# how a refusal names a layer type whose name does not say what it is
_WHAT = {
    "linear_attention": "linear_attention (recurrent state)",
    "conv": "conv (recurrent state)",
    "hybrid": "hybrid (recurrent state)",
    "hybrid_sliding": "hybrid_sliding (recurrent state)",
    "dummy": "dummy (no KV cache of their own: shared or attention-free)",
}


def layer_types(config) -> tuple[list[str], list[int | None]]:
    """The type of every decoder layer of `config` (a decoder's config) and each layer's sliding
    window (None where it has none), as transformers' cache reads them: `layer_types` where the
    config has it, else `sliding_window` (every layer slides) or `attention_chunk_size`."""
    if get_layer_types_and_kwargs is not None:
        types, kwargs = get_layer_types_and_kwargs(config)
        windows = [
            kw.get("sliding_window") if t == SLIDING else None for t, kw in zip(types, kwargs)
        ]
        return list(types), windows
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is None:
        chunked = getattr(config, "attention_chunk_size", None) is not None
        kind = SLIDING if window is not None else "chunked_attention" if chunked else FULL
        types = [kind] * config.num_hidden_layers
    return list(types), [window if t == SLIDING else None for t in types]


@dataclass(frozen=True)
class AttentionLayout:
    """Which layer types a model has (`FULL`, `SLIDING`) and the window of its sliding layers."""

    types: tuple[str, ...]  # the distinct layer types, in the order of first appearance
    window: int | None = None  # tokens a sliding layer sees, the query included; None: none slides

    @classmethod
    def of(cls, model) -> AttentionLayout:
        """The layout of `model`'s decoder; `ArborError` for a layer type no mask expresses."""
        config = model.config.get_text_config(decoder=True)
        name = type(model).__name__
        types, windows = layer_types(config)
        other = [t for t in dict.fromkeys(types) if t not in (FULL, SLIDING)]
        if other:
            raise ArborError(
                f"{name} has {', '.join(_WHAT.get(t, t) for t in other)} layers: arborspec's tree "
                "attention handles full and sliding-window attention layers only"
            )
        if getattr(config, "use_bidirectional_attention", False):
            raise ArborError(
                f"{name} attends bidirectionally: arborspec decodes causal language models only"
            )
        sizes = {w for t, w in zip(types, windows) if t == SLIDING}
        if len(sizes) > 1 or None in sizes:
            raise ArborError(
                f"{name} has sliding windows of {', '.join(sorted(map(str, sizes)))} tokens: "
                "arborspec's tree attention handles one window size"
            )
        return cls(tuple(dict.fromkeys(types)), sizes.pop() if sizes else None)

    @property
    def sliding(self) -> bool:
        """Some layer slides: every forward needs explicit masks and the positions of the keys."""
        return self.window is not None

    def mask(
        self,
        allowed: torch.Tensor | None,  # [N, P + N] bool: what the tree allows; None: plain causal
        query_positions: torch.Tensor,  # [N] long
        key_positions: torch.Tensor | None,  # [P + N] long: cache rows, then these N rows
        dtype: torch.dtype,
    ) -> torch.Tensor | dict[str, torch.Tensor] | None:
        """The `attention_mask` for a forward of N rows after P cached rows: additive `[1, 1, N,
        P + N]` masks in `dtype`, one for every layer or a dict by layer type.

        Without a sliding layer, `allowed` as it is (None: the model's own causal mask, and
        `key_positions` are not read). With one, an explicit mask always: a plain chunk's query
        i sees the cached rows and its own chunk up to itself."""
        if not self.sliding:
            return None if allowed is None else additive_mask(allowed, dtype)[None, None]
        n, length = query_positions.numel(), key_positions.numel()
        if allowed is None:
            allowed = torch.ones(n, length, dtype=torch.bool, device=query_positions.device)
            allowed = allowed.tril(length - n)
        near = query_positions[:, None] - key_positions[None, :] < self.window
        out = {}
        if FULL in self.types:
            out[FULL] = additive_mask(allowed, dtype)[None, None]
        if SLIDING in self.types:
            out[SLIDING] = additive_mask(allowed & near.to(allowed.device), dtype)[None, None]
        return next(iter(out.values())) if len(out) == 1 else out

    def batch_mask(
        self,
        allowed: torch.Tensor,  # [B, N, W + N] bool
        query_positions: torch.Tensor,  # [B, N] long
        key_positions: torch.Tensor,  # [B, W + N] long
        dtype: torch.dtype,
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        """`mask` for a batch of rows (engine/batch_rows.py): additive `[B, 1, N, W + N]` masks,
        one for every layer or a dict by layer type."""
        out = {FULL: additive_mask(allowed, dtype)[:, None]} if FULL in self.types else {}
        if SLIDING in self.types:
            near = query_positions[:, :, None] - key_positions[:, None, :] < self.window
            out[SLIDING] = additive_mask(allowed & near, dtype)[:, None]
        return next(iter(out.values())) if len(out) == 1 else out

