"""The OpenAI-compatible HTTP API on a `Service` (serve/service.py), as a FastAPI app.

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET /metrics`
(Prometheus text), `GET /health` (200 once the models are loaded and warmed up; 503 while loading
or shutting down). With an API key every route but `/health` needs `Authorization: Bearer <key>`
(compared in constant time); `/health` without the key says only its status, with it (or with no
key set) also the model, its settings and a load error. Streaming answers are server-sent events
in OpenAI's chunk format, sent as tokens commit, ending with `data: [DONE]`. Every error is an
OpenAI-shaped JSON body with its status (serve/api_errors.py) and one log line; an unexpected one
answers 500 with a generic message, its details in the log only. The server keeps serving.
Requests are counted by route template (`/v1/models/{model:path}`), every unknown path as
`unmatched`, so clients cannot grow the metrics.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..common.provenance import __version__
from .api_errors import APIError, bad_request
from .protocol import ChatRequest, CompletionRequest, parse
from .service import Prepared, Service

log = logging.getLogger("arborspec.serve")

DISCONNECT_POLL_S = 0.2  # how often a non-streamed request checks that its client is still there
UNMATCHED = "unmatched"  # the metrics' route label of a path no route matches


def route_label(request: Request) -> str:
    """The route template that matched `request` (never the raw path), else UNMATCHED."""
    return getattr(request.scope.get("route"), "path", None) or UNMATCHED


def create_app(service: Service) -> FastAPI:
    """The API on `service` (loading and the engine's lifetime are the host's job)."""
    app = FastAPI(
        title="arborspec", version=__version__, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.service = service

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        log.warning("%s %s -> %d %s", request.method, request.url.path, error.status, error.message)
        service.metrics.requests.labels(route_label(request), str(error.status)).inc()
        return JSONResponse(error.body(), error.status, headers=error.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        body = APIError(
            error.status_code,
            f"{request.method} {request.url.path}: {error.detail}",
            "invalid_request_error",
            kind,
        )
        return await api_error(request, body)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        log.error("unexpected error on %s", request.url.path, exc_info=error)
        message = "internal error: the server's log has the details"
        return await api_error(request, APIError(500, message, "server_error", "internal_error"))

    def authorized(request: Request) -> bool:
        key = service.config.api_key
        if not key:
            return True
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), key.encode()
        )

    def authorize(request: Request) -> None:
        if not authorized(request):
            raise APIError(
                401,
                "a valid API key is needed: send 'Authorization: Bearer <key>'",
                "authentication_error",
                "invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def admit(request: Request) -> None:
        authorize(request)
        if service.draining:
            raise APIError(
                503, "the server is shutting down", "server_error", "server_shutting_down"
            )
        if not service.ready:
            raise APIError(
                503,
                "the models are still loading: retry when /health says ready",
                "server_error",
                "model_loading",
                headers={"Retry-After": "5"},
            )

    async def read_json(request: Request) -> Any:
        limit = service.config.max_body_bytes
        declared = request.headers.get("content-length")
        too_big = APIError(
            413,
            f"the request body is larger than {limit} bytes",
            "invalid_request_error",
            "request_too_large",
        )
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_big
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise too_big
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as error:
            raise bad_request(f"the request body is not valid JSON: {error}") from None
        except RecursionError:
            raise bad_request(
                "the request body is nested too deeply: send a flat JSON object"
            ) from None

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        detailed = authorized(request)  # without the key: the status alone
        if service.load_error:
            failed = {"status": "failed"}
            if detailed:
                failed["error"] = service.load_error
            return JSONResponse(failed, 503)
        if service.draining:
            return JSONResponse({"status": "draining"}, 503)
        if not service.ready:
            return JSONResponse({"status": "loading"}, 503)
        if not detailed:
            return JSONResponse({"status": "ready"})
        ready = {"status": "ready", "model": service.model_name, **service.describe()}
        return JSONResponse(ready, headers=service.headers())

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        authorize(request)
        data = [
            {"id": service.model_name, "object": "model", "created": 0, "owned_by": "arborspec"}
        ]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/v1/models/{model:path}")
    async def model(model: str, request: Request) -> JSONResponse:
        authorize(request)
        if model != service.model_name:
            raise APIError(
                404,
                f"the model '{model}' does not exist here",
                "invalid_request_error",
                "model_not_found",
                "model",
            )
        return JSONResponse({"id": model, "object": "model", "created": 0, "owned_by": "arborspec"})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        authorize(request)
        return Response(service.metrics.render(), media_type=service.metrics.CONTENT_TYPE)

    async def complete(request: Request, cls) -> Response:
        admit(request)
        body = parse(cls, await read_json(request))
        prepared = await service.prepare_async(body)  # chat template and tokens off the loop
        ticket = service.submit(prepared)
        route = route_label(request)
        if prepared.stream:
            events = _events(service, prepared, ticket, route)
            return EventSourceResponse(events, ping=15, sep="\n", headers=service.headers())
        pieces = service.text(prepared, ticket)
        collect = asyncio.ensure_future(_join(pieces))
        try:
            while True:
                done, _ = await asyncio.wait({collect}, timeout=DISCONNECT_POLL_S)
                if done:
                    break
                if await request.is_disconnected():
                    collect.cancel()
                    await asyncio.gather(collect, return_exceptions=True)
                    await pieces.aclose()
                    log.info("client of %s went away: request cancelled", prepared.id)
                    return Response(status_code=499)
            text = collect.result()
        finally:
            if not collect.done():
                collect.cancel()
        service.metrics.requests.labels(route, "200").inc()
        return JSONResponse(_response(service, prepared, ticket, text), headers=service.headers())

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await complete(request, ChatRequest)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await complete(request, CompletionRequest)

    return app


async def _join(pieces) -> str:
    return "".join([piece async for piece in pieces])


def _usage(prepared: Prepared, ticket) -> dict:
    n = len(ticket.result.output_ids)
    return {
        "prompt_tokens": prepared.prompt_tokens,
        "completion_tokens": n,
        "total_tokens": prepared.prompt_tokens + n,
    }


def _envelope(service: Service, prepared: Prepared, kind: str, choices: list) -> dict:
    return {
        "id": prepared.id,
        "object": kind,
        "created": prepared.created,
        "model": service.model_name,
        "system_fingerprint": f"arborspec-{__version__}",
        "choices": choices,
    }


def _response(service: Service, prepared: Prepared, ticket, text: str) -> dict:
    finish = prepared.finish_reason
    if prepared.chat:
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    kind = "chat.completion" if prepared.chat else "text_completion"
    body = _envelope(service, prepared, kind, [choice])
    body["usage"] = _usage(prepared, ticket)
    body["arborspec"] = service.statistics(prepared, ticket)
    return body


def _chunk(
    service: Service, prepared: Prepared, delta: dict | str | None, finish: str | None = None
) -> dict:
    if prepared.chat:
        content = {"delta": delta if delta is not None else {}}
        kind = "chat.completion.chunk"
    else:
        content = {"text": delta or ""}
        kind = "text_completion"
    choice = {"index": 0, **content, "logprobs": None, "finish_reason": finish}
    return _envelope(service, prepared, kind, [choice])


async def _events(service: Service, prepared: Prepared, ticket, route: str):
    """The server-sent events of a streamed answer; a client that goes away ends the generator,
    whose `finally` (in `Service.text`) cancels the request."""
    pieces = service.text(prepared, ticket)
    status = "200"
    try:
        if prepared.chat:
            yield {
                "data": json.dumps(_chunk(service, prepared, {"role": "assistant", "content": ""}))
            }
        async for piece in pieces:
            content = {"content": piece} if prepared.chat else piece
            yield {"data": json.dumps(_chunk(service, prepared, content))}
        final = _chunk(service, prepared, None, prepared.finish_reason)
        final["arborspec"] = service.statistics(prepared, ticket)
        yield {"data": json.dumps(final)}
        if prepared.include_usage:
            last = _chunk(service, prepared, None)
            last["choices"] = []
            last["usage"] = _usage(prepared, ticket)
            last["arborspec"] = service.statistics(prepared, ticket)
            yield {"data": json.dumps(last)}
        yield {"data": "[DONE]"}
    except APIError as error:  # the answer has started: the error goes in the stream
        status = str(error.status)
        log.warning("%s %s failed mid-stream: %s", route, prepared.id, error.message)
        yield {"data": json.dumps(error.body())}
    finally:
        await pieces.aclose()
        service.metrics.requests.labels(route, status).inc()
