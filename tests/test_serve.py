"""`arborspec serve` (serve/): a real server on 127.0.0.1 (a free port) with a tiny int8 pair, talked to with the
`openai` client and raw HTTP: at temperature 0 chat and completions, streamed or not, give plain decoding's text; stop
sequences cut exactly; bad input gets its status and an OpenAI-shaped error while the next request succeeds; the API
key; a client that disconnects mid-stream frees its request; 32 concurrent requests each equal their plain greedy
output; a request that fails in the engine fails alone; /health says ready only after loading; SIGTERM drains and
exits 0."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass

import openai
import pytest
import uvicorn
from arborspec import SpeculativeGenerator
from arborspec.builders.dyspec import DySpecBuilder
from arborspec.builders.registry import BUILDERS
from arborspec.common.chat import eos_ids
from arborspec.common.ports import free_port
from arborspec.engine.decode import DecodeConfig, autoregressive_generate
from arborspec.engine.sampling import SamplingConfig
from arborspec.errors import ArborError
from arborspec.models import load_pair, load_tokenizer
from arborspec.serve import ServeConfig, Service, create_app
from arborspec.serve.text import TextStream

from conftest import char_tokenizer, perturbed_copy, tiny_llama, wait_until

MODEL = "tiny"
PROMPTS = [f"Prompt {i}: tell me about {'abcdefgh'[i % 8] * (1 + i % 3)} and {i * 7}." for i in range(32)]
NEW = 16
LONG = "Prompt 0: a long answer"  # greedy: no EOS within 1500 tokens (test_a_long_prompt_never_ends_early)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-serve")
    target = tiny_llama(0, max_pos=4096)
    target.lm_head.weight.data[2] = 0  # EOS's logit is 0, below the greedy maximum: long answers never end early
    draft = perturbed_copy(target, 1, 0.3)
    tok = char_tokenizer()
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root


def generator(tiny_dirs) -> SpeculativeGenerator:
    pair = load_pair(str(tiny_dirs / "target"), str(tiny_dirs / "draft"), "cpu", "int8")
    return SpeculativeGenerator(pair=pair, method="dyspec", budget=4, lookup=2)


def plain(gen, ids: list[int], n: int = NEW) -> tuple[str, list[int]]:
    """Plain greedy decoding of the same int8 target: the text and tokens every answer must equal."""
    cfg = DecodeConfig(max_new_tokens=n, sampling=SamplingConfig(0.0), eos_token_ids=eos_ids(gen.tokenizer))
    out = autoregressive_generate(gen.pair.target, ids, cfg).output_ids
    return gen.tokenizer.decode(out, skip_special_tokens=True), out


@dataclass
class Server:
    service: Service
    port: int
    uvicorn: uvicorn.Server
    thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def client(self, key: str = "none", **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=60, **kw)

    def raw(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        reply = conn.getresponse()
        data = reply.read()
        conn.close()
        return reply.status, (json.loads(data) if data.startswith(b"{") else data.decode()), dict(reply.getheaders())

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(timeout=30)
        self.service.close()


def start(service: Service, load: bool = True) -> Server:
    """The app on uvicorn in a thread, on a free port of 127.0.0.1 (the models loaded first unless `load` is
    False)."""
    if load:
        service.load()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), "the server thread ended before it started serving"
        return server.started

    wait_until(started, 30, "the server to start")
    return Server(service, port, server, thread)


@pytest.fixture(scope="module")
def served(tiny_dirs):
    gen = generator(tiny_dirs)
    refs = [plain(gen, gen.tokenizer(p)["input_ids"]) for p in PROMPTS]
    config = ServeConfig(target=str(tiny_dirs / "target"), model_name=MODEL, max_batch=8, max_queue=32,
                         default_max_tokens=NEW)
    server = start(Service(config, gen))
    yield server, refs
    server.stop()


def chat(client, prompt: str, max_tokens: int = NEW, **kw):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                          temperature=0, max_tokens=max_tokens, **kw)


def streamed(stream) -> tuple[str, str | None, list]:
    text, finish, chunks = "", None, []
    for chunk in stream:
        chunks.append(chunk)
        for choice in chunk.choices:
            piece = choice.delta.content if hasattr(choice, "delta") else choice.text
            text += piece or ""
            finish = choice.finish_reason or finish
    return text, finish, chunks


def finish_of(tokens: list[int]) -> str:
    return "stop" if tokens and tokens[-1] == 2 else "length"


# ------------------------------------------------------------------------------------------------ answers
def test_chat_and_completions_streamed_or_not_equal_plain_decoding(served):
    server, refs = served
    client = server.client()
    for i in (0, 5):
        text, tokens = refs[i]
        reply = chat(client, PROMPTS[i])
        assert reply.choices[0].message.content == text
        assert reply.choices[0].finish_reason == finish_of(tokens)
        assert reply.usage.completion_tokens == len(tokens)
        assert reply.usage.prompt_tokens == len(PROMPTS[i])
        stats = reply.model_extra["arborspec"]
        assert stats["speculative"] and stats["method"] == "dyspec" and stats["steps"] >= 1
        assert stats["steps"] * stats["accepted_length"] == pytest.approx(len(tokens), abs=0.01)
        got, finish, chunks = streamed(chat(client, PROMPTS[i], stream=True, stream_options={"include_usage": True}))
        assert (got, finish) == (text, finish_of(tokens))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(tokens)
        done = client.completions.create(model=MODEL, prompt=PROMPTS[i], temperature=0, max_tokens=NEW)
        assert done.choices[0].text == text and done.object == "text_completion"
        got, finish, _ = streamed(client.completions.create(model=MODEL, prompt=PROMPTS[i], temperature=0,
                                                           max_tokens=NEW, stream=True))
        assert (got, finish) == (text, finish_of(tokens))
    # per-request settings: plain rows, another builder, token ids as the prompt
    off = chat(client, PROMPTS[1], extra_body={"speculative": False})
    assert off.choices[0].message.content == refs[1][0] and not off.model_extra["arborspec"]["speculative"]
    other = chat(client, PROMPTS[2], extra_body={"method": "opt-tree", "budget": 3, "lookup": 0})
    assert other.choices[0].message.content == refs[2][0]
    assert other.model_extra["arborspec"]["method"] == "opt-tree"
    ids = server.service.tokenizer(PROMPTS[3])["input_ids"]
    by_ids = client.completions.create(model=MODEL, prompt=ids, temperature=0, max_tokens=NEW)
    assert by_ids.choices[0].text == refs[3][0]
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_stop_sequences_cut_exactly(served):
    server, refs = served
    client = server.client()
    text, tokens = refs[4]
    for stop in ([text[5:7]], [text[9], text[3:5]], text[2:6]):
        stops = [stop] if isinstance(stop, str) else stop
        want = text[: min(text.find(s) for s in stops)]
        reply = chat(client, PROMPTS[4], stop=stop)
        assert reply.choices[0].message.content == want and reply.choices[0].finish_reason == "stop"
        assert reply.usage.completion_tokens < len(tokens)  # the engine stopped where the text did
        got, finish, _ = streamed(chat(client, PROMPTS[4], stop=stop, stream=True))
        assert (got, finish) == (want, "stop")
    absent = chat(client, PROMPTS[4], stop=["\x7f\x7f"])  # never generated: the whole text
    assert absent.choices[0].message.content == text


def test_text_stream_never_splits_a_character_or_a_stop_string():
    """Byte-level BPE (the embedded tokenizer): multi-byte characters span several tokens; pushed one token at a
    time, no piece holds half a character, the pieces add up to the text, and stop strings cut it exactly."""
    tok = load_tokenizer("embedded")
    text = "Grüße aus Köln — naïve café, 東京タワー and 🌍🚀 emoji. Ünïcödé ends here."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text and len(ids) < len(text.encode())

    def run(stops):
        stream, pieces = TextStream(tok, stops), []
        for t in ids:
            pieces.append(stream.push([t]))
        pieces.append(stream.finish())
        assert not any("\ufffd" in p for p in pieces)
        return "".join(pieces), stream.stopped

    assert run(()) == (text, False)
    assert sum(1 for t in ids if TextStream(tok).push([t]) == "") > 0  # some tokens are part of a character
    for stop in ("京タ", "🚀", "café", "é,", "here.", "Ü"):
        assert run((stop,)) == (text[: text.find(stop)], True), stop
    assert run(("zzz", "naï", "Köln")) == (text[: text.find("Köln")], True)


# ------------------------------------------------------------------------------------------------ errors
GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
BAD = [
    (b"{not json", 400, None),
    (json.dumps({"model": MODEL}).encode(), 400, "messages"),
    (json.dumps({**GOOD, "messages": "hello"}).encode(), 400, "messages"),
    (json.dumps({**GOOD, "temperature": "hot"}).encode(), 400, "temperature"),
    (json.dumps({**GOOD, "max_tokens": -3}).encode(), 400, "max_tokens"),
    (json.dumps({**GOOD, "max_tokens": 10**9}).encode(), 400, "max_tokens"),
    (json.dumps({**GOOD, "frequency_penalty": 0.7}).encode(), 400, "frequency_penalty"),
    (json.dumps({**GOOD, "logprobs": True}).encode(), 400, "logprobs"),
    (json.dumps({**GOOD, "n": 2}).encode(), 400, "n"),
    (json.dumps({**GOOD, "tools": [{"type": "function"}]}).encode(), 400, "tools"),
    (json.dumps({**GOOD, "bogus_field": 1}).encode(), 400, "bogus_field"),
    (json.dumps({**GOOD, "method": "no-such-method"}).encode(), 400, "method"),
    (json.dumps({**GOOD, "messages": [{"role": "user", "content": "x" * 4200}]}).encode(), 400, "messages"),
    (json.dumps({**GOOD, "model": "gpt-4o"}).encode(), 404, "model"),
    (json.dumps([1, 2]).encode(), 400, None),
]


def test_bad_input_gets_its_status_and_an_openai_error_and_the_server_keeps_serving(served):
    server, _ = served
    for body, status, param in BAD:
        got, reply, _ = server.raw("POST", "/v1/chat/completions", body)
        assert got == status, (body[:60], reply)
        error = reply["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], reply
        assert error["param"] == param, (body[:60], reply)
        ok, answer, _ = server.raw("POST", "/v1/chat/completions", json.dumps(GOOD).encode())
        assert ok == 200 and answer["choices"][0]["message"]["content"] is not None
    codes = {}
    for body, status, _ in BAD:
        codes[server.raw("POST", "/v1/chat/completions", body)[1]["error"]["code"]] = status
    assert codes["context_length_exceeded"] == 400 and codes["model_not_found"] == 404
    # neutral values of fields the server does not implement are accepted
    neutral = {**GOOD, "frequency_penalty": 0, "presence_penalty": 0.0, "logprobs": False, "n": 1, "user": "u",
               "logit_bias": {}, "stream": False, "response_format": {"type": "text"}}
    assert server.raw("POST", "/v1/chat/completions", json.dumps(neutral).encode())[0] == 200
    assert server.raw("GET", "/v1/nowhere")[0] == 404
    two = json.dumps({"model": MODEL, "prompt": ["a", "b"]}).encode()
    status, reply, _ = server.raw("POST", "/v1/completions", two)
    assert status == 400 and reply["error"]["param"] == "prompt"
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        chat(server.client(), "x", extra_body={"max_completion_tokens": 3})  # two different limits


def test_a_long_prompt_never_ends_early(served):
    """The long requests below rely on it: its greedy answer has no EOS within 1500 tokens."""
    server, _ = served
    gen = server.service.generator
    assert 2 not in plain(gen, gen.tokenizer(LONG)["input_ids"], 1500)[1]


def test_api_key_body_size_and_queue_limits(tiny_dirs):
    config = ServeConfig(target=str(tiny_dirs / "target"), model_name=MODEL, api_key="s3cret", max_batch=1,
                         max_queue=0, max_body_bytes=4000, warmup=False)
    server = start(Service(config, generator(tiny_dirs)))
    try:
        assert server.raw("GET", "/health")[0] == 200  # no key needed
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            status, reply, _ = server.raw("POST", "/v1/chat/completions", json.dumps(GOOD).encode(), headers)
            assert status == 401 and reply["error"]["code"] == "invalid_api_key"
        assert server.raw("GET", "/metrics")[0] == 401 and server.raw("GET", "/v1/models")[0] == 401
        with pytest.raises(openai.AuthenticationError):
            chat(server.client("wrong"), "hi")
        client = server.client("s3cret")
        assert chat(client, "hi").choices[0].message.content is not None
        big = json.dumps({**GOOD, "user": "u" * 5000}).encode()
        status, reply, _ = server.raw("POST", "/v1/chat/completions", big, {"Authorization": "Bearer s3cret"})
        assert status == 413 and reply["error"]["code"] == "request_too_large"
        # one request decoding, none may wait: a second one gets 429 with Retry-After while the first streams
        with chat(client, LONG, 400, stream=True) as stream:
            next(iter(stream))
            status, reply, headers = server.raw("POST", "/v1/chat/completions", json.dumps(GOOD).encode(),
                                                {"Authorization": "Bearer s3cret"})
            assert status == 429 and reply["error"]["type"] == "rate_limit_error" and headers["retry-after"] == "1"
        wait_until(lambda: server.service.in_flight == 0, 5, "the closed stream's request to leave")
        assert chat(client, "hi").choices[0].finish_reason in ("stop", "length")
    finally:
        server.stop()


def test_health_says_ready_only_after_loading(tiny_dirs):
    config = ServeConfig(target=str(tiny_dirs / "target"), model_name=MODEL)
    service = Service(config, generator(tiny_dirs))
    server = start(service, load=False)
    try:
        status, reply, _ = server.raw("GET", "/health")
        assert (status, reply["status"]) == (503, "loading")
        status, reply, headers = server.raw("POST", "/v1/chat/completions", json.dumps(GOOD).encode())
        assert status == 503 and reply["error"]["code"] == "model_loading"
        service.load()
        status, reply, _ = server.raw("GET", "/health")
        assert (status, reply["status"], reply["precision"]) == (200, "ready", "int8")
        assert reply["shared_budget"] is True  # the default on a CPU target
        assert server.raw("POST", "/v1/chat/completions", json.dumps(GOOD).encode())[0] == 200
    finally:
        server.stop()


def test_a_shared_budget_needs_dyspec_and_is_off_when_asked(tiny_dirs):
    pair = generator(tiny_dirs).pair
    config = ServeConfig(target=str(tiny_dirs / "target"), model_name=MODEL, shared_budget=True, warmup=False)
    service = Service(config, SpeculativeGenerator(pair=pair, method="specinfer", budget=3))
    with pytest.raises(ArborError, match="--shared-budget grows DySpec trees"):
        service.load()
    config = ServeConfig(target=str(tiny_dirs / "target"), model_name=MODEL, shared_budget=False, warmup=False)
    service = Service(config, SpeculativeGenerator(pair=pair, method="dyspec", budget=2))
    service.load()
    try:
        assert service.describe()["shared_budget"] is False and service.engine.decoder.shared is None
    finally:
        service.close()


# ------------------------------------------------------------------------------------------------ the batch
def metric(server: Server, name: str) -> float:
    text = server.raw("GET", "/metrics")[1]
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_a_client_that_disconnects_mid_stream_frees_its_request(served):
    server, _ = served
    client = server.client()
    stream = chat(client, LONG, 1500, stream=True)
    chunks = iter(stream)
    next(chunks), next(chunks)
    assert metric(server, "arborspec_active_requests") == 1
    stream.close()
    wait_until(lambda: metric(server, "arborspec_active_requests") == 0 and server.service.engine.running == 0,
               2.0, "the disconnected request to be freed")
    assert server.service.engine.decoder.idle and server.service.in_flight == 0
    assert metric(server, "arborspec_requests_total") > 0 and metric(server, "arborspec_accepted_length_count") > 0


def test_32_concurrent_requests_each_equal_their_plain_greedy_output(served):
    server, refs = served

    async def one(client, i):
        extra = [{}, {"speculative": False}, {"method": "specinfer", "budget": 3}, {"lookup": 0}][i % 4]
        if i % 3 == 0:
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": PROMPTS[i]}], temperature=0, max_tokens=NEW,
                stream=True, extra_body=extra)
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        reply = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": PROMPTS[i]}], temperature=0, max_tokens=NEW,
            extra_body=extra)
        return reply.choices[0].message.content

    async def run():
        async with openai.AsyncOpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=120) as client:
            return await asyncio.gather(*(one(client, i) for i in range(32)))

    assert asyncio.run(run()) == [text for text, _ in refs]
    assert server.service.in_flight == 0


class FailingBuilder(DySpecBuilder):
    name = "failing-test"

    def build(self, ctx, root):
        raise RuntimeError("injected failure")


def test_a_request_that_fails_in_the_engine_fails_alone(served):
    server, refs = served
    BUILDERS[FailingBuilder.name] = FailingBuilder
    try:
        async def run():
            async with openai.AsyncOpenAI(base_url=server.url, api_key="none", max_retries=0) as client:
                def ask(i, **kw):
                    return client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": PROMPTS[i]}], temperature=0,
                        max_tokens=NEW, **kw)
                return await asyncio.gather(ask(0), ask(1, extra_body={"method": "failing-test"}), ask(2),
                                            return_exceptions=True)

        good0, failed, good2 = asyncio.run(run())
        assert good0.choices[0].message.content == refs[0][0] and good2.choices[0].message.content == refs[2][0]
        assert isinstance(failed, openai.InternalServerError) and "failed in the engine" in str(failed)
        assert "injected failure" not in str(failed)  # the details go to the log only
    finally:
        del BUILDERS[FailingBuilder.name]
    with pytest.raises(openai.APIError, match="failed in the engine"):  # the stream carries the error
        BUILDERS[FailingBuilder.name] = FailingBuilder
        try:
            streamed(chat(server.client(), PROMPTS[3], stream=True, extra_body={"method": "failing-test"}))
        finally:
            del BUILDERS[FailingBuilder.name]
    assert chat(server.client(), PROMPTS[5]).choices[0].message.content == refs[5][0]


# ------------------------------------------------------------------------------------------------ the command
@pytest.mark.slow
def test_serve_command_drains_on_sigterm_and_exits_zero(tiny_dirs):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from arborspec.cli import app; app()", "serve", "--target", str(tiny_dirs / "target"),
         "--draft", str(tiny_dirs / "draft"), "--dtype", "int8", "--port", str(port), "--model-name", MODEL,
         "--log-level", "warning", "--shutdown-timeout", "120"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        server = Server(None, port, None, None)

        def health() -> str | None:
            assert proc.poll() is None, proc.stdout.read()
            try:
                return server.raw("GET", "/health")[1]["status"]
            except OSError:  # not listening yet
                return None

        wait_until(lambda: health() == "ready", 90, "/health to say ready")
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        stream = chat(client, LONG, 600, stream=True)
        chunks = iter(stream)
        next(chunks)
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: health() == "draining", 10, "/health to say draining after SIGTERM")
        status, reply, _ = server.raw("POST", "/v1/chat/completions", json.dumps(GOOD).encode())
        assert status == 503 and reply["error"]["code"] == "server_shutting_down"
        text, finish, _ = streamed(chunks)  # the request in flight finishes
        assert finish in ("length", "stop") and text
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------------------------ the load test
def test_load_test_counts_every_token_and_request(served, tmp_path):
    """`arborspec bench-serve` against a running server: every request answered, tokens = the answers' usage,
    speculative texts = plain's at T = 0, the figures recomputed from the records, and a resumed run adds
    nothing."""
    from arborspec.bench.report import read_results
    from arborspec.bench.serve_load import ServeLoadConfig, cell_figures, run_serve_load, summarize

    server, _ = served
    cfg = ServeLoadConfig(url=f"http://127.0.0.1:{server.port}", num_prompts=5, max_tokens=6,
                          concurrency=[1, 3], warmup=0, out_dir=tmp_path / "load")
    path = run_serve_load(cfg, quiet=True)
    header, records, _ = read_results(path)
    assert header["benchmark"] == "serve-load" and header["server"]["precision"] == "int8"
    assert sorted((r["concurrency"], r["mode"]) for r in records) == [
        (1, "plain"), (1, "speculative"), (3, "plain"), (3, "speculative")]
    for r in records:
        assert [a["index"] for a in r["answers"]] == list(range(5))
        assert all(a["error"] is None and a["tokens"] == 6 and a["sent"] <= a["first_text"] <= a["end"]
                   for a in r["answers"])
        f = cell_figures(r)
        assert f["tokens"] == 30 and f["tokens_per_s"] == pytest.approx(30 / r["wall_s"])
    rows = {(r["concurrency"], r["mode"]): r for r in summarize(records)}
    assert all(row["identical"] == 1.0 and row["errors"] == 0 for row in rows.values())
    assert rows[(3, "speculative")]["speedup"] == pytest.approx(
        rows[(3, "speculative")]["tokens_per_s"] / rows[(3, "plain")]["tokens_per_s"])
    assert "| 3 | `speculative` |" in (tmp_path / "load" / "report.md").read_text()
    run_serve_load(ServeLoadConfig(**{**cfg.__dict__, "resume": True}), quiet=True)
    assert len(read_results(path)[1]) == 4
