"""A batch drafter made of one drafter per request (`Drafter.spawn`): for drafter kinds without a
batched forward of their own (a draft model, the n-gram drafter). Every call runs each request's
drafter in turn; the trees and what they cost are those of single-request decoding."""

from __future__ import annotations

import torch

from ..common.timing import clock
from .contracts import BatchDrafter, Drafter


class PerRequestDrafts(BatchDrafter):
    def __init__(self, drafter: Drafter) -> None:
        self.template = drafter
        self.vocab_size = drafter.vocab_size
        self.uses_target_features = drafter.uses_target_features
        self.drafters: dict = {}

    def join(self, key, prompt_ids: list[int], features: torch.Tensor | None) -> None:
        drafter = self.template.spawn()
        drafter.reset()
        if self.uses_target_features and features is not None:
            drafter.observe(features)
        self.drafters[key] = drafter

    def leave(self, key) -> None:
        self.drafters.pop(key, None)

    def begin(self, committed: dict) -> dict:
        self.forward_time, self.forwards = 0.0, 0
        t0 = clock()
        out = {key: self.drafters[key].begin(tokens) for key, tokens in committed.items()}
        self._tick(t0)
        return out

    def expand(self, items: list[tuple]) -> list[torch.Tensor]:
        t0 = clock()
        out = [self.drafters[key].expand(tree, nodes) for key, tree, nodes in items]
        self._tick(t0)
        return out

    def commit(self, items: list[tuple], features: dict) -> None:
        for key, tree, accepted in items:
            drafter = self.drafters[key]
            if self.uses_target_features and features.get(key) is not None:
                drafter.observe(features[key])
            drafter.commit(tree, accepted)

    def _tick(self, t0: float) -> None:
        self.forward_time += clock() - t0
        self.forwards += 1
