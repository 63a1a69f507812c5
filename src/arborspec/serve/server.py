"""`arborspec serve`'s host: the app on uvicorn, with loading, readiness and a graceful stop.

The port opens at once; the models load and warm up in the background while `/health` answers
503 "loading" (and generation routes 503), then 200 "ready". On SIGTERM or Ctrl-C the server
stops taking requests (503), lets those in flight finish for up to `shutdown_timeout` seconds,
cancels the rest (their clients get an error), closes and returns normally (exit status 0). A
second signal stops at once.
"""

from __future__ import annotations

import logging
import time

import uvicorn

from ..errors import ArborError
from .app import create_app
from .service import ServeConfig, Service

log = logging.getLogger("arborspec.serve")


class _Uvicorn(uvicorn.Server):
    """uvicorn with the drain above in place of its immediate stop on the first signal."""

    def __init__(self, config: uvicorn.Config, service: Service) -> None:
        super().__init__(config)
        self.service = service
        self.deadline: float | None = None

    def handle_exit(self, sig: int, frame) -> None:  # a signal: never re-raised after the exit
        if self.deadline is None and not self.should_exit:
            log.info(
                "signal %d: draining (up to %.0f s); a second signal stops now",
                sig,
                self.service.config.shutdown_timeout,
            )
            self.service.drain()
            self.deadline = time.monotonic() + self.service.config.shutdown_timeout
            return
        self.service.cancel_all()
        self.should_exit = True
        self.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.service.load_error:
            self.should_exit = True
        elif self.deadline is not None:
            if self.service.in_flight == 0:
                self.should_exit = True
            elif time.monotonic() > self.deadline:
                log.info("shutdown timeout: cancelling %d requests", self.service.in_flight)
                self.service.cancel_all()
                self.deadline = float("inf")  # then wait for the cancelled ones to answer
        return await super().on_tick(counter)


def serve(config: ServeConfig, service: Service | None = None, log_level: str = "info") -> None:
    """Run the server until a signal (module docstring); raises ArborError if loading fails."""
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
    server = _Uvicorn(uv_config, service)
    service.load_in_background()
    try:
        server.run()
    finally:
        service.close()
    if service.load_error:
        raise ArborError(service.load_error)
