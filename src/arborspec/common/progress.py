"""The one progress bar of the long-running tools (calibration, C2T training,
distillation, the benchmark).

Bars go to stderr. When stderr is not a terminal (a log file) rich still prints
the bar now and then, as plain lines. Every task carries an `info` field for a
short status text (`bar.update(task, info="12.3 tok/s")`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

T = TypeVar("T")


def progress_bar(enabled: bool = True) -> Progress:
    """A rich `Progress` (use it as a context manager); `enabled=False` shows nothing."""
    console = (
        Console(stderr=True)
        if sys.stderr.isatty()
        else Console(file=sys.stderr, force_terminal=False, width=160)
    )
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        disable=not enabled,
    )


def progress_enumerate(
    items: Iterable[T], label: str, enabled: bool = True
) -> Iterator[tuple[int, T]]:
    """`enumerate(items)` with a progress bar."""
    items = list(items)
    with progress_bar(enabled) as bar:
        task = bar.add_task(label, total=len(items), info="")
        for i, item in enumerate(items):
            yield i, item
            bar.advance(task)
