"""`arborspec serve` against what clients can do to it, on the tiny int8 pair of tests/test_serve.py: the metrics
keep one series per route template whatever paths are asked for; the builders kept for the budgets requests name
stay bounded; chat templating and tokenising run off the event loop; no response carries an internal error's
details, and a deeply nested body is a 400; /health without the API key says only its status; a message's `name`
reaches the chat template; a budget above the server's cap is refused naming the cap; the graceful stop on SIGTERM
in-process; the server's and the plots' packages are extras that `import arborspec` and `generate` never load."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

import openai
import pytest
from arborspec.common.ports import free_port
from arborspec.errors import ArborError
from arborspec.serve import ServeConfig, Service, serve
from arborspec.serve.protocol import ChatRequest
from arborspec.serve.service import MAX_BUILDERS

import test_serve
from conftest import wait_until
from test_serve import GOOD, LONG, MODEL, PROMPTS, Server, chat, generator, plain, start, streamed

tiny_dirs = test_serve.tiny_dirs  # the fixtures: the tiny pair's folders and a server on them
served = test_serve.served

EXTRA_MODULES = ("fastapi", "uvicorn", "sse_starlette", "starlette", "prometheus_client", "matplotlib")


def request_series(server: Server) -> dict[tuple[str, str], float]:
    """`arborspec_requests_total` by (route, status)."""
    text = server.raw("GET", "/metrics")[1]
    found = re.findall(r'^arborspec_requests_total\{route="([^"]*)",status="([^"]*)"\} (\S+)$', text, re.M)
    return {(route, status): float(value) for route, status, value in found}


# ------------------------------------------------------------------------------------------------ metrics
def test_requests_to_random_paths_add_no_metric_series(served):
    server, _ = served

    def ask(i: int, token: str) -> int:
        path = [f"/{token}", f"/v1/{token}/x", f"/v1/models/{token}", f"/v1/chat/completions/{token}"][i % 4]
        method = "POST" if i % 3 == 0 else "GET"
        return server.raw(method, path, json.dumps(GOOD).encode() if method == "POST" else None)[0]

    for i in range(12):  # each kind of path with each method once: the series they make
        ask(i, "first")
    assert server.raw("GET", "/v1/chat/completions")[0] == 405  # a route's path, not its method
    before = request_series(server)
    assert {("unmatched", "404"), ("/v1/models/{model:path}", "404"), ("/v1/models/{model:path}", "405"),
            ("/v1/chat/completions", "405")} <= set(before)
    asked = []
    for i in range(50):
        token = secrets.token_hex(6)
        assert ask(i, token) in (404, 405)
        asked.append(token)
    after = request_series(server)
    assert set(after) == set(before)  # no new series
    assert sum(after.values()) - sum(before.values()) == 50  # every request counted
    text = server.raw("GET", "/metrics")[1]
    assert not any(token in text for token in asked)


# ------------------------------------------------------------------------------------------------ builders
def test_a_hundred_budgets_keep_the_builders_bounded_and_outputs_right(served):
    server, _ = served
    service = server.service
    gen = service.generator
    n = 3
    refs = [plain(gen, gen.tokenizer(p)["input_ids"], n)[0] for p in PROMPTS[:8]]

    async def run():
        limit = asyncio.Semaphore(8)
        async with openai.AsyncOpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=120) as client:
            async def one(budget):
                async with limit:
                    reply = await client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": PROMPTS[budget % 8]}], temperature=0,
                        max_tokens=n, extra_body={"budget": budget, "lookup": 0})
                    return reply.choices[0].message.content, reply.model_extra["arborspec"]["budget"]
            return await asyncio.gather(*(one(b) for b in range(1, 101)))

    answers = asyncio.run(run())
    assert [text for text, _ in answers] == [refs[b % 8] for b in range(1, 101)]
    assert [budget for _, budget in answers] == list(range(1, 101))
    assert len(service._builders) == MAX_BUILDERS
    kept = {budget for _, budget in service._builders}
    assert kept <= set(range(1, 101))
    # the least recently used goes first: asking for a kept budget keeps it, the next new one evicts another
    oldest = next(iter(service._builders))
    builder = service._builders[oldest]
    again = chat(server.client(), PROMPTS[oldest[1] % 8], n, extra_body={"budget": oldest[1], "lookup": 0})
    assert again.choices[0].message.content == refs[oldest[1] % 8]
    assert next(reversed(service._builders)) == oldest and service._builders[oldest] is builder
    evicted = next(iter(service._builders))
    missing = next(b for b in range(1, 101) if ("dyspec", b) not in service._builders)
    chat(server.client(), PROMPTS[0], n, extra_body={"budget": missing, "lookup": 0})
    assert len(service._builders) == MAX_BUILDERS and evicted not in service._builders


# ------------------------------------------------------------------------------------------------ the event loop
def test_chat_templating_and_tokenising_run_off_the_event_loop(served, monkeypatch):
    server, refs = served
    service = server.service
    seen = []
    slow = threading.Event()

    def spy(real):
        def run(body):
            seen.append(threading.get_ident())
            if slow.is_set():
                time.sleep(1.5)
            return real(body)
        return run

    monkeypatch.setattr(service, "_chat_ids", spy(service._chat_ids))
    monkeypatch.setattr(service, "_completion_ids", spy(service._completion_ids))
    client = server.client()
    assert chat(client, PROMPTS[0]).choices[0].message.content == refs[0][0]
    done = client.completions.create(model=MODEL, prompt=PROMPTS[1], temperature=0, max_tokens=16)
    assert done.choices[0].text == refs[1][0]
    assert len(seen) == 2 and server.thread.ident not in seen  # the server's thread runs its event loop
    # a slow chat template holds up no other request: /health answers while it runs
    slow.set()
    waiting = threading.Thread(target=chat, args=(client, PROMPTS[2]))
    waiting.start()
    wait_until(lambda: len(seen) == 3, 10, "the slow request to reach its template")
    begin = time.monotonic()
    assert server.raw("GET", "/health")[0] == 200
    assert time.monotonic() - begin < 0.5
    waiting.join(30)


# ------------------------------------------------------------------------------------------------ errors
def test_an_internal_error_answers_a_generic_500_and_logs_the_details(served, monkeypatch, caplog):
    server, refs = served
    secret = "secret detail at /opt/internal/path"

    def broken(body):
        raise RuntimeError(secret)

    monkeypatch.setattr(server.service, "_chat_ids", broken)
    with caplog.at_level(logging.ERROR, logger="arborspec.serve"):
        status, reply, _ = server.raw("POST", "/v1/chat/completions", json.dumps(GOOD).encode())
    assert status == 500
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "internal_error"
    assert secret not in json.dumps(reply) and "RuntimeError" not in json.dumps(reply)
    assert "log" in error["message"]
    assert any(secret in (r.getMessage() + str(r.exc_info)) for r in caplog.records)
    monkeypatch.undo()
    assert chat(server.client(), PROMPTS[0]).choices[0].message.content == refs[0][0]


@pytest.mark.parametrize("body", [
    "[" * 10_000,
    "[" * 10_000 + "]" * 10_000,
    '{"model": "tiny", "messages": ' + "[" * 10_000 + "]" * 10_000 + "}",
    '{"a": ' * 10_000 + "1" + "}" * 10_000,
])
def test_a_deeply_nested_body_is_a_400(served, body):
    server, _ = served
    status, reply, _ = server.raw("POST", "/v1/chat/completions", body.encode())
    assert status == 400, reply
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert "nested too deeply" in error["message"] and "Recursion" not in error["message"]
    assert server.raw("POST", "/v1/chat/completions", json.dumps(GOOD).encode())[0] == 200


# ------------------------------------------------------------------------------------------------ /health
def test_health_without_the_key_says_only_the_status(tiny_dirs, tmp_path):
    key = {"Authorization": "Bearer s3cret"}
    config = ServeConfig(target=str(tiny_dirs / "target"), model_name=MODEL, api_key="s3cret", warmup=False)
    server = start(Service(config, generator(tiny_dirs)), load=False)
    try:
        assert server.raw("GET", "/health")[:2] == (503, {"status": "loading"})
        server.service.load()
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            assert server.raw("GET", "/health", headers=headers)[:2] == (200, {"status": "ready"})
        status, reply, _ = server.raw("GET", "/health", headers=key)
        assert status == 200 and reply["status"] == "ready" and reply["model"] == MODEL
        assert {"target", "draft", "method", "budget", "context"} <= set(reply) and reply["precision"] == "int8"
    finally:
        server.stop()
    # a load that failed: its error (which names a path) only with the key
    missing = tmp_path / "no-such-model"
    config = ServeConfig(target=str(missing), model_name=MODEL, api_key="s3cret", warmup=False)
    service = Service(config)
    server = start(service, load=False)
    try:
        with pytest.raises(ArborError):
            service.load()
        assert service.load_error and str(missing) in service.load_error
        assert server.raw("GET", "/health")[:2] == (503, {"status": "failed"})
        status, reply, _ = server.raw("GET", "/health", headers=key)
        assert status == 503 and reply["status"] == "failed" and str(missing) in reply["error"]
    finally:
        server.stop()


def test_health_without_a_configured_key_says_more(served):
    server, _ = served
    status, reply, _ = server.raw("GET", "/health")
    assert status == 200 and reply["status"] == "ready" and reply["model"] == MODEL and reply["method"] == "dyspec"


# ------------------------------------------------------------------------------------------------ messages
NAMED = "{% for m in messages %}{% if m.name %}<{{ m.name }}> {% endif %}{{ m.role }}: {{ m.content }} {% endfor %}"


def test_a_message_name_reaches_the_chat_template(served, monkeypatch):
    server, _ = served
    service = server.service
    monkeypatch.setattr(service.prompt_tokenizer, "chat_template", NAMED, raising=False)
    client = server.client()
    user = {"role": "user", "content": "Hi there"}

    def prompt_tokens(message: dict) -> int:
        reply = client.chat.completions.create(model=MODEL, messages=[message], temperature=0, max_tokens=2)
        return reply.usage.prompt_tokens

    assert prompt_tokens({**user, "name": "Alice"}) - prompt_tokens(user) == len("<Alice> ")
    body = ChatRequest(model=MODEL, messages=[{"role": "system", "content": "Be brief", "name": "rules"},
                                              {**user, "name": "Alice"}])
    text = service.prompt_tokenizer.decode(service._chat_ids(body))
    assert "<rules> system: Be brief" in text and "<Alice> user: Hi there" in text
    assert service.prompt_tokenizer.decode(service._chat_ids(ChatRequest(model=MODEL, messages=[user]))) \
        .startswith("user: Hi there")


# ------------------------------------------------------------------------------------------------ budgets
def test_a_budget_above_the_cap_is_refused_naming_the_cap(served):
    server, refs = served
    largest = server.service.config.max_rows - 1  # with lookup 0
    for budget, lookup in ((1_000_000, 0), (largest + 1, 0), (largest - 1, 2), (0, 0), (-5, 0)):
        body = json.dumps({**GOOD, "budget": budget, "lookup": lookup}).encode()
        status, reply, _ = server.raw("POST", "/v1/chat/completions", body)
        assert status == 400, (budget, reply)
        message = reply["error"]["message"]
        assert reply["error"]["param"] == "budget" and "\n" not in message
        assert f"between 1 and {largest - lookup}" in message and "tree depth" not in message
    with pytest.raises(openai.BadRequestError, match=f"between 1 and {largest - 2}"):
        chat(server.client(), "hi", extra_body={"budget": 1_000_000})  # the server's lookup (2)
    at_cap = chat(server.client(), PROMPTS[0], 1, extra_body={"budget": largest, "lookup": 0})
    assert at_cap.choices[0].message.content == refs[0][0][:1]


# ------------------------------------------------------------------------------------------------ the stop
def test_serve_drains_on_sigterm_in_process_and_restores_the_handlers(tiny_dirs):
    """`serve` on the main thread with its own signal handlers: SIGTERM drains (503 to new requests, the stream in
    flight finishes), `serve` returns normally and the previous handlers are back."""
    assert threading.current_thread() is threading.main_thread()
    port = free_port()
    config = ServeConfig(target=str(tiny_dirs / "target"), model_name=MODEL, port=port, shutdown_timeout=60,
                         warmup=False)
    service = Service(config, generator(tiny_dirs))
    server = Server(service, port, None, None)
    before = signal.getsignal(signal.SIGTERM)
    seen = {}

    def client_side():
        try:
            wait_until(lambda: _health(server) == "ready", 60, "/health to say ready")
            stream = chat(server.client(), LONG, 300, stream=True)
            chunks = iter(stream)
            next(chunks)
            os.kill(os.getpid(), signal.SIGTERM)
            wait_until(lambda: _health(server) == "draining", 10, "/health to say draining")
            seen["refused"] = server.raw("POST", "/v1/chat/completions", json.dumps(GOOD).encode())[:2]
            seen["stream"] = streamed(chunks)
        except BaseException as error:  # reported by the test's thread
            seen["error"] = error
            service.cancel_all()
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)  # two signals: the second stops at once
            os.kill(os.getpid(), signal.SIGTERM)

    helper = threading.Thread(target=client_side)
    helper.start()
    serve(config, service, log_level="warning")
    helper.join(30)
    assert "error" not in seen, seen.get("error")
    status, reply = seen["refused"]
    assert status == 503 and reply["error"]["code"] == "server_shutting_down"
    text, finish, _ = seen["stream"]
    assert text and finish in ("length", "stop")
    assert signal.getsignal(signal.SIGTERM) is before
    assert not service.engine.thread.is_alive()


def _health(server: Server) -> str | None:
    try:
        return server.raw("GET", "/health")[1]["status"]
    except OSError:
        return None


def test_serve_on_a_port_in_use_says_so(tiny_dirs):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = ServeConfig(target=str(tiny_dirs / "target"), model_name=MODEL, port=port, warmup=False)
        service = Service(config, generator(tiny_dirs))
        try:
            with pytest.raises(ArborError, match=f"could not listen on 127.0.0.1:{port}"):
                serve(config, service, log_level="critical")
        finally:
            wait_until(lambda: service.ready or service.load_error, 60, "the background load to end")
            service.close()


# ------------------------------------------------------------------------------------------------ extras
BLOCK = "import sys\nfor name in {names!r}:\n    sys.modules[name] = None\n"


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_the_package_loads_no_server_or_plot_package_and_names_the_extras():
    code = (
        "import sys\nimport arborspec, arborspec.api, arborspec.cli\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {EXTRA_MODULES!r})\n"
        "print(json.dumps(loaded))\n"
    )
    done = run_python("import json\n" + code)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []
    # without them: `serve`, `report` and `bench` say which extra to install, in one line
    code = BLOCK.format(names=EXTRA_MODULES) + (
        "from typer.testing import CliRunner\nfrom arborspec.cli import app\n"
        "for args in (['serve'], ['report', 'results.jsonl'], ['bench'], ['bench-batch']):\n"
        "    result = CliRunner().invoke(app, args)\n"
        "    print(result.exit_code, result.output.strip().replace(chr(10), ' | '))\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 4, done.stdout
    serve_line, *plot_lines = lines
    assert serve_line.startswith("2 error:") and 'pip install "arborspec[serve]"' in serve_line, serve_line
    for line in plot_lines:
        assert line.startswith("2 error:") and 'pip install "arborspec[plots]"' in line, line
        assert " | " not in line


@pytest.mark.slow
def test_generate_runs_without_the_server_and_plot_packages(tiny_dirs):
    code = BLOCK.format(names=EXTRA_MODULES) + (
        "from typer.testing import CliRunner\nfrom arborspec.cli import app\n"
        f"args = ['generate', 'Hello there', '--target', {str(tiny_dirs / 'target')!r}, '--draft', "
        f"{str(tiny_dirs / 'draft')!r}, '--max-new-tokens', '8', '--temperature', '0']\n"
        "result = CliRunner().invoke(app, args)\n"
        "print(result.exit_code)\nprint(result.output)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {EXTRA_MODULES!r} and sys.modules[m]))\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "0", done.stdout
    assert lines[-1] == "[]"
