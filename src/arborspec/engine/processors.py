"""Logits processors of one request, applied to every tree node on that node's own path.

A processor in the sense of `transformers`' `LogitsProcessor` maps `(input_ids [1, L], scores
[1, V]) -> scores`: a repetition penalty, banned n-grams, a minimum length, bad words, and the
warpers (temperature, top-k, top-p, ...). Plain decoding applies it once per token to the
sequence so far. In a tree, node i's row predicts the token after *its* path, so the processor
runs on that row with `input_ids = committed + path(i)` (docs/algorithms.md §2, "Processors"):
the distribution the verifier checks against is then exactly the processed distribution plain
decoding would use at that point, whichever path is accepted. The draft side gets the same
treatment (`DraftContext`), which only moves its proposals toward what the target will accept.

The rows handed to the verifiers are processed on first access (`ProcessedRows`); the greedy
screen's shortcut (`engine/lm_head.GreedyScreen`) never applies, because a processed row's
argmax is not the raw row's: `argmax` reads the full processed row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# (input_ids [1, L], scores [1, V]) -> scores [1, V]: transformers' `LogitsProcessorList` is one
Processor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class PathProcessor:
    """A request's processor bound to the committed tokens: `__call__(path, row)` processes one
    `[V]` row that predicts the token after `committed + path`."""

    def __init__(self, processor: Processor, committed: Sequence[int], device) -> None:
        self.processor, self.device = processor, device
        self.prefix = torch.tensor([list(committed)], dtype=torch.long, device=device)

    def ids(self, path: Sequence[int]) -> torch.Tensor:  # [1, L]
        if not path:
            return self.prefix
        tail = torch.tensor([list(path)], dtype=torch.long, device=self.device)
        return torch.cat([self.prefix, tail], dim=1)

    def __call__(self, path: Sequence[int], row: torch.Tensor) -> torch.Tensor:  # [V]
        scores = row.float().reshape(1, -1).clone()  # a processor may write in place
        return self.processor(self.ids(path), scores.to(self.device))[0].to(row.device)


class ProcessedRows:
    """`[N, V]` logits of a tree forward (or of a plain one, N = 1) whose row i is processed with
    node i's path: `rows[i]` -> processed `[V]`, `argmax(i)` -> its greedy token. Wraps a
    `LazyLogits` or a tensor; rows are computed and processed on first access and kept."""

    def __init__(self, logits, paths: Callable[[int], Sequence[int]], process: PathProcessor):
        self.logits, self.paths, self.process = logits, paths, process
        self.rows: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.logits)

    @property
    def seconds(self) -> float:
        """Time the wrapped rows took to compute (the step statistics count it as verification)."""
        return getattr(self.logits, "seconds", 0.0)

    def __getitem__(self, i: int) -> torch.Tensor:
        i = int(i) % len(self)
        if i not in self.rows:
            self.rows[i] = self.process(self.paths(i), self.logits[i])
        return self.rows[i]

    def argmax(self, i: int) -> int:
        """Row i's greedy token: the processed row's argmax (`torch.argmax`'s rule, as
        `generate`)."""
        return int(self[i].argmax())


def draft_row(process: PathProcessor | None, path: Sequence[int], row: torch.Tensor):
    """A draft row processed like the target's; the raw row where processing leaves nothing
    finite (a draft whose reduced vocabulary holds only banned tokens): the draft side may
    propose anything, its distribution only has to be the one its tokens were drawn from."""
    if process is None:
        return row
    out = process(path, row)
    return out if bool(torch.isfinite(out).any()) else row
