"""The target side of batched decoding: every request's tree verified by one forward.

Each request is a row of one KV cache (engine/batch_rows.py). A step feeds every row its tree
(root first; a request decoded plainly feeds its root alone) with its own positions and mask: a
node sees its row's committed tokens, its ancestors and itself, never another request's rows.
The LM head runs later, only on the rows each request's verifier reads (`LazyLogits`), as in
single-sequence decoding (engine/adapter.py), whose model, head and prefill this reuses.
"""

from __future__ import annotations

from collections.abc import Hashable
from contextlib import nullcontext

import torch

from ..errors import ArborError
from .adapter import ModelAdapter
from .batch_rows import BatchRows, RowFeed
from .kv_cache import uses_float64_attention
from .lm_head import LazyLogits
from .packed_rows import packing
from .tree import TokenTree


class BatchTarget:
    """The target model's batch: `join` (prefill), `verify_forward` (all trees), `keep`, `leave`."""

    def __init__(self, adapter: ModelAdapter) -> None:
        if not adapter.head.supported:
            raise ArborError(
                "batched decoding reads LM-head rows itself, which "
                f"{type(adapter.model).__name__}'s head does not allow (placed by a device map, "
                "or a logit transform): load the model on one device or decode one request "
                "at a time"
            )
        self.adapter = adapter
        self.rows = BatchRows(adapter.device)
        # trees of different sizes packed into one row (engine/packed_rows.py) where the float64
        # attention and its cache layers read the packing
        self.packs = uses_float64_attention(adapter.model)
        # a packed forward's attention in two calls where that attends fewer query slots
        # (engine/packed_rows.py, `split_width`)
        self.splits = True

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        return self.rows.width

    def length(self, key: Hashable) -> int:
        return self.rows.length(key)

    def join(self, key: Hashable, prompt_ids: list[int]) -> torch.Tensor | None:
        """Prefill all but the last prompt token (the first root) alone and add the request's row;
        returns the last hidden states of the prefilled tokens (`[n - 1, H]`, None for a one-token
        prompt), for a drafter that reads the target's features."""
        adapter = self.adapter
        adapter.reset()
        hidden = None
        if len(prompt_ids) > 1:
            hidden = adapter.hidden_forward(torch.tensor(prompt_ids[:-1]))
        self.rows.add(key, adapter.cache, len(prompt_ids) - 1)
        adapter.reset()
        return hidden

    def leave(self, key: Hashable) -> None:
        self.rows.remove(key)

    @torch.inference_mode()
    def verify_forward(
        self, trees: dict[Hashable, TokenTree]
    ) -> tuple[dict[Hashable, LazyLogits], dict[Hashable, torch.Tensor], int]:
        """One forward of every request's tree (every row must have one). Returns each request's
        logits on demand, its hidden states `[n, H]` and W, the column of every root."""
        adapter = self.adapter
        rows = self.rows
        feeds = []
        for key in rows.keys:
            tree = trees[key]
            past = rows.length(key)
            depths = torch.tensor(tree.depths) + past
            feeds.append(
                RowFeed(
                    tree.tokens,
                    depths.tolist(),
                    rows.old_columns(key, tree.num_nodes),
                    tree.ancestors_mask(),
                )
            )
        layout, dtype = adapter.layout, adapter.dtype

        def run(ids, pos, allowed, key_pos, packed=None):
            mask = layout.batch_mask(allowed, pos, key_pos, dtype)
            with nullcontext() if packed is None else packing(packed):
                return adapter.decoder_forward(ids, pos, mask, rows.cache)

        hidden, width = rows.feed(run, feeds, pack=self.packs, split=self.splits)
        logits, states = {}, {}
        for b, key in enumerate(rows.keys):
            n = trees[key].num_nodes
            states[key] = hidden[b, :n]
            logits[key] = LazyLogits(states[key], adapter.head)
        return logits, states, width

    def keep(self, kept: dict[Hashable, list[int]], width: int) -> None:
        """After verification: each request keeps its root and the tree nodes `kept[key]`
        (indices into its tree, ascending), everything else of the step is dropped."""
        self.rows.settle({key: [width + n for n in [0] + nodes] for key, nodes in kept.items()})
