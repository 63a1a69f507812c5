"""What a batched step costs, measured: the target's forward over B requests of N rows each, a
batched draft forward, and the draft side's `begin` (docs/algorithms.md §10).

The single-sequence cost curve (engine/cost.py) times trees of one request; a batch's forward feeds
B requests' trees (packed into one row on the int8 target, engine/packed_rows.py, else every
request padded to the longest tree), and how its time grows with B and the rows is what decides
whether speculation pays at a given concurrency: on a CPU whose target is compute-bound per row
(the int8 target), every row a tree adds costs what a request's own token does.
`measure_batch_cost` times the grid once (synthetic requests of random tokens, chains of N - 1
nodes, the LM head's screened argmax of every root) on a batch of its own, never the decoder's;
`BatchCost` interpolates it. What the draft side costs beyond its timed forwards (its `begin`, the
builders' own work) is learnt from the decoder's steps (`engine/batch_decode.py`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from ..common.timing import clock
from .adapter import ModelAdapter
from .batch_drafts import PerRequestDrafts
from .batch_target import BatchTarget
from .cost import random_context
from .lm_head import screen_rows
from .tree import TokenTree

REQUESTS = (1, 2, 4, 8, 16)
WIDTHS = (1, 2, 4, 8, 16)
CONTEXT = 128


def _between(xs: tuple[int, ...], x: float) -> tuple[int, float]:
    """Index i and weight w with x = (1 - w) xs[i] + w xs[i + 1] (w outside [0, 1] beyond the ends:
    linear extrapolation)."""
    i = min(max(bisect.bisect_right(xs, x) - 1, 0), len(xs) - 2)
    return i, (x - xs[i]) / (xs[i + 1] - xs[i])


@dataclass(frozen=True)
class BatchCost:
    requests: tuple[int, ...]
    widths: tuple[int, ...]
    target_s: tuple[tuple[float, ...], ...]  # [request count][width]: one verifying forward
    draft_s: tuple[float, ...]  # [request count]: one batched draft forward of one node each

    def target(self, requests: int, width: int) -> float:
        """Seconds of a forward over `requests` rows of `width` tokens (bilinear, extrapolated)."""
        i, u = _between(self.requests, requests)
        j, v = _between(self.widths, width)
        t = self.target_s
        low = t[i][j] + v * (t[i][j + 1] - t[i][j])
        high = t[i + 1][j] + v * (t[i + 1][j + 1] - t[i + 1][j])
        return max(0.0, low + u * (high - low))

    def _by_requests(self, values: tuple[float, ...], requests: int) -> float:
        i, u = _between(self.requests, requests)
        return max(0.0, values[i] + u * (values[i + 1] - values[i]))

    def draft(self, requests: int) -> float:
        return self._by_requests(self.draft_s, requests)


@torch.inference_mode()
def measure_batch_cost(
    adapter: ModelAdapter, drafts=None, requests=REQUESTS, widths=WIDTHS, repeats: int = 2
) -> BatchCost:
    """Time the grid (module doc) on a batch of its own; `drafts`: a fresh batch drafter (None: no
    draft costs)."""
    target = BatchTarget(adapter)
    most = max(requests)
    contexts = [random_context(adapter.vocab_size, CONTEXT + 2, seed=k) for k in range(most)]
    table, draft_s = [], []
    joined = 0
    for count in requests:
        while joined < count:
            target.join(joined, contexts[joined][:CONTEXT])
            if drafts is not None:
                context = contexts[joined][:CONTEXT]
                drafts.join(joined, context, _features(adapter, drafts, context))
            joined += 1
        row = []
        for width in widths:
            best = float("inf")
            for _ in range(repeats):
                trees = {}
                for k in range(count):
                    tree = TokenTree.from_root(contexts[k][CONTEXT - 1])
                    for d in range(width - 1):
                        tree.add(d, contexts[k][d])
                    trees[k] = tree
                t0 = clock(adapter.device)
                logits, _, width_at = target.verify_forward(trees)
                screen_rows([(logits[k], 0) for k in trees])
                best = min(best, clock(adapter.device) - t0)
                target.keep({k: [] for k in trees}, width_at)
            row.append(best)
        table.append(tuple(row))
        draft_s.append(_time_draft(drafts, count, contexts, repeats) if drafts is not None else 0.0)
    return BatchCost(tuple(requests), tuple(widths), tuple(table), tuple(draft_s))


def _features(adapter: ModelAdapter, drafts, ids: list[int]):
    return adapter.features_along(ids[:-1]) if drafts.uses_target_features else None


def _time_draft(drafts, count: int, contexts, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        committed = {k: contexts[k][:CONTEXT] for k in range(count)}
        drafts.begin(committed)
        trees = {}
        for k in range(count):
            tree = TokenTree.from_root(contexts[k][CONTEXT - 1])
            tree.add(0, contexts[k][0])
            trees[k] = tree
        t0 = clock()
        drafts.expand([(k, trees[k], [1]) for k in range(count)])
        best = min(best, clock() - t0)
        drafts.commit([(k, trees[k], []) for k in range(count)], {})
    return best


EXPLORE = 16  # steps of one kind (drafting or not) after which a step of the other kind is timed
DECAY = 0.8  # weight of the past in the drafting history's running means


class DraftingHistory:
    """Whether a batch's steps should draft, from what its steps measured: the running tokens per
    second of steps that drafted and of steps that did not (each step's committed tokens over its
    whole time: drafting, the forward, verification, compaction, bookkeeping). A step drafts when
    drafting steps have been the faster; after `EXPLORE` steps of one kind, the other kind is timed
    again, so the choice follows a batch whose size or text changes. The first step of a run of
    drafting steps is not timed: its draft forward catches the head up on every token committed
    while it did not draft, a cost of switching, not of drafting; a run that explores drafting
    lasts two steps, so that one of them is timed. Also the running
    seconds the draft side adds beyond its timed forwards (its `begin`, the builders' own work),
    which the shared budget counts as paid once a step drafts."""

    def __init__(self, cost: BatchCost) -> None:
        self.overhead = cost.draft(1)
        self.rate: dict[bool, float | None] = {True: None, False: None}  # tokens/s by kind
        self.run: tuple[bool, int] = (True, 0)  # the kind of the last steps, how many in a row

    def worth(self) -> bool:
        kind, count = self.run
        if kind and count == 1:  # a drafting run's first step catches up, its second is timed
            return True
        for k in (True, False):  # each kind timed at least once
            if self.rate[k] is None:
                return k
        if count >= EXPLORE:
            return not kind
        return self.rate[True] > self.rate[False]

    def record(self, overhead: float) -> None:
        """A drafting step's draft-side seconds beyond its timed forwards."""
        self.overhead = DECAY * self.overhead + (1 - DECAY) * max(0.0, overhead)

    def timed(self, tokens: int, seconds: float, drafted: bool) -> None:
        kind, count = self.run
        self.run = (drafted, count + 1 if kind == drafted else 1)
        if drafted and self.run[1] == 1:
            return  # the head's catch-up (class doc)
        rate = tokens / max(seconds, 1e-9)
        old = self.rate[drafted]
        self.rate[drafted] = rate if old is None else DECAY * old + (1 - DECAY) * rate


_MEASURED: dict[tuple, BatchCost] = {}


def batch_cost_for(adapter: ModelAdapter, drafter) -> BatchCost:
    """The batch cost of this target and drafter, measured on first use in this process (with a
    batch drafter of its own)."""
    key = (id(adapter.model), id(drafter), str(adapter.device), str(adapter.dtype))
    if key not in _MEASURED:
        drafts = None
        if drafter is not None:
            drafts = drafter.batched() or PerRequestDrafts(drafter)
        _MEASURED[key] = measure_batch_cost(adapter, drafts)
    return _MEASURED[key]
