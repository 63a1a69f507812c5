"""`arborspec serve` on Ray Serve (serve/ray_app.py): a local Ray cluster on 127.0.0.1 with two replicas of a tiny
int8 pair, talked to with the `openai` client: chat and completions, streamed or not, give the single server's text
(plain decoding's at temperature 0); requests spread over both replicas; a replica killed mid-stream fails that
request cleanly while the other keeps answering, and Ray Serve brings a new one up; shutting down leaves no Ray
process behind. Needs the `ray` extra."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import openai
import pytest

ray = pytest.importorskip("ray")

from arborspec.common.ports import free_port  # noqa: E402
from arborspec.serve import ServeConfig  # noqa: E402

from conftest import wait_until  # noqa: E402
from test_serve import LONG, MODEL, NEW, PROMPTS, generator, plain, streamed, tiny_dirs  # noqa: E402,F401

pytestmark = pytest.mark.slow  # a Ray cluster, two replica processes


def ray_processes() -> set[int]:
    """Processes of a Ray cluster on this machine (its GCS server, raylet and workers)."""
    out = subprocess.run(["pgrep", "-f", "gcs_server|raylet|ray::|default_worker.py"], capture_output=True,
                         text=True).stdout
    return {int(p) for p in out.split()}


@pytest.fixture(scope="module")
def cluster(tiny_dirs):  # noqa: F811  (the fixture imported from test_serve)
    from arborspec.serve import ray_app
    from ray import serve

    gen = generator(tiny_dirs)
    refs = [plain(gen, gen.tokenizer(p)["input_ids"])[0] for p in PROMPTS[:12]]
    before = ray_processes()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    config = ServeConfig(target=str(tiny_dirs / "target"), draft=str(tiny_dirs / "draft"), dtype="int8",
                         model_name=MODEL, port=free_port(), default_max_tokens=NEW, shutdown_timeout=5)
    ray_app.start(config, ray_app.ReplicaOptions(replicas=2, num_cpus=1, health_check_period_s=1))
    state = {"stopped": False}
    yield f"http://127.0.0.1:{config.port}/v1", refs, before, state, serve
    if not state["stopped"]:
        ray_app.stop()


def client(url: str, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60, **kw)


def ask(c, i: int, **kw):
    return c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[i]}], temperature=0,
                                     max_tokens=NEW, **kw)


def test_replicas_answer_as_the_single_server_and_share_the_requests(cluster):
    url, refs, *_ = cluster
    c = client(url)
    reply = ask(c, 0)
    assert reply.choices[0].message.content == refs[0] and reply.model_extra["arborspec"]["replica"]
    assert streamed(ask(c, 1, stream=True))[0] == refs[1]
    done = c.completions.create(model=MODEL, prompt=PROMPTS[2], temperature=0, max_tokens=NEW)
    assert done.choices[0].text == refs[2]
    assert streamed(c.completions.create(model=MODEL, prompt=PROMPTS[3], temperature=0, max_tokens=NEW,
                                         stream=True))[0] == refs[3]

    async def many():
        async with openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=60) as ac:
            return await asyncio.gather(*(ac.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": PROMPTS[i]}], temperature=0, max_tokens=NEW,
                extra_body={"speculative": i % 2 == 0}) for i in range(12)))

    replies = asyncio.run(many())
    assert [r.choices[0].message.content for r in replies] == refs
    assert len({r.model_extra["arborspec"]["replica"] for r in replies}) == 2  # both replicas served


def test_a_killed_replica_fails_its_request_and_comes_back(cluster):
    url, refs, _, _, serve = cluster
    c = client(url)
    with c.chat.completions.with_streaming_response.create(
            model=MODEL, messages=[{"role": "user", "content": LONG}], temperature=0, max_tokens=1500,
            stream=True) as response:
        killed, pid = response.headers["x-arborspec-replica"], int(response.headers["x-arborspec-pid"])
        lines = response.iter_lines()
        next(lines)
        os.kill(pid, signal.SIGKILL)
        t0, finished = time.time(), False
        try:
            for line in lines:
                finished = finished or line == "data: [DONE]"
        except Exception:  # the broken connection surfaces as an error, or as the stream's end
            pass
        assert not finished, "the killed replica's stream ended as if complete"
        assert time.time() - t0 < 30
    # the other replica keeps answering
    for i in range(4):
        reply = ask(c, i)
        assert reply.choices[0].message.content == refs[i]
        assert reply.model_extra["arborspec"]["replica"] != killed
    # and Ray Serve replaces the killed one (asked every 0.5 s: each question is a call to the controller)
    def states() -> dict:
        return serve.status().applications["arborspec"].deployments["ArborspecReplica"].replica_states

    deadline = time.time() + 90
    wait_until(lambda: states().get("RUNNING", 0) == 2, 90,
               lambda: f"Ray Serve to replace the killed replica (replica states {states()})", every=0.5)
    # the proxy learns of the new replica shortly after: concurrent requests reach it
    survivor, seen = reply.model_extra["arborspec"]["replica"], set()

    async def round_():
        async with openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=60) as ac:
            replies = await asyncio.gather(*(ac.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": PROMPTS[i]}], temperature=0, max_tokens=NEW)
                for i in range(6)))
        assert [r.choices[0].message.content for r in replies] == refs[:6]
        return {r.model_extra["arborspec"]["replica"] for r in replies}

    def new_replica_answered() -> bool:
        seen.update(asyncio.run(round_()))
        return bool(seen - {survivor})

    wait_until(new_replica_answered, max(0.0, deadline - time.time()),
               lambda: f"a request to reach the new replica (replicas that answered: {seen})")
    assert killed not in seen


def test_shutdown_leaves_no_ray_process(cluster):
    from arborspec.serve import ray_app

    url, _, before, state, _ = cluster
    assert ray_processes() - before  # the cluster runs
    ray_app.stop()
    state["stopped"] = True
    wait_until(lambda: not ray_processes() - before, 30,
               lambda: f"the Ray processes to end (left: {ray_processes() - before})", every=0.5)
    with pytest.raises(openai.APIConnectionError):
        ask(client(url), 0)
