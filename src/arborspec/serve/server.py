"""`arborspec serve`'s host: the app on uvicorn, with loading, readiness and a graceful stop.

The port opens at once; the models load and warm up in the background while `/health` answers
503 "loading" (and generation routes 503), then 200 "ready". On SIGTERM or Ctrl-C the server
stops taking requests (503), lets those in flight finish for up to `shutdown_timeout` seconds,
cancels the rest (their clients get an error), closes and returns normally (exit status 0). A
second signal stops at once.

uvicorn runs on a thread of its own (`uvicorn.Server.run`), where it installs no signal handlers;
the calling thread installs its own for SIGTERM and SIGINT, watches the drain and tells uvicorn to
stop through its `should_exit` and `force_exit` flags.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

import uvicorn

from ..errors import ArborError
from .app import create_app
from .service import ServeConfig, Service

log = logging.getLogger("arborspec.serve")

WATCH_S = 0.1  # how often the calling thread looks at the drain
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Stop:
    """The graceful stop (module docstring): the signal handlers, then `watch` on each tick."""

    def __init__(self, server: uvicorn.Server, service: Service) -> None:
        self.server, self.service = server, service
        self.deadline: float | None = None

    def signalled(self, sig: int, frame) -> None:
        if self.deadline is None and not self.server.should_exit:
            log.info(
                "signal %d: draining (up to %.0f s); a second signal stops now",
                sig,
                self.service.config.shutdown_timeout,
            )
            self.service.drain()
            self.deadline = time.monotonic() + self.service.config.shutdown_timeout
            return
        self.service.cancel_all()
        self.server.should_exit = True
        self.server.force_exit = True

    def watch(self) -> None:
        if self.service.load_error:
            self.server.should_exit = True
        elif self.deadline is not None and not self.server.should_exit:
            if self.service.in_flight == 0:
                self.server.should_exit = True
            elif time.monotonic() > self.deadline:
                log.info("shutdown timeout: cancelling %d requests", self.service.in_flight)
                self.service.cancel_all()
                self.deadline = float("inf")  # then wait for the cancelled ones to answer


def serve(config: ServeConfig, service: Service | None = None, log_level: str = "info") -> None:
    """Run the server until a signal (module docstring); raises ArborError if loading fails or the
    port cannot be served. Signals are handled when called on the main thread."""
    service = service or Service(config)
    app = create_app(service)
    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=log_level,
        timeout_graceful_shutdown=5,
        access_log=False,
        lifespan="off",
    )
    server = uvicorn.Server(uv_config)
    stop = _Stop(server, service)
    exits = []

    def run_http() -> None:
        try:
            server.run()
        except SystemExit as exit:  # uvicorn's own when it cannot start: said below
            exits.append(exit.code)

    http = threading.Thread(target=run_http, name="arborspec-http", daemon=True)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, stop.signalled) for sig in SIGNALS}
    try:
        service.load_in_background()
        http.start()
        while http.is_alive():
            http.join(WATCH_S)
            stop.watch()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        service.close()
    if service.load_error:
        raise ArborError(service.load_error)
    if exits or (not server.started and stop.deadline is None):
        raise ArborError(
            f"the server could not listen on {config.host}:{config.port} (the log line above "
            "says why): choose another --host or --port"
        )
