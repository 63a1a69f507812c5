"""The batch decoder on its own thread, fed from the server's event loop.

`EngineLoop` owns one `BatchDecoder` (engine/batch_decode.py) and runs its steps on a dedicated
thread, so the event loop that speaks HTTP never waits for a forward. The event loop checks a
request (`BatchDecoder.handle_for`, which raises `ArborError` for a prompt too long for the
context) and hands it over with `submit`; it gets a `Ticket`, whose asyncio queue receives each
step's new tokens and, last, `None` once the request ended (its `handle.result` then holds the
result and statistics). `cancel` ends a request at the next step boundary and frees its rows.

Requests join the running batch between steps. A failure in one request's own code ends that
request alone (stop reason "error"); a failure of a batched forward ends every request in flight
with that error, and the loop goes on with a fresh decoder.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable

from ..engine.batch_decode import BatchDecoder, BatchRequest, RequestHandle

log = logging.getLogger("arborspec.serve")


class QueueFull(Exception):
    """More requests than the batch and the waiting queue hold."""


class Ticket:
    """One request as the event loop sees it: its handle and the queue of its tokens."""

    def __init__(self, handle: RequestHandle, loop: asyncio.AbstractEventLoop) -> None:
        self.handle, self.loop = handle, loop
        self.events: asyncio.Queue[list[int] | None] = asyncio.Queue()

    def _post(self, item: list[int] | None) -> None:  # from the engine thread
        self.loop.call_soon_threadsafe(self.events.put_nowait, item)

    @property
    def result(self):
        return self.handle.result


class EngineLoop:
    """A `BatchDecoder` stepped on its own thread (module docstring).

    `make_decoder()` builds the decoder (again after a batched forward failed). At most
    `max_requests` requests decode together (the decoder's cap) and `max_queue` more wait; past
    that `submit` raises `QueueFull`."""

    def __init__(self, make_decoder: Callable[[], BatchDecoder], max_queue: int) -> None:
        self.make_decoder = make_decoder
        self.decoder = make_decoder()
        self.max_queue = max_queue
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.tickets: dict[int, Ticket] = {}  # engine thread: the requests it knows
        self.outstanding = 0  # submitted and not yet ended (event loop side)
        self.lock = threading.Lock()
        self.running = 0  # requests in the batch, as of the last step (for metrics)
        self.waiting = 0
        self.thread = threading.Thread(target=self._run, name="arborspec-engine", daemon=True)
        self._stop = False

    @property
    def capacity(self) -> int:
        return self.decoder.max_requests + self.max_queue

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Cancel whatever is left and end the thread."""
        self._stop = True
        self.inbox.put(("wake", None))
        self.thread.join(timeout=30)

    # ------------------------------------------------------------------ event-loop side
    def handle_for(self, request: BatchRequest) -> RequestHandle:
        """Check a request and make its handle (ArborError for one the engine cannot run)."""
        return self.decoder.handle_for(request)

    def submit(self, handle: RequestHandle) -> Ticket:
        with self.lock:
            if self.outstanding >= self.capacity:
                raise QueueFull
            self.outstanding += 1
        ticket = Ticket(handle, asyncio.get_running_loop())
        self.inbox.put(("submit", ticket))
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        self.inbox.put(("cancel", ticket))

    def cancel_all(self) -> None:
        self.inbox.put(("cancel_all", None))

    def released(self, ticket: Ticket) -> None:
        """The event loop is done with an ended request: its place is free."""
        with self.lock:
            self.outstanding -= 1

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        while True:
            idle = self.decoder.idle
            self._take_inbox(block=idle and not self._stop)
            if self._stop:
                for ticket in list(self.tickets.values()):
                    self._cancel(ticket)
                return
            if self.decoder.idle:
                continue
            try:
                ended = self.decoder.step()
            except Exception as error:  # a batched forward: every request in flight fails
                log.exception("a batched step failed; every request in flight ends with it")
                self._fail_all(error)
                continue
            self.running, self.waiting = len(self.decoder.active), len(self.decoder.queue)
            for handle in ended:
                self.tickets.pop(handle.key)._post(None)

    def _take_inbox(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, ticket = item
            if kind == "submit":
                self._submit(ticket)
            elif kind == "cancel":
                self._cancel(ticket)
            elif kind == "cancel_all":
                for other in list(self.tickets.values()):
                    self._cancel(other)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                break
        self.running, self.waiting = len(self.decoder.active), len(self.decoder.queue)

    def _submit(self, ticket: Ticket) -> None:
        handle = ticket.handle
        handle.request.on_tokens = ticket._post
        self.tickets[handle.key] = ticket
        self.decoder.enqueue(handle)

    def _cancel(self, ticket: Ticket) -> None:
        if self.tickets.pop(ticket.handle.key, None) is None:
            return  # ended already
        self.decoder.cancel(ticket.handle)
        ticket._post(None)

    def _fail_all(self, error: Exception) -> None:
        tickets = list(self.tickets.values())
        for ticket in tickets:
            handle = ticket.handle
            try:
                self.decoder.cancel(handle)
            except Exception:  # the decoder's state is broken: a fresh one replaces it below
                handle._finish("cancelled")
            handle.error = error
            handle.result.stop_reason = "error"
        self.tickets.clear()
        fresh = self.make_decoder()
        fresh._keys = self.decoder._keys  # handles checked on the old one keep unique keys
        self.decoder = fresh
        for ticket in tickets:
            ticket._post(None)
