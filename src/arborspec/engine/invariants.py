"""The KV-cache invariant of a running generation, checked after every step (the tests, the soak,
the long-run tool in `benchmarks/tools/long_runs.py`).

The target's cache holds every committed token but the last, the next root (`decode.py`,
docs/algorithms.md §1 and §4), on every layer; the drafter's holds no more than the committed
tokens. Compaction must keep both true after thousands of steps.
"""

from __future__ import annotations

from .decode import SpeculativeDecoder


class CacheCheck:
    """An `on_tokens` callback for `SpeculativeDecoder.generate`: after every step, checks both
    caches and counts the step (`steps`); raises AssertionError naming the step when the
    invariant is broken."""

    def __init__(self, decoder: SpeculativeDecoder, prompt_len: int) -> None:
        self.decoder, self.committed, self.steps = decoder, prompt_len, 0

    def __call__(self, new: list[int]) -> None:
        self.committed += len(new)
        self.steps += 1
        target, drafter = self.decoder.target, self.decoder.drafter
        want = self.committed - 1
        layers = sorted({layer.keys.shape[2] for layer in target.cache.layers})
        if target.cache_len != want or layers != [want]:
            raise AssertionError(
                f"step {self.steps}: target cache {target.cache_len} (layers {layers}) "
                f"!= committed - 1 = {want}"
            )
        if drafter.cache_len > self.committed:
            raise AssertionError(
                f"step {self.steps}: draft cache {drafter.cache_len} > committed {self.committed}"
            )
