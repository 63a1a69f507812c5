"""One clock for every measurement in arborspec: wall seconds once the device's
queued work is done."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def clock(device: torch.device | str | None = None) -> float:
    """`time.perf_counter()` after waiting for `device` (CUDA kernels run asynchronously;
    CPU needs no wait)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def median_seconds(
    fn: Callable[[], object],
    repeats: int,
    device: torch.device | str | None = None,
    warmup: int = 0,
) -> float:
    """Median wall time of `fn()` over `repeats` timed calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = clock(device)
        fn()
        times.append(clock(device) - t0)
    return statistics.median(times)
