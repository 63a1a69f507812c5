"""`arborspec serve`: the OpenAI-compatible server (serve/)."""

from __future__ import annotations

import logging

import typer

from ..errors import ArborError
from .base import app, err, friendly
from .options import ModelOptions, grouped

LIMITS = "Limits"


def _limit(default, flag: str, help: str):
    return typer.Option(default, flag, rich_help_panel=LIMITS, help=help)


def _ray(default, flag: str, help: str):
    return typer.Option(default, flag, rich_help_panel="Replicas (Ray Serve)", help=help)


@app.command()
@friendly
@grouped("models", ModelOptions)
def serve(
    method: str | None = typer.Option(
        None,
        "--method",
        "-m",
        help="tree builder of requests that do not name one (default: dyspec)",
    ),
    budget: str | None = typer.Option(
        None,
        "--budget",
        "-b",
        help="tree size of requests that do not give one (default: 3 on CPU, 32 on a GPU)",
    ),
    param: list[str] = typer.Option([], "--param", "-p", help="builder parameter name=value"),
    lookup: int | None = typer.Option(
        None, "--lookup", help="context-lookup tokens per tree (default 6; 0: off)"
    ),
    shared_budget: bool | None = typer.Option(
        None,
        "--shared-budget/--per-request-budget",
        help="grow the DySpec trees of the whole batch from one heap sized by the measured batch "
        "costs, or each request's tree to its own budget (default: shared on a CPU)",
    ),
    shared_max_nodes: int = typer.Option(
        8, "--shared-max-nodes", help="with a shared budget: the largest tree of one request"
    ),
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="address to bind (0.0.0.0: every interface; then set an API key)",
    ),
    port: int = typer.Option(8000, "--port"),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="ARBORSPEC_API_KEY",
        help="require 'Authorization: Bearer KEY' on every route but /health",
    ),
    model_name: str | None = typer.Option(
        None,
        "--model-name",
        help="the model id clients send (default: arborspec-embedded, or --target)",
    ),
    max_batch: int = _limit(16, "--max-batch", "requests decoded together"),
    max_queue: int = _limit(64, "--max-queue", "requests waiting beyond the batch (then 429)"),
    max_rows: int = _limit(256, "--max-rows", "rows of one target forward"),
    max_tokens: int = _limit(4096, "--max-tokens", "the most new tokens a request may ask for"),
    default_max_tokens: int = _limit(
        256, "--default-max-tokens", "new tokens of a request that does not say"
    ),
    max_prompt_tokens: int | None = _limit(
        None, "--max-prompt-tokens", "the longest prompt (default: the model's context)"
    ),
    max_body_bytes: int = _limit(
        1 << 20, "--max-body-bytes", "the largest request body (then 413)"
    ),
    shutdown_timeout: float = _limit(
        30.0,
        "--shutdown-timeout",
        "seconds requests in flight get to finish after SIGTERM / Ctrl-C",
    ),
    replicas: int = _ray(
        1,
        "--replicas",
        "replicas on Ray Serve, each with its own model pair (1: this process, no Ray)",
    ),
    address: str | None = _ray(
        None, "--address", "an existing Ray cluster (default: start a local one); implies Ray Serve"
    ),
    replica_cpus: float = _ray(1.0, "--replica-cpus", "CPUs each replica reserves"),
    replica_gpus: float = _ray(0.0, "--replica-gpus", "GPUs each replica reserves"),
    max_ongoing_requests: int | None = _ray(
        None,
        "--max-ongoing-requests",
        "requests Ray sends one replica at once (default: --max-batch + --max-queue)",
    ),
    min_replicas: int = _ray(1, "--min-replicas", "with --max-replicas: autoscale from here"),
    max_replicas: int | None = _ray(
        None, "--max-replicas", "autoscale up to this many replicas with the load"
    ),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning, error"),
    models: ModelOptions = ModelOptions(),
) -> None:
    """Serve the OpenAI API (chat and completions, streamed or not) with speculative decoding of
    every request in one batch; /health says when the models are loaded and warmed up."""
    from ..builders import parse_budget, parse_params
    from ..serve import ServeConfig
    from ..serve import serve as run_server

    if log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ArborError(f"--log-level must be debug, info, warning or error, got {log_level!r}")
    models.check_placement()
    if models.device_map or models.max_memory:
        raise ArborError("serve does not take --device-map / --max-memory: use --device")
    config = ServeConfig(
        target=models.target,
        draft=models.draft,
        method=method,
        budget=parse_budget(budget),
        lookup=lookup,
        params=parse_params(param),
        device=models.device,
        dtype=models.dtype,
        draft_logits=models.draft_logits,
        compile=models.compile,
        model_name=model_name,
        api_key=api_key or None,
        host=host,
        port=port,
        max_batch=max_batch,
        max_queue=max_queue,
        max_rows=max_rows,
        max_tokens=max_tokens,
        default_max_tokens=default_max_tokens,
        max_prompt_tokens=max_prompt_tokens,
        max_body_bytes=max_body_bytes,
        shutdown_timeout=shutdown_timeout,
        shared_budget=shared_budget,
        shared_max_nodes=shared_max_nodes,
    )
    config.check()
    if host not in ("127.0.0.1", "localhost", "::1") and not config.api_key:
        err.print(f"warning: serving on {host} without an API key", style="yellow")
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if replicas == 1 and address is None and max_replicas is None:
        run_server(config, log_level=log_level.lower())
        return
    try:
        from ..serve.ray_app import ReplicaOptions, run_replicas
    except ImportError:
        raise ArborError(
            "replicas run on Ray Serve, which is not installed: pip install 'arborspec[ray]'"
        ) from None
    options = ReplicaOptions(
        replicas=replicas,
        num_cpus=replica_cpus,
        num_gpus=replica_gpus,
        max_ongoing_requests=max_ongoing_requests,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
    )
    options.check()
    run_replicas(config, options, address)
