"""Server-wide counters in the Prometheus text format (`GET /metrics`), on prometheus_client.

Each server has its own registry (several servers in one process, as in the tests, never share
counters). Gauges of requests in the batch and waiting are read from the engine when scraped.
Requests are labelled by route template and status, never by the path a client sent
(serve/app.py), so the series stay few whatever the clients ask for."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

ACCEPTED_BUCKETS = (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 12, 16)
SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServerMetrics:
    CONTENT_TYPE = CONTENT_TYPE_LATEST

    def __init__(
        self,
        running: Callable[[], float],
        waiting: Callable[[], float],
        active: Callable[[], float],
    ) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "arborspec_requests",
            "Requests answered, by route template (or 'unmatched') and HTTP status",
            ["route", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter("arborspec_prompt_tokens", "Prompt tokens", registry=r)
        self.completion_tokens = Counter(
            "arborspec_completion_tokens", "Tokens generated", ["mode"], registry=r
        )
        self.steps = Counter("arborspec_steps", "Decoding steps of requests", ["mode"], registry=r)
        self.accepted_length = Histogram(
            "arborspec_accepted_length",
            "Tokens committed per step of a speculative request (the bonus token included)",
            buckets=ACCEPTED_BUCKETS,
            registry=r,
        )
        self.time_to_first_token = Histogram(
            "arborspec_time_to_first_token_seconds",
            "Submission to the first token",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.request_seconds = Histogram(
            "arborspec_request_seconds",
            "Submission to the end of a request",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        Gauge(
            "arborspec_active_requests", "Requests the server is answering", registry=r
        ).set_function(active)
        Gauge(
            "arborspec_running_requests", "Requests in the decoding batch", registry=r
        ).set_function(running)
        Gauge(
            "arborspec_queue_depth", "Requests waiting to join the batch", registry=r
        ).set_function(waiting)

    def finished(self, result, prompt_tokens: int, ttft: float | None, seconds: float) -> None:
        """A request's result (engine/stats.py) into the counters."""
        mode = "speculative" if result.method != "autoregressive" else "plain"
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.labels(mode).inc(len(result.output_ids))
        self.steps.labels(mode).inc(len(result.steps))
        if mode == "speculative":
            for step in result.steps:
                self.accepted_length.observe(step.accepted_length)
        if ttft is not None:
            self.time_to_first_token.observe(ttft)
        self.request_seconds.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
