"""What the server does behind its routes, whoever hosts it: the loaded pair, the engine loop, and
turning a checked request body into a generation whose text arrives as its tokens commit.

`Service` is independent of the web framework: `serve/app.py` puts the OpenAI routes on it, and
any host that runs that app (uvicorn in `serve/server.py`) gets the same behaviour.

Lifecycle: `load()` loads the pair (unless one was given), builds the batch decoder, warms it up
(the measured costs the shared budget and `budget=auto` need, the first forwards of speculative and
plain rows) and starts the engine thread; only then is the service `ready`. `drain()` refuses new
requests (503) while those in flight finish; `cancel_all()` ends the rest; `close()` stops the
engine thread.

Threads: the event loop speaks HTTP and streams text; `prepare_async` checks a request (its chat
template and tokenising included) on a thread of its own, one request at a time, so a long prompt
never holds up the other requests' streams; the engine thread steps the decoder. Each of the three
has its own copy of the tokenizer (a fast tokenizer is not shared across threads).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..api import SpeculativeGenerator
from ..builders import make_builder
from ..builders.dyspec import DySpecBuilder
from ..builders.registry import parse_budget
from ..builders.shared_budget import SharedBudget
from ..catalog import EMBEDDED_TARGET
from ..common.chat import encode_messages, eos_ids
from ..engine.batch_decode import BatchDecoder, BatchRequest
from ..engine.decode import DecodeConfig
from ..engine.sampling import sampling_config
from ..errors import ArborError
from .api_errors import APIError, bad_request
from .engine_loop import EngineLoop, QueueFull, Ticket
from .metrics import ServerMetrics
from .protocol import ChatRequest, CompletionRequest
from .text import StopCheck, TextStream

log = logging.getLogger("arborspec.serve")

WARMUP_PROMPT = "Say hello."
WARMUP_TOKENS = 8
MAX_BUILDERS = 32  # builders kept for the methods and budgets requests name, least recent dropped


@dataclass
class ServeConfig:
    """Everything `arborspec serve` takes. Models as for `arborspec generate`; then the limits.

    `max_batch`: requests decoded together; `max_queue`: requests waiting beyond them (429 past
    that); `max_rows`: rows of one target forward; `max_tokens`: the most a request may ask for;
    `default_max_tokens`: what a request that does not say gets (cut to the context);
    `max_prompt_tokens`: the longest prompt (None: the model's context); `max_body_bytes`: the
    largest request body (413 past it); `shutdown_timeout`: seconds in-flight requests get to
    finish after SIGTERM / Ctrl-C before they are cancelled; `shared_budget`: grow the DySpec trees
    of the requests that keep the server's method and budget from one heap sized by the measured
    batch costs (builders/shared_budget.py), each request's tree capped at `shared_max_nodes`
    (None: on a CPU target whose method is DySpec, off on a GPU; `shared_in_use` says which)."""

    target: str = EMBEDDED_TARGET
    draft: str | None = None
    method: str | None = None
    budget: int | str | None = None
    lookup: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    dtype: str = "auto"
    draft_logits: str = "auto"
    compile: bool = False
    model_name: str | None = None
    api_key: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 16
    max_queue: int = 64
    max_rows: int = 256
    max_tokens: int = 4096
    default_max_tokens: int = 256
    max_prompt_tokens: int | None = None
    max_body_bytes: int = 1 << 20
    shutdown_timeout: float = 30.0
    shared_budget: bool | None = None
    shared_max_nodes: int = 8
    warmup: bool = True

    def check(self) -> None:
        for name in ("max_batch", "max_rows", "max_tokens", "default_max_tokens", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ArborError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}"
                )
        if self.max_queue < 0 or self.shutdown_timeout < 0:
            raise ArborError("--max-queue and --shutdown-timeout must be >= 0")
        if not 0 <= self.port < 65536:
            raise ArborError(f"--port must be 0-65535, got {self.port}")
        if self.default_max_tokens > self.max_tokens:
            raise ArborError("--default-max-tokens must not exceed --max-tokens")


@dataclass
class Prepared:
    """A request checked and ready for the engine."""

    handle: Any  # engine RequestHandle
    stops: tuple[str, ...]
    prompt_tokens: int
    stream: bool
    include_usage: bool
    chat: bool
    created: int = field(default_factory=lambda: int(time.time()))
    id: str = ""
    finish_reason: str | None = None  # set once the text is complete


class Service:
    """The server's state and its one way of running a request (module docstring)."""

    def __init__(self, config: ServeConfig, generator: SpeculativeGenerator | None = None) -> None:
        config.check()
        self.config = config
        self.generator = generator
        self.engine: EngineLoop | None = None
        self.ready = False
        self.draining = False
        self.load_error: str | None = None
        self.model_name = config.model_name or (
            "arborspec-embedded" if config.target == EMBEDDED_TARGET else config.target
        )
        self.answering = 0  # generation requests being answered (HTTP side)
        self.metrics = ServerMetrics(
            running=lambda: self.engine.running if self.engine else 0,
            waiting=lambda: self.engine.waiting if self.engine else 0,
            active=lambda: self.answering,
        )
        # the builders of the methods and budgets requests name, at most MAX_BUILDERS
        self._builders: OrderedDict[tuple, Any] = OrderedDict()
        self._preparer = ThreadPoolExecutor(1, thread_name_prefix="arborspec-prepare")
        self.shared_in_use = False  # a shared budget grows the default requests' trees (`_load`)
        self.replica: str | None = (
            None  # the replica's id when hosted as one of several (ray_app.py)
        )
        self.on_finished: Callable[[Any], None] | None = None  # a host's hook per finished request

    # ------------------------------------------------------------------ lifecycle
    def load(self) -> None:
        """Load, warm up, start the engine; `ready` after. Errors go to `load_error`."""
        try:
            self._load()
        except Exception as error:  # reported by /health and by the command that started us
            if isinstance(error, ArborError):
                self.load_error = str(error)
                log.error("loading failed: %s", error)
            else:  # the details go to the log only
                self.load_error = "loading the models failed: see the server's log"
                log.exception("loading failed")
            raise

    def load_in_background(self) -> threading.Thread:
        def run() -> None:
            try:
                self.load()
            except Exception:
                pass  # kept in load_error

        thread = threading.Thread(target=run, name="arborspec-load", daemon=True)
        thread.start()
        return thread

    def _load(self) -> None:
        c = self.config
        if self.generator is None:
            self.generator = SpeculativeGenerator(
                target=c.target,
                draft=c.draft,
                method=c.method,
                device=c.device,
                dtype=c.dtype,
                budget=c.budget,
                draft_logits=c.draft_logits,
                compile=c.compile,
                lookup=c.lookup,
                **c.params,
            )
        gen = self.generator
        if gen.tokenizer is None:
            raise ArborError("the server needs the target's tokenizer")
        self.tokenizer = gen.tokenizer  # the event loop's: streamed text
        self.prompt_tokenizer = copy.deepcopy(gen.tokenizer)  # prompts, on the preparing thread
        self.engine_tokenizer = copy.deepcopy(gen.tokenizer)  # stop checks on the engine thread
        self.eos = eos_ids(gen.tokenizer, gen.pair.target.model)
        pair = gen.pair
        limits = [pair.target.max_positions]
        if pair.drafter is not None:
            limits.append(pair.drafter.max_positions)
        self.context = min(limits)

        dyspec = isinstance(gen.builder, DySpecBuilder)
        if c.shared_budget and not dyspec:
            raise ArborError(
                f"--shared-budget grows DySpec trees, and this server's method is "
                f"{gen.builder.name}: use --method dyspec or --per-request-budget"
            )
        self.shared_in_use = dyspec and (
            c.shared_budget if c.shared_budget is not None else pair.target.device.type == "cpu"
        )

        def make_decoder() -> BatchDecoder:
            shared = None
            if self.shared_in_use:  # the server's own requests; one naming a budget keeps it
                shared = SharedBudget(max_nodes=c.shared_max_nodes, only=gen.builder)
            return BatchDecoder(
                pair.target,
                pair.drafter,
                max_rows=c.max_rows,
                max_requests=c.max_batch,
                shared=shared,
            )

        self.engine = EngineLoop(make_decoder, c.max_queue)
        if c.warmup:
            self._warm_up()
        self.engine.start()
        self.ready = True
        log.info("ready: %s", gen.describe())

    def _warm_up(self) -> None:
        """First forwards of a speculative and a plain request, together and alone, on the engine's
        decoder before its thread starts (this also measures the costs the builders need)."""
        decoder = self.engine.decoder
        for together in (True, False):
            handles = []
            for speculative in (True, False):
                body = ChatRequest(
                    model=self.model_name,
                    temperature=0,
                    max_tokens=WARMUP_TOKENS,
                    speculative=speculative,
                    messages=[{"role": "user", "content": WARMUP_PROMPT}],
                )
                handles.append(decoder.submit(self._batch_request(body, self._chat_ids(body))[0]))
                if not together:
                    decoder.run()
            decoder.run()

    def drain(self) -> None:
        """Refuse new requests from now on (503); those in flight go on."""
        self.draining = True

    def cancel_all(self) -> None:
        if self.engine is not None:
            self.engine.cancel_all()

    def close(self) -> None:
        if self.engine is not None and self.engine.thread.is_alive():
            self.engine.stop()
        self._preparer.shutdown(wait=False, cancel_futures=True)

    @property
    def in_flight(self) -> int:
        return self.engine.outstanding if self.engine is not None else 0

    def headers(self) -> dict[str, str]:
        """Response headers that say which replica answered (several replicas only)."""
        if not self.replica:
            return {}
        return {"x-arborspec-replica": self.replica, "x-arborspec-pid": str(os.getpid())}

    def describe(self) -> dict:
        gen = self.generator
        return {
            "target": gen.pair.target_name,
            "draft": gen.pair.draft_name,
            "precision": gen.pair.precision,
            "method": gen.builder.name,
            "budget": gen.builder.budget,
            "lookup": gen.settings.lookup,
            "shared_budget": self.shared_in_use,
            "context": self.context,
        }

    # ------------------------------------------------------------------ requests
    def _chat_ids(self, body: ChatRequest) -> list[int]:
        return encode_messages(self.prompt_tokenizer, body.conversation(), chat=True)

    def _completion_ids(self, body: CompletionRequest) -> list[int]:
        prompt = body.single_prompt()
        if isinstance(prompt, str):
            return self.prompt_tokenizer(prompt)["input_ids"]
        vocab = len(self.prompt_tokenizer)
        if any(not 0 <= t < vocab for t in prompt):
            raise bad_request(f"prompt token ids must be in 0..{vocab - 1}", "prompt")
        return list(prompt)

    def _builder(self, body, lookup: int) -> Any:
        """The request's tree builder: None for plain decoding, else the server's own or the one
        its `method` / `budget` ask for (the last MAX_BUILDERS of those kept). A budget must leave
        its tree, the root and `lookup` grafted tokens within a forward's `max_rows`."""
        if body.speculative is False:
            if body.method is not None or body.budget is not None or body.lookup:
                raise bad_request(
                    "method, budget and lookup need speculative decoding: drop "
                    "'speculative: false' or them",
                    "speculative",
                )
            return None
        gen = self.generator
        if body.method is None and body.budget is None:
            return gen.builder
        method = body.method or gen.builder.name
        try:
            budget = parse_budget(body.budget) if body.budget is not None else gen.settings.budget
        except ArborError as error:
            raise bad_request(str(error), "budget") from None
        largest = self.config.max_rows - 1 - lookup
        if isinstance(budget, int) and not 1 <= budget <= largest:
            raise bad_request(
                f"budget must be between 1 and {largest} on this server (its --max-rows "
                f"{self.config.max_rows} holds the tree, the root and {lookup} lookup tokens), "
                f"got {budget}",
                "budget",
            )
        key = (method, budget)
        builder = self._builders.get(key)
        if builder is None:
            try:
                builder = make_builder(method, budget=budget)
            except ArborError as error:
                raise bad_request(str(error), "method" if body.method else "budget") from None
            self._builders[key] = builder
            while len(self._builders) > MAX_BUILDERS:
                self._builders.popitem(last=False)
        else:
            self._builders.move_to_end(key)
        return builder

    def _batch_request(self, body, ids: list[int]) -> tuple[BatchRequest, tuple[str, ...]]:
        c = self.config
        stops = body.stops()
        if len(ids) > (c.max_prompt_tokens or self.context) or len(ids) >= self.context:
            raise bad_request(
                f"the prompt has {len(ids)} tokens, more than this model's context of "
                f"{min(self.context, c.max_prompt_tokens or self.context)} allows",
                "messages" if isinstance(body, ChatRequest) else "prompt",
                "context_length_exceeded",
            )
        asked = body.requested_tokens()
        param = (
            "max_completion_tokens"
            if getattr(body, "max_completion_tokens", None)
            else "max_tokens"
        )
        if asked is not None and not 1 <= asked <= c.max_tokens:
            raise bad_request(f"{param} must be between 1 and {c.max_tokens}, got {asked}", param)
        lookup = body.lookup if body.lookup is not None else self.generator.settings.lookup
        builder = self._builder(body, lookup)
        if builder is None:
            lookup = 0
        depth = (max(builder.depth_limit, lookup) + 1) if builder is not None else 0
        room = self.context - len(ids) - depth
        if asked is None:
            asked = min(c.default_max_tokens, room)
            if asked < 1:
                raise bad_request(
                    f"the prompt ({len(ids)} tokens) leaves no room to generate in this model's "
                    f"context of {self.context}",
                    "messages",
                    "context_length_exceeded",
                )
        temperature = 1.0 if body.temperature is None else body.temperature
        try:
            cfg = DecodeConfig(
                max_new_tokens=asked,
                sampling=sampling_config(
                    temperature > 0,
                    temperature,
                    body.top_k or 0,
                    1.0 if body.top_p is None else body.top_p,
                ),
                seed=body.seed if body.seed is not None else secrets.randbits(63),
                eos_token_ids=self.eos,
                stopping=StopCheck(self.engine_tokenizer, stops, len(ids)) if stops else None,
            )
        except ArborError as error:
            raise bad_request(str(error)) from None
        return BatchRequest(ids, cfg, builder, lookup), stops

    def prepare(self, body: ChatRequest | CompletionRequest) -> Prepared:
        """Check a parsed body against the model and the limits (400s), and make its handle."""
        if body.model != self.model_name:
            raise APIError(
                404,
                f"the model '{body.model}' does not exist here: this server "
                f"serves '{self.model_name}' (GET /v1/models)",
                "invalid_request_error",
                "model_not_found",
                "model",
            )
        chat = isinstance(body, ChatRequest)
        ids = self._chat_ids(body) if chat else self._completion_ids(body)
        request, stops = self._batch_request(body, ids)
        try:
            handle = self.engine.handle_for(request)
        except ArborError as error:
            code = "context_length_exceeded" if "context" in str(error) else None
            raise bad_request(str(error), None, code) from None
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        prefix = "chatcmpl-" if chat else "cmpl-"
        return Prepared(
            handle,
            stops,
            len(ids),
            bool(body.stream),
            include_usage,
            chat,
            id=prefix + secrets.token_hex(12),
        )

    async def prepare_async(self, body: ChatRequest | CompletionRequest) -> Prepared:
        """`prepare` on the preparing thread (module docstring), awaited from the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._preparer, self.prepare, body)

    def submit(self, prepared: Prepared) -> Ticket:
        """Hand a prepared request to the engine; 429 when the batch and the queue are full."""
        try:
            return self.engine.submit(prepared.handle)
        except QueueFull:
            raise APIError(
                429,
                f"the server is at capacity ({self.engine.capacity} requests "
                "decoding or waiting): retry shortly",
                "rate_limit_error",
                "rate_limit_exceeded",
                headers={"Retry-After": "1"},
            ) from None

    async def text(self, prepared: Prepared, ticket: Ticket) -> AsyncIterator[str]:
        """The completion's text as it commits (serve/text.py); the request is cancelled if the
        consumer stops early (a client that went away). After the last piece, `ticket.result`
        holds the result; a request that failed raises its APIError here."""
        stream = TextStream(self.tokenizer, prepared.stops)
        self.answering += 1
        ended = False
        try:
            while True:
                tokens = await ticket.events.get()
                if tokens is None:
                    ended = True
                    break
                piece = stream.push(tokens)
                if piece:
                    yield piece
                if stream.stopped:  # a stop string the engine's check did not see (rare)
                    self.engine.cancel(ticket)
            result = ticket.result
            if result.stop_reason == "error":  # the details go to the log only
                error = ticket.handle.error
                log.error("request %s failed", prepared.id, exc_info=error)
                raise APIError(
                    500,
                    f"the request {prepared.id} failed in the engine: see the server's log",
                    "server_error",
                    "internal_error",
                )
            if result.stop_reason == "cancelled" and not stream.stopped:
                raise APIError(
                    503,
                    "the server is shutting down: the request was cancelled",
                    "server_error",
                    "server_shutting_down",
                )
            tail = stream.finish()
            prepared.finish_reason = (
                "length" if result.stop_reason == "length" and not stream.stopped else "stop"
            )
            if tail:
                yield tail
            handle = ticket.handle
            ttft = (handle.first_token_at - handle.submitted_at) if handle.first_token_at else None
            self.metrics.finished(result, prepared.prompt_tokens, ttft, result.wall_time)
            if self.on_finished is not None:
                self.on_finished(result)
        finally:
            if not ended:
                self.engine.cancel(ticket)
            self.answering -= 1
            self.engine.released(ticket)

    def statistics(self, prepared: Prepared, ticket: Ticket) -> dict:
        """The `arborspec` object of a response: how the request was decoded."""
        result, handle = ticket.result, ticket.handle
        steps = result.steps
        n = max(len(steps), 1)
        builder = handle.request.builder
        return {
            "speculative": builder is not None,
            "method": builder.name if builder is not None else "plain",
            "budget": builder.budget if builder is not None else 0,
            "lookup": handle.request.lookup,
            "verifier": handle.verifier,
            "steps": len(steps),
            "accepted_length": round(sum(s.accepted_length for s in steps) / n, 4),
            "tree_size": round(sum(s.tree_size for s in steps) / n, 4),
            "lookup_accepted": sum(s.lookup_accepted for s in steps),
            "queue_seconds": round(
                (handle.started_at or handle.finished_at) - handle.submitted_at, 6
            ),
            "time_to_first_token_seconds": round(handle.first_token_at - handle.submitted_at, 6)
            if handle.first_token_at
            else None,
            "seconds": round(result.wall_time, 6),
            "stop_reason": result.stop_reason,
            "seed": handle.request.config.seed,
            **({"replica": self.replica} if self.replica else {}),
        }
