"""The draft head for a batch of requests: one head forward per call for every request in it.

The same drafter as `HeadDrafter` (drafters/head.py), whose docstring says what a head row holds,
with every request a row of one head KV cache (engine/batch_rows.py): `begin` feeds each
request's newly committed tokens in one forward, `expand` the nodes of several requests' trees
in one forward (each node sees its request's committed rows, its ancestors' rows and itself),
`commit` drops the draft rows. A joining request's prompt is fed alone, at `join`. Forwards over
the batch's cache replay the head's traces where the single-request drafter does.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ..common.timing import clock
from ..engine.batch_rows import BatchRows, RowFeed
from ..engine.contracts import BatchDrafter
from ..engine.tree import additive_mask
from .head_traced import TracedHead
from .model import tree_rows_allowed


class _Slot:
    """One request's head state: the target features of its committed tokens, the committed
    count at `begin`, and this step's draft rows (token path -> cache column, predicted feature)."""

    def __init__(self) -> None:
        self.feats: list[torch.Tensor] = []
        self.base = 0
        self.rows: dict[tuple[int, ...], int] = {}
        self.pred: dict[tuple[int, ...], torch.Tensor] = {}
        self.root: torch.Tensor | None = None  # the root's predicted feature, when known


class HeadBatchDrafter(BatchDrafter):
    uses_target_features = True

    def __init__(self, head, traced: TracedHead | None = None) -> None:
        """`traced`: the head's forwards replayed from traces (drafters/head_traced.py), shared
        with the single-request drafter that made this one."""
        self.head = head
        self.traced = traced
        self.vocab_size = head.vocab_size
        self.device = head.body.norm.weight.device
        self.dtype = head.body.norm.weight.dtype
        self.batch = BatchRows(self.device)
        self.slots: dict = {}

    def _zero(self) -> torch.Tensor:
        return torch.zeros(self.head.hidden_size, device=self.device, dtype=self.dtype)

    # ------------------------------------------------------------------ membership
    @torch.inference_mode()
    def join(self, key, prompt_ids: list[int], features: torch.Tensor | None) -> None:
        """Feed the request's prompt alone (its rows see nothing of the batch): row r is token r
        with the target's feature of token r - 1."""
        slot = self.slots[key] = _Slot()
        if features is not None:
            slot.feats.extend(features.detach().to(self.device, self.dtype).unbind(0))
        n = len(prompt_ids)
        prev = torch.stack([slot.feats[r - 1] if r > 0 else self._zero() for r in range(n)])
        cache = DynamicCache(config=self.head.body.config)
        t0 = clock()
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        pos = torch.arange(n, device=self.device).unsqueeze(0)
        hidden = self.head(ids, prev.unsqueeze(0), position_ids=pos, past_key_values=cache)[0]
        self.forward_time += clock(self.device) - t0
        slot.root = hidden[-1]
        self.batch.add(key, cache, n)

    def leave(self, key) -> None:
        self.slots.pop(key, None)
        if key in self.batch:
            self.batch.remove(key)

    # ------------------------------------------------------------------ forwards
    def _feed(self, feeds: dict, feats: dict) -> tuple[dict, int]:
        """One head forward of `feeds` (key -> RowFeed) with their input features (key -> `[k, H]`);
        key -> output rows `[k, H]`."""
        t0 = clock()
        batch = self.batch
        n = max(len(f.tokens) for f in feeds.values())
        inputs = torch.zeros(
            len(batch), n, self.head.hidden_size, device=self.device, dtype=self.dtype
        )
        for b, key in enumerate(batch.keys):
            if key in feeds:
                inputs[b, : len(feeds[key].tokens)] = feats[key]

        def run(ids, pos, allowed, key_pos):
            mask = additive_mask(allowed, self.dtype)[:, None]
            if self.traced is not None and self.traced.supports(batch.cache):
                return self.traced(ids, inputs, pos, mask, batch.cache)
            return self.head(ids, inputs, position_ids=pos, attention_mask=mask,
                             past_key_values=batch.cache)

        out, width = batch.feed(run, [feeds.get(key) for key in batch.keys])
        self.forward_time += clock(self.device) - t0
        self.forwards += 1
        rows = {
            key: out[b, : len(feeds[key].tokens)]
            for b, key in enumerate(batch.keys)
            if key in feeds
        }
        return rows, width

    @torch.inference_mode()
    def begin(self, committed: dict) -> dict:
        self.forward_time, self.forwards = 0.0, 0
        feeds, feats, fed = {}, {}, {}
        width = self.batch.width
        for key, tokens in committed.items():
            slot, n = self.slots[key], len(tokens)
            start = self.batch.length(key)
            if len(slot.feats) < n - 1:
                raise RuntimeError(
                    f"head drafter has {len(slot.feats)} target features for {n} tokens"
                )
            if start < n:
                feeds[key] = RowFeed.chunk(tokens[start:n], start, start, width)
                feats[key] = torch.stack(
                    [slot.feats[r - 1] if r > 0 else self._zero() for r in range(start, n)]
                )
        if feeds:
            out, width = self._feed(feeds, feats)
            self.batch.settle(
                {key: list(range(width, width + len(f.tokens))) for key, f in feeds.items()}
            )
            fed = {key: rows[-1] for key, rows in out.items()}
        roots = {}
        for key, tokens in committed.items():
            slot, n = self.slots[key], len(tokens)
            root = fed.get(key, slot.root)
            slot.base, slot.root = n, root
            slot.rows, slot.pred = {(): n - 1}, {(): root}
            roots[key] = root
        keys = list(roots)
        logits = self.head.full_logits(torch.stack([roots[k] for k in keys]))
        return dict(zip(keys, logits))

    @torch.inference_mode()
    def expand(self, items: list[tuple]) -> list[torch.Tensor]:
        width = self.batch.width
        feeds, feats, paths_of = {}, {}, {}
        for key, tree, nodes in items:
            if key in feeds:
                raise ValueError(f"one expand item per request, {key!r} has two")
            slot = self.slots[key]
            allowed, paths = tree_rows_allowed(tree, nodes, slot.base, width, slot.rows)
            positions = [slot.base - 1 + tree.depths[n] for n in nodes]
            feeds[key] = RowFeed(
                [tree.tokens[n] for n in nodes], positions, allowed[:, :width], allowed[:, width:]
            )
            feats[key] = torch.stack([slot.pred[path[:-1]] for path in paths])
            paths_of[key] = paths
        out, width = self._feed(feeds, feats)
        result = []
        for key, _tree, _nodes in items:
            slot, hidden = self.slots[key], out[key]
            for i, path in enumerate(paths_of[key]):
                slot.rows[path], slot.pred[path] = width + i, hidden[i]
            result.append(self.head.full_logits(hidden))
        return result

    def commit(self, items: list[tuple], features: dict) -> None:
        for key, _tree, _accepted in items:
            slot = self.slots[key]
            f = features.get(key)
            if f is not None and f.numel():
                slot.feats.extend(f.detach().to(self.device, self.dtype).unbind(0))
            slot.rows, slot.pred = {}, {}
        self.batch.settle({})  # every row keeps its committed tokens; draft rows are dropped
