"""`arborspec serve` as a Ray Serve application: the same API on several replicas.

Each replica is a Ray actor holding its own `Service` (serve/service.py): its own model pair,
batch decoder and engine thread. Its HTTP routes are the app of serve/app.py, built on the replica
(`serve.ingress` without an app, `__serve_build_asgi_app__`), so validation, streaming, errors and
statistics are those of the single server. Ray Serve's proxy spreads requests over the replicas
(each answer's `arborspec.replica` says which one served it), restarts a replica whose process
dies or whose health check fails, and scales between `min_replicas` and `max_replicas` when they
are given. `GET /metrics` answers with the counters of the replica the request reached; the same
counters go to Ray's metrics (`ray.serve.metrics`, one series per replica, exported on Ray's
Prometheus port) when a replica finishes a request.

This module imports Ray; the rest of the package does not (`pip install "arborspec[ray]"`).
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass

import ray
from ray import serve
from ray.serve.metrics import Counter, Histogram

from ..errors import ArborError
from .app import create_app
from .metrics import ACCEPTED_BUCKETS
from .service import ServeConfig, Service

log = logging.getLogger("arborspec.serve")

APP_NAME = "arborspec"


@dataclass(frozen=True)
class ReplicaOptions:
    """How the application runs on Ray. `replicas`: the fixed number of replicas, unless
    `max_replicas` is given, then Ray Serve autoscales between `min_replicas` and `max_replicas`
    (aiming at `target_ongoing_requests` per replica). `num_cpus`, `num_gpus`: what each replica
    reserves on the cluster. `max_ongoing_requests`: requests Ray sends one replica at once (None:
    its batch and queue, `max_batch + max_queue`); beyond every replica's, Ray queues them."""

    replicas: int = 2
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    max_ongoing_requests: int | None = None
    min_replicas: int = 1
    max_replicas: int | None = None
    target_ongoing_requests: float = 4.0
    health_check_period_s: float = 5.0

    def check(self) -> None:
        if self.replicas < 1 or self.min_replicas < 1:
            raise ArborError("--replicas and --min-replicas must be >= 1")
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ArborError("--max-replicas must be >= --min-replicas")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ArborError("--replica-cpus and --replica-gpus must be >= 0")


class _RayCounters:
    """The server's per-request counters mirrored into Ray's metrics (tagged by replica)."""

    def __init__(self) -> None:
        self.tokens = Counter("arborspec_completion_tokens", "Tokens generated", tag_keys=("mode",))
        self.requests = Counter(
            "arborspec_requests_finished", "Requests answered", tag_keys=("mode",)
        )
        self.accepted = Histogram(
            "arborspec_accepted_length",
            "Tokens committed per speculative step",
            boundaries=list(ACCEPTED_BUCKETS),
        )

    def finished(self, result) -> None:
        mode = "speculative" if result.method != "autoregressive" else "plain"
        self.tokens.inc(len(result.output_ids), tags={"mode": mode})
        self.requests.inc(tags={"mode": mode})
        if mode == "speculative":
            for step in result.steps:
                self.accepted.observe(step.accepted_length)


@serve.ingress()
class ArborspecReplica:
    """One replica: its own service, loaded and warmed up before Ray routes requests to it."""

    def __init__(self, config: ServeConfig) -> None:
        self.service = Service(config)
        self.service.replica = serve.get_replica_context().replica_id.unique_id
        self.service.load()
        self.service.on_finished = _RayCounters().finished

    def __serve_build_asgi_app__(self):
        return create_app(self.service)

    def check_health(self) -> None:
        """Ray Serve replaces a replica whose check raises."""
        engine = self.service.engine
        if self.service.load_error or engine is None or not engine.thread.is_alive():
            raise RuntimeError(f"replica {self.service.replica} cannot decode")

    def __del__(self) -> None:
        service = getattr(self, "service", None)
        if service is not None:
            service.close()


def application(config: ServeConfig, options: ReplicaOptions) -> serve.Application:
    """The Ray Serve application: bind it and `serve.run` it, or use `run_replicas`."""
    config.check()
    options.check()
    ongoing = options.max_ongoing_requests or (config.max_batch + config.max_queue)
    scaling = {}
    if options.max_replicas is not None:
        scaling["autoscaling_config"] = {
            "min_replicas": options.min_replicas,
            "max_replicas": options.max_replicas,
            "target_ongoing_requests": options.target_ongoing_requests,
        }
    else:
        scaling["num_replicas"] = options.replicas
    deployment = serve.deployment(
        ArborspecReplica,
        name="ArborspecReplica",
        ray_actor_options={"num_cpus": options.num_cpus, "num_gpus": options.num_gpus},
        max_ongoing_requests=ongoing,
        health_check_period_s=options.health_check_period_s,
        graceful_shutdown_timeout_s=config.shutdown_timeout,
        **scaling,
    )
    return deployment.bind(config)


def start(config: ServeConfig, options: ReplicaOptions, address: str | None = None) -> None:
    """Connect to a Ray cluster (`address`; None: start a local one), start Serve's proxy on
    `config.host:config.port` and run the application; returns once every replica is ready."""
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": config.host, "port": config.port})
    serve.run(application(config, options), name=APP_NAME, route_prefix="/")


def stop() -> None:
    """Shut the application and Serve down (replicas finish their requests first, within the
    shutdown timeout), then disconnect from Ray (a local cluster this process started stops)."""
    try:
        serve.shutdown()
    finally:
        ray.shutdown()


def run_replicas(config: ServeConfig, options: ReplicaOptions, address: str | None = None) -> None:
    """`arborspec serve --replicas N`: start, then block until SIGTERM or Ctrl-C; then `stop()`."""
    done = threading.Event()
    previous = {s: signal.signal(s, lambda *_: done.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        start(config, options, address)
        log.info("serving on http://%s:%d with Ray Serve", config.host, config.port)
        done.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        stop()
