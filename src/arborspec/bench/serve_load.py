"""The server load test: clients of `arborspec serve` with the official `openai` client, speculative
requests against the same server's plain ones (`speculative: false`, batched plain decoding).

    cfg = ServeLoadConfig(concurrency=[1, 4, 16], server_args=["--dtype", "int8"])
    run_serve_load(cfg)        # runs/bench-serve/results.jsonl + report.md + summary.json

`arborspec bench-serve` builds the same config from its options. Without `url` the benchmark starts
the server itself (`arborspec serve` on a free port of 127.0.0.1, its log in the output folder),
waits until `/health` says ready and stops it with SIGTERM at the end; with `url` it loads an
existing server. Loopback only by default: server and clients share the machine's cores.

The workload: the first `num_prompts` prompts of the set (first turns; `mt-bench` is the stratified
MT-Bench selection `arborspec bench` uses) are sent by `c` clients in a closed loop with the async
`openai` client over one queue: each client sends the next prompt nobody has sent yet as soon as
its previous request has ended (as a load generator with a concurrency limit does), each streamed
(`stream_options.include_usage`) with `max_tokens` and the temperature given, seed = the prompt's
index. For each (repeat, concurrency) every mode runs on the same requests, in an order rotated by
one from cell to cell, so drift hits both alike. Every request is bounded by `request_timeout_s`;
a request that fails or times out is counted as an error, never retried.

Figures per cell: requests/s and output tokens/s (completion tokens from each answer's `usage`,
counted the same way in both modes) over the wall seconds from the first request to the end of
the last; latency (request sent to its last chunk), time to first token (to the first chunk with
text) and per-token latency ((end - first text) / (tokens - 1)), each at p50 and p99 over the
requests; errors; the server's mean accepted length (the answers' `arborspec` statistics).
Speedup = tokens/s over the plain mode's in the same (repeat, concurrency); at temperature 0 the
texts are compared with plain's.

Records are JSON Lines (a header, then one record per cell, flushed at once); Ctrl-C keeps every
finished cell and `resume=True` runs only the missing ones.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..common.extras import require_serve
from ..common.jsonfiles import write_json_atomic
from ..common.ports import free_port
from ..common.provenance import machine_info, utc_timestamp, versions
from ..errors import ArborError, Interrupted
from .batch_runner import rotated
from .batch_stats import percentile
from .prompts import conversation, load_prompts
from .report import SCHEMA_VERSION
from .results import ResultsFile, open_results

BENCHMARK = "serve-load"
MODES = ("speculative", "plain")
REPORT_NAME = "report.md"
SUMMARY = "summary.json"
MODEL_NAME = "arborspec-load"
WARMUP_TOKENS = 16
_RESUME_KEYS = ("prompts", "num_prompts", "max_tokens", "temperature", "server_args", "url")


@dataclass(kw_only=True)
class ServeLoadConfig:
    url: str | None = None  # an existing server's base URL; None: start `arborspec serve`
    api_key: str | None = None
    server_args: list[str] = field(default_factory=list)  # `arborspec serve` options
    prompts: str = "mt-bench"
    num_prompts: int | None = 16
    max_tokens: int = 128
    temperature: float = 0.0
    concurrency: list[int] = field(default_factory=lambda: [1, 4, 16])
    modes: list[str] = field(default_factory=lambda: list(MODES))
    repeats: int = 1
    warmup: int = 1  # untimed rounds per mode: `concurrency` requests of WARMUP_TOKENS
    request_timeout_s: float = 300.0
    startup_timeout_s: float = 600.0
    out_dir: Path = Path("runs/bench-serve")
    resume: bool = False

    def validate(self) -> None:
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ArborError(f"concurrency must be whole numbers >= 1, got {self.concurrency}")
        bad = [m for m in self.modes if m not in MODES]
        if not self.modes or bad:
            raise ArborError(f"modes are {' and '.join(MODES)}, got {bad or 'nothing'}")
        if self.repeats < 1 or self.max_tokens < 1:
            raise ArborError("--repeats and --max-tokens must be >= 1")
        if self.temperature < 0:
            raise ArborError(f"--temperature must be >= 0, got {self.temperature}")
        if self.url is not None and self.server_args:
            raise ArborError("server options start a server: leave them out with --url")


# ------------------------------------------------------------------------------------ the server
def _get(url: str, api_key: str | None = None, timeout: float = 5.0) -> tuple[int, dict]:
    request = urllib.request.Request(url)
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


class ServerProcess:
    """`arborspec serve` started on a free loopback port, its output in `log`."""

    def __init__(
        self, args: list[str], log: Path, timeout_s: float, api_key: str | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            sys.executable,
            "-c",
            "from arborspec.cli import app; app()",
            "serve",
            "--port",
            str(self.port),
            "--model-name",
            MODEL_NAME,
            "--log-level",
            "warning",
            *args,
        ]
        self.log = open(log, "a", encoding="utf-8")
        self.proc = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise ArborError(
                    f"the server exited ({self.proc.returncode}) while starting: see {log}"
                )
            try:
                status, body = _get(self.url + "/health", api_key)  # the key: its details
                if status == 200:
                    self.health = body
                    return
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise ArborError(f"the server was not ready within {timeout_s:.0f} s: see {log}")
            time.sleep(0.5)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


# ------------------------------------------------------------------------------------ the clients
@dataclass
class Answer:
    """One request as its client saw it (seconds from the cell's start)."""

    index: int
    sent: float
    first_text: float | None = None
    end: float | None = None
    tokens: int = 0
    text: str = ""
    accepted_length: float | None = None
    error: str | None = None


async def _ask(
    client,
    model: str,
    messages: list[dict],
    index: int,
    cfg: ServeLoadConfig,
    mode: str,
    t0: float,
    max_tokens: int,
) -> Answer:
    answer = Answer(index, time.perf_counter() - t0)
    extra = {"speculative": False} if mode == "plain" else {}
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=cfg.temperature,
            seed=index,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
            timeout=cfg.request_timeout_s,
        )
        async for chunk in stream:
            stats = (chunk.model_extra or {}).get("arborspec")
            if stats:
                answer.accepted_length = stats.get("accepted_length")
            if chunk.usage is not None:
                answer.tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                if choice.delta.content:
                    if answer.first_text is None:
                        answer.first_text = time.perf_counter() - t0
                    answer.text += choice.delta.content
        answer.end = time.perf_counter() - t0
    except Exception as error:  # counted, never retried
        answer.error = f"{type(error).__name__}: {error}"[:300]
    return answer


async def _cell(
    cfg: ServeLoadConfig,
    base_url: str,
    model: str,
    chats: list[list[dict]],
    concurrency: int,
    mode: str,
    max_tokens: int,
) -> tuple[list[Answer], float]:
    """One closed loop of `concurrency` clients over every prompt; (answers, wall seconds)."""
    import openai

    async with openai.AsyncOpenAI(
        base_url=base_url + "/v1", api_key=cfg.api_key or "none", max_retries=0
    ) as client:
        t0 = time.perf_counter()

        queue = iter(range(len(chats)))  # one queue for every client (module doc)

        async def one_client() -> list[Answer]:
            return [
                await _ask(client, model, chats[i], i, cfg, mode, t0, max_tokens) for i in queue
            ]

        clients = min(concurrency, len(chats))
        per_client = await asyncio.gather(*(one_client() for _ in range(clients)))
        wall = time.perf_counter() - t0
    return sorted((a for answers in per_client for a in answers), key=lambda a: a.index), wall


def cell_figures(record: dict) -> dict:
    """A cell record's figures (module docstring)."""
    answers = [a for a in record["answers"] if a["error"] is None]
    tokens = sum(a["tokens"] for a in answers)
    wall = record["wall_s"]
    ttft = [a["first_text"] - a["sent"] for a in answers if a["first_text"] is not None]
    per_token = [
        (a["end"] - a["first_text"]) / (a["tokens"] - 1)
        for a in answers
        if a["first_text"] is not None and a["tokens"] > 1
    ]
    latency = [a["end"] - a["sent"] for a in answers if a["end"] is not None]
    accepted = [a["accepted_length"] for a in answers if a["accepted_length"] is not None]
    return {
        "requests": len(record["answers"]),
        "errors": len(record["answers"]) - len(answers),
        "requests_per_s": len(answers) / wall if wall > 0 else None,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "tokens": tokens,
        "latency_p50_s": percentile(latency, 50),
        "latency_p99_s": percentile(latency, 99),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "per_token_p50_s": percentile(per_token, 50),
        "per_token_p99_s": percentile(per_token, 99),
        "accepted_length": sum(accepted) / len(accepted) if accepted else None,
    }


# ------------------------------------------------------------------------------------ the run
def run_serve_load(cfg: ServeLoadConfig, quiet: bool = False) -> Path:
    """Run the load test into `cfg.out_dir`; return the results path (module docstring)."""
    cfg.validate()
    prompts = load_prompts(cfg.prompts, cfg.num_prompts)
    chats = [conversation(p, []) for p in prompts]
    path, old_header, records = open_results(cfg.out_dir, cfg.resume)
    done = {(r["repeat"], r["concurrency"], r["mode"]) for r in records}
    server = None
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    try:
        if cfg.url is None:
            require_serve()
            say(f"starting arborspec serve {' '.join(cfg.server_args)}")
            server = ServerProcess(
                cfg.server_args,
                Path(cfg.out_dir) / "server.log",
                cfg.startup_timeout_s,
                cfg.api_key,
            )
            base, health = server.url, server.health
        else:
            base = cfg.url.rstrip("/").removesuffix("/v1")
            status, health = _get(base + "/health", cfg.api_key)
            if status != 200:
                raise ArborError(
                    f"{base}/health answers {status} {health}: the server is not ready"
                )
        status, listing = _get(base + "/v1/models", cfg.api_key)
        if status != 200 or not listing.get("data"):
            raise ArborError(f"{base}/v1/models answers {status}: check --api-key")
        model = listing["data"][0]["id"]
        header = _header(cfg, health, len(chats))
        if old_header is not None:
            for key in _RESUME_KEYS:
                if old_header.get("config", {}).get(key) != header["config"][key]:
                    raise ArborError(f"{path} was made with another {key}: use another --out")
        out = ResultsFile(path)
        try:
            if old_header is None:
                out.write(header)
            for _ in range(cfg.warmup):
                for mode in cfg.modes:
                    warm = chats[: max(cfg.concurrency)]
                    asyncio.run(_cell(cfg, base, model, warm, len(warm), mode, WARMUP_TOKENS))
            k = 0
            for repeat in range(cfg.repeats):
                for concurrency in cfg.concurrency:
                    for mode in rotated(list(cfg.modes), k):
                        if (repeat, concurrency, mode) in done:
                            continue
                        answers, wall = asyncio.run(
                            _cell(cfg, base, model, chats, concurrency, mode, cfg.max_tokens)
                        )
                        record = {
                            "kind": "run",
                            "repeat": repeat,
                            "concurrency": concurrency,
                            "mode": mode,
                            "wall_s": wall,
                            "answers": [asdict(a) for a in answers],
                        }
                        out.write(record)
                        f = cell_figures(record)
                        say(
                            f"concurrency {concurrency} {mode}: {f['tokens_per_s']:.1f} tokens/s, "
                            f"{f['errors']} errors"
                        )
                    k += 1
        finally:
            out.close()
    except KeyboardInterrupt:
        raise Interrupted(
            f"interrupted: finished cells are in {path}; run again with --resume "
            "to add the missing ones"
        ) from None
    finally:
        if server is not None:
            server.stop()
    write_serve_report(path, cfg.out_dir)
    return path


def _header(cfg: ServeLoadConfig, health: dict, prompts: int) -> dict:
    config = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items() if k != "api_key"
    }
    return {
        "kind": "header",
        "schema": SCHEMA_VERSION,
        "benchmark": BENCHMARK,
        "started": utc_timestamp(),
        "config": config,
        "server": health,
        "prompts": prompts,
        "machine": machine_info(),
        "versions": versions(),
    }


# ------------------------------------------------------------------------------------ the report
def summarize(records: list[dict]) -> list[dict]:
    """One row per (concurrency, mode): the cells' figures pooled over repeats (tokens and
    requests over summed wall time; percentiles over every request), speedup and TTFT ratio
    against plain, texts identical to plain's (temperature 0)."""
    cells = defaultdict(list)
    for r in records:
        cells[(r["concurrency"], r["mode"])].append(r)
    rows = []
    for (concurrency, mode), group in sorted(
        cells.items(), key=lambda kv: (kv[0][0], kv[0][1] != "plain")
    ):
        pooled = {
            "wall_s": sum(r["wall_s"] for r in group),
            "answers": [a for r in group for a in r["answers"]],
        }
        row = {
            "concurrency": concurrency,
            "mode": mode,
            "repeats": len(group),
            **cell_figures(pooled),
        }
        rows.append(row)
    by = {(r["concurrency"], r["mode"]): r for r in rows}
    texts = {
        (r["concurrency"], r["mode"], a["index"]): a["text"]
        for r in records
        for a in r["answers"]
        if a["error"] is None and r["repeat"] == 0
    }
    for row in rows:
        base = by.get((row["concurrency"], "plain"))
        ok = base is not None and base["tokens_per_s"] and row["tokens_per_s"] is not None
        row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"] if ok else None
        ok = base is not None and base["ttft_p50_s"] and row["ttft_p50_s"] is not None
        row["ttft_p50_ratio"] = row["ttft_p50_s"] / base["ttft_p50_s"] if ok else None
        mine = [
            (i, t) for (c, m, i), t in texts.items() if c == row["concurrency"] and m == row["mode"]
        ]
        same = [
            t == texts.get((row["concurrency"], "plain", i))
            for i, t in mine
            if (row["concurrency"], "plain", i) in texts
        ]
        row["identical"] = sum(same) / len(same) if same else None
    return rows


def _fmt(value, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def write_serve_report(results_path: str | Path, out_dir: str | Path) -> Path:
    from .report import read_results

    header, records, _ = read_results(results_path)
    rows = summarize(records)
    write_json_atomic({"header": header, "rows": rows}, Path(out_dir) / SUMMARY)
    c = header["config"]
    server = header.get("server", {})
    lines = [
        "# arborspec server load test",
        "",
        f"* server: `arborspec serve {' '.join(c['server_args'])}`"
        if c.get("url") is None
        else f"* server: {c['url']}",
        f"* model: target `{server.get('target')}` ({server.get('precision')}), draft "
        f"`{server.get('draft')}`, method `{server.get('method')}` with "
        f"{server.get('budget')} draft nodes + lookup {server.get('lookup')}, shared budget "
        f"{server.get('shared_budget')}",
        f"* workload: `{c['prompts']}` x {header['prompts']} (first turns), {c['max_tokens']} "
        f"new tokens, temperature {c['temperature']}, streamed, closed loop; "
        f"{header['machine'].get('cpu_count', '?')} CPUs shared by the server and the clients; "
        f"{header['machine'].get('processor') or 'CPU model unknown'}, "
        f"{header['machine'].get('platform', '')}; started {header['started']}",
        "",
        "tokens/s = completion tokens of all requests / wall seconds of the cell; speedup = that "
        "over `plain` (`speculative: false` on the same server) at the same concurrency; latency = "
        "request sent to its last chunk; TTFT = "
        "request sent to its first text; per-token = (end - first text) / (tokens - 1); "
        "identical = share of texts equal to plain's.",
        "",
        "| concurrency | mode | requests/s | tokens/s | speedup | latency p50 / p99 (s) "
        "| TTFT p50 / p99 (s) "
        "| TTFT vs plain | per-token p50 / p99 (ms) | accepted length | errors | identical "
        "| repeats |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['concurrency']} | `{r['mode']}` | {_fmt(r['requests_per_s'])} | "
            f"{_fmt(r['tokens_per_s'], '.1f')} | {_ratio(r['speedup'])} | "
            f"{_fmt(r['latency_p50_s'])} / {_fmt(r['latency_p99_s'])} | "
            f"{_fmt(r['ttft_p50_s'], '.3f')} / {_fmt(r['ttft_p99_s'], '.3f')} | "
            f"{_ratio(r['ttft_p50_ratio'])} | {_fmt(_ms(r['per_token_p50_s']), '.1f')} / "
            f"{_fmt(_ms(r['per_token_p99_s']), '.1f')} | {_fmt(r['accepted_length'])} | "
            f"{r['errors']} | {_percent(r['identical'])} | "
            f"{r['repeats']} |"
        )
    path = Path(out_dir) / REPORT_NAME
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _percent(share: float | None) -> str:
    return "–" if share is None else f"{100 * share:.0f}%"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds
