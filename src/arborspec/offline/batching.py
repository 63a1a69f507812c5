"""Batches of similar-length sequences for the offline tools (generation and training batches).

A padded batch costs as much as its longest row times its rows, so the tools group sequences of
similar length: sort by length, cut into batches, then shuffle the order of the batches, so that
training (or a time-limited data run) does not see the short ones first. Batches are lists of
indices into the caller's list. Each function draws only from the `rng` it is given: a seeded
`random.Random` gives the same batches on every run, which is what lets a resumed training run
see the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

import random


def _by_length(lengths: list[int], rng: random.Random, random_ties: bool) -> list[int]:
    """Indices in order of length; ties keep their order, or with `random_ties` are ordered at
    random (one draw from `rng` per index, in index order)."""
    if random_ties:
        keys = [(n, rng.random()) for n in lengths]
        return sorted(range(len(lengths)), key=keys.__getitem__)
    return sorted(range(len(lengths)), key=lengths.__getitem__)


def length_batches(
    lengths: list[int], size: int, rng: random.Random, random_ties: bool = False
) -> list[list[int]]:
    """Batches of `size` indices (the last may be smaller) of similar `lengths`, shuffled."""
    order = _by_length(lengths, rng, random_ties)
    batches = [order[i : i + size] for i in range(0, len(order), size)]
    rng.shuffle(batches)
    return batches


def token_batches(lengths: list[int], max_tokens: int, rng: random.Random) -> list[list[int]]:
    """Batches of indices of similar `lengths`, as many per batch as keep the padded size (rows x
    longest row) within `max_tokens` (a longer sequence gets a batch of its own), shuffled."""
    batches, current = [], []
    for i in _by_length(lengths, rng, random_ties=False):
        if current and lengths[i] * (len(current) + 1) > max_tokens:  # sorted: i is the longest
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches
