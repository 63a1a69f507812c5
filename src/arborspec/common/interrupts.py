"""Ctrl-C deferred to a safe point: the first one asks a loop to stop after its current step, a
second one aborts at once.

A training loop interrupted in the middle of an optimizer step would leave weights and optimizer
state that belong to no step. Inside `DeferredInterrupt` the first SIGINT only sets `requested`;
the loop checks it between steps, saves what it has and stops. A second SIGINT raises
`KeyboardInterrupt` where the program is, for a user who does not want to wait.
"""

from __future__ import annotations

import signal
import sys
import threading

NOTICE = "interrupt received: stopping after this step (Ctrl-C again to abort)"


class DeferredInterrupt:
    """Context manager: while active, the first SIGINT sets `requested` (and prints `notice` to
    stderr), the second raises `KeyboardInterrupt`. Outside the main thread, where Python cannot
    install signal handlers, it changes nothing and `requested` stays False."""

    def __init__(self, notice: str = NOTICE) -> None:
        self.notice = notice
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.notice:
            print(f"\n{self.notice}", file=sys.stderr, flush=True)

    def __enter__(self) -> DeferredInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
