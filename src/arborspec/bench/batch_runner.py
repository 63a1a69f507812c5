"""The concurrency benchmark: batched decoding (engine/batch_decode.py) with several clients at
once, every method against plain batched decoding, same process, same requests, interleaved.

    cfg = ConcurrencyConfig(methods=["dyspec:budget=1,2,3:lookup=6", "shared:max_nodes=8:lookup=6"],
                            concurrency=[1, 2, 4, 8, 16], arrivals=["burst", "staggered"])
    run_concurrency(cfg)         # runs/bench-batch/results.jsonl + report.md + concurrency.png

`arborspec bench-batch` builds the same `ConcurrencyConfig` (bench/batch_config.py) from its
options.

The workload. The first `num_prompts` prompts of the set (first turns; `mt-bench` is the stratified
MT-Bench selection `arborspec bench` uses, bench/prompts.py) are served by clients in a closed
loop over one queue, arriving at once or staggered (bench/batch_clients.py). Request k is decoded
with seed k, so every method gets the same requests. Every run of a (temperature, concurrency,
arrival, repeat) runs plain batched decoding and each method on the same requests, in an order
rotated by one from cell to cell, so machine drift hits all of them alike.

Measurement: wall seconds from the first submission to the end of the last request; tokens are the
new tokens of the requests (`GenerationResult.output_ids`), counted the same way for every method;
per request the latency (submission to end) and the time to its first token (submission to the end
of the step that committed it). Speedups and the comparison with plain batched decoding's outputs
are derived by the report from the records (bench/batch_stats.py), per run in `summary.json`.

The results file is JSON Lines, as `bench` writes it (bench/results.py): a header (`benchmark:
"concurrency"`), then one record per (temperature, concurrency, arrival, repeat, method), flushed as
soon as it exists; Ctrl-C keeps every finished run and `resume=True` runs only the missing ones.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from ..common.chat import encode_messages, eos_ids
from ..common.progress import progress_bar
from ..common.provenance import utc_timestamp
from ..common.timing import clock
from ..engine.batch_decode import BatchDecoder, BatchRequest, RequestHandle
from ..engine.decode import DecodeConfig, autoregressive_generate, check_context
from ..engine.sampling import sampling_config
from ..errors import ArborError
from ..models import ModelPair, default_draft, load_pair
from .batch_clients import closed_loop, start_offsets
from .batch_config import (
    BENCHMARK,
    PLAIN,
    SEQUENTIAL,
    BatchMethod,
    ConcurrencyConfig,
    expand_batch_methods,
)
from .batch_report import write_concurrency_report
from .prompts import conversation, load_prompts
from .report import SCHEMA_VERSION
from .results import (
    RecordKey,
    ResultsFile,
    check_resume_compatible,
    open_results,
    pair_fields,
    record_missing,
    record_runs,
)
from .run import RESUME_KEYS

WARMUP_TOKENS = 16  # new tokens of a warm-up request
PLAIN_STEP_TOKENS = 32  # new tokens of the request whose steps time one plain step
# Header fields that must match for `resume` to append to an existing results file: `bench`'s that
# this benchmark's config has
_RESUME_KEYS = tuple(k for k in RESUME_KEYS if k in {f.name for f in fields(ConcurrencyConfig)})


@dataclass(frozen=True)
class CellKey(RecordKey):
    """What one run is: a method on the requests of one (temperature, concurrency, arrival,
    repeat)."""

    temperature: float
    concurrency: int
    arrival: str
    repeat: int
    method: str


@dataclass
class Served:
    """One request as a run records it."""

    prompt_index: int
    output_ids: list[int]
    latency: float  # seconds, submission to end
    ttft: float  # seconds, submission to its first committed token
    steps: int
    accepted: int  # sum of the steps' accepted lengths (bonus included)
    tree_nodes: int  # sum of the steps' tree sizes
    stop_reason: str


class _BatchRunner:
    """The loaded pair, the methods' builders and how each kind of run is made."""

    def __init__(self, cfg: ConcurrencyConfig, pair: ModelPair, methods: list[BatchMethod]):
        self.cfg, self.pair, self.methods = cfg, pair, methods
        self.eos = eos_ids(pair.tokenizer, pair.target.model)
        self.builders = {m.label: m.make() for m in methods}
        self.by_label = {m.label: m for m in methods}
        self.device = pair.target.device
        self.plain_step_s: float | None = None

    def labels(self, concurrency: int, arrival: str) -> list[str]:
        sequential = self.cfg.sequential and concurrency == 1 and arrival == "burst"
        return [PLAIN] + [m.label for m in self.methods] + ([SEQUENTIAL] if sequential else [])

    def decode_config(self, temperature: float, index: int, max_new_tokens: int) -> DecodeConfig:
        sampling = sampling_config(
            temperature > 0, temperature, self.cfg.top_k, self.cfg.top_p, self.cfg.draft_temperature
        )
        return DecodeConfig(
            max_new_tokens=max_new_tokens, sampling=sampling, seed=index, eos_token_ids=self.eos
        )

    def rows(self, label: str) -> int:
        """The most rows one request of `label` feeds a step: root, tree cap, lookup tokens."""
        if label == PLAIN:
            return 1
        return 1 + self.builders[label].budget + self.by_label[label].lookup

    def decoder(self, label: str, concurrency: int) -> BatchDecoder:
        """A fresh decoder for one run: room for every client's request at once."""
        method = self.by_label.get(label)
        return BatchDecoder(
            self.pair.target,
            None if label == PLAIN else self.pair.drafter,
            max_rows=max(256, concurrency * self.rows(label)),
            max_requests=concurrency,
            shared=method.shared() if method is not None else None,
        )

    def run(
        self,
        label: str,
        ids: dict[int, list[int]],
        concurrency: int,
        arrival: str,
        temperature: float,
        max_new_tokens: int,
    ) -> tuple[list[Served], float]:
        """Serve the prompts `ids` (index -> token ids) with `label`; (requests in index order,
        wall seconds)."""
        indices = sorted(ids)
        if label == SEQUENTIAL:
            return self._sequential(ids, temperature, max_new_tokens)
        decoder = self.decoder(label, concurrency)
        builder = self.builders.get(label)
        lookup = self.by_label[label].lookup if label != PLAIN else 0

        def submit(index: int) -> RequestHandle:
            cfg = self.decode_config(temperature, index, max_new_tokens)
            return decoder.submit(BatchRequest(list(ids[index]), cfg, builder, lookup=lookup))

        clients = min(concurrency, len(indices))
        offsets = start_offsets(clients, arrival, self.plain_step_s or 0.0)
        handles, wall = closed_loop(decoder, indices, offsets, submit, self.device)
        served = []
        for index in indices:
            h = handles[index]
            steps = h.result.steps
            served.append(
                Served(
                    index,
                    list(h.result.output_ids),
                    h.finished_at - h.submitted_at,
                    (h.first_token_at if h.first_token_at is not None else h.finished_at)
                    - h.submitted_at,
                    len(steps),
                    sum(int(s.accepted_length) for s in steps),
                    sum(int(s.tree_size) for s in steps),
                    h.result.stop_reason,
                )
            )
        return served, wall

    def _sequential(
        self, ids: dict[int, list[int]], temperature: float, max_new_tokens: int
    ) -> tuple[list[Served], float]:
        """Plain decoding, one request after another (a closed loop of one client)."""
        served = []
        t0 = clock(self.device)
        for index in sorted(ids):
            cfg = self.decode_config(temperature, index, max_new_tokens)
            first: list[float] = []

            def on_tokens(new: list[int], first=first) -> None:
                if not first:
                    first.append(clock(self.device))

            submitted = clock(self.device)
            result = autoregressive_generate(self.pair.target, list(ids[index]), cfg, on_tokens)
            finished = clock(self.device)
            served.append(
                Served(
                    index,
                    list(result.output_ids),
                    finished - submitted,
                    (first[0] if first else finished) - submitted,
                    len(result.steps),
                    sum(int(s.accepted_length) for s in result.steps),
                    sum(int(s.tree_size) for s in result.steps),
                    result.stop_reason,
                )
            )
        return served, clock(self.device) - t0

    def measure_plain_step(self, ids: list[int], temperature: float) -> float:
        """Median seconds of a plain batched step of one request alone (the first step, which
        holds its prefill, left out): the unit of the staggered arrivals."""
        decoder = self.decoder(PLAIN, 1)
        cfg = self.decode_config(temperature, 0, min(self.cfg.max_new_tokens, PLAIN_STEP_TOKENS))
        decoder.submit(BatchRequest(list(ids), cfg, None))
        times = []
        while not decoder.idle:
            t0 = clock(self.device)
            decoder.step()
            times.append(clock(self.device) - t0)
        times = times[1:] or times
        return sorted(times)[len(times) // 2]

    def config_of(self, label: str) -> dict:
        if label in (PLAIN, SEQUENTIAL):
            return {"builder": "autoregressive", "batched": label == PLAIN}
        method = self.by_label[label]
        shared = method.shared()
        out = {"builder": self.builders[label].describe(), "lookup": method.lookup}
        if shared is not None:
            out["shared"] = {
                "max_nodes": shared.max_nodes,
                "max_depth": shared.max_depth,
                "budget": shared.budget,
            }
        return out


def _record(
    runner: _BatchRunner, key: CellKey, order: int, served: list[Served], wall: float
) -> dict:
    tokens = sum(len(s.output_ids) for s in served)
    steps = sum(s.steps for s in served)
    accepted = sum(s.accepted for s in served)
    nodes = sum(s.tree_nodes for s in served)
    return {
        "kind": "run",
        **asdict(key),
        "name": key.method.split(":")[0],
        "order": order,  # position in its cell's rotation
        "requests": len(served),
        "new_tokens": tokens,
        "wall_time": wall,
        "tokens_per_second": tokens / wall if wall > 0 else None,
        "steps": steps,
        "accepted": accepted,
        "tree_nodes": nodes,
        "mean_accepted_length": accepted / steps if steps else None,
        "mean_tree_size": nodes / steps if steps else None,
        "plain_step_s": runner.plain_step_s if key.arrival == "staggered" else None,
        "prompt_index": [s.prompt_index for s in served],
        "latency": [s.latency for s in served],
        "ttft": [s.ttft for s in served],
        "request_tokens": [len(s.output_ids) for s in served],
        "request_steps": [s.steps for s in served],
        "stop_reason": [s.stop_reason for s in served],
        "output_ids": [s.output_ids for s in served],
        "config": runner.config_of(key.method),
    }


def plan(cfg: ConcurrencyConfig) -> list[tuple[float, int, str, int]]:
    """(temperature, concurrency, arrival, repeat) in run order; staggered at concurrency 1 only
    where burst does not run (the same schedule)."""
    cells = []
    for temperature in cfg.temperatures:
        for repeat in range(cfg.repeats):
            for concurrency in cfg.concurrency:
                for arrival in cfg.arrivals:
                    if arrival == "staggered" and concurrency == 1 and "burst" in cfg.arrivals:
                        continue
                    cells.append((float(temperature), concurrency, arrival, repeat))
    return cells


def rotated(labels: list[str], k: int) -> list[str]:
    """`labels` started at position k (mod their number): cell k's run order."""
    k %= len(labels)
    return labels[k:] + labels[:k]


def run_concurrency(cfg: ConcurrencyConfig, pair: ModelPair | None = None, quiet: bool = False):
    """Run the benchmark into `cfg.out_dir` (results.jsonl, report.md, concurrency.png,
    summary.json); return the results path. `pair`: an already loaded pair (tests). Ctrl-C keeps
    every finished run, writes the report and raises `Interrupted` saying how to continue."""
    import torch

    cfg.validate()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    methods = expand_batch_methods(cfg.methods)
    prompts = load_prompts(cfg.prompts, cfg.num_prompts)
    if max(cfg.concurrency) > len(prompts):
        raise ArborError(
            f"concurrency {max(cfg.concurrency)} needs at least as many prompts (each client sends "
            f"at least one); the set gives {len(prompts)}: raise --num-prompts or lower "
            "--concurrency"
        )
    path, old_header, done = _prepare_output(cfg)
    if pair is None:
        cfg.draft = cfg.draft or default_draft(cfg.target)
        pair = load_pair(
            cfg.target, cfg.draft, cfg.device, cfg.dtype, None, None, None, cfg.draft_logits,
            cfg.compile,
        )
    else:
        cfg.draft = cfg.draft or pair.draft_name
    runner = _BatchRunner(cfg, pair, methods)
    ids = {
        i: encode_messages(pair.tokenizer, conversation(p, []), cfg.chat)
        for i, p in enumerate(prompts)
    }
    _check_lengths(runner, ids)
    header = _header(cfg, runner, prompts)
    if old_header is not None:
        if old_header.get("benchmark") != BENCHMARK:
            raise ArborError(f"{path} holds `arborspec bench` results: choose another --out")
        check_resume_compatible(old_header, header, path, _RESUME_KEYS)

    def runs(results: ResultsFile) -> None:
        if old_header is None:
            results.write(header)
        _warm_up(runner, ids, quiet)
        if any(a == "staggered" for _, _, a, _ in plan(cfg)):
            runner.plain_step_s = runner.measure_plain_step(ids[0], cfg.temperatures[0])
        _sweep(runner, ids, done, results, quiet)

    return record_runs(path, Path(cfg.out_dir), runs, write_concurrency_report, quiet)


def _prepare_output(cfg: ConcurrencyConfig) -> tuple[Path, dict | None, dict[CellKey, dict]]:
    """Create/check the output dir; with `resume`, read what is there (results.open_results)."""
    path, header, records = open_results(cfg.out_dir, cfg.resume)
    return path, header, {CellKey.of(r): r for r in records}


def _check_lengths(runner: _BatchRunner, ids: dict[int, list[int]]) -> None:
    """Fail before the first run if a prompt + max_new_tokens + the deepest tree would not fit."""
    depth = 1 + max(
        [0]
        + [
            max(
                runner.builders[m.label].depth_limit,
                m.shared().depth_limit if m.shared() is not None else 0,
                m.lookup,
            )
            for m in runner.methods
        ]
    )
    longest = len(max(ids.values(), key=len))
    dcfg = runner.decode_config(0.0, 0, runner.cfg.max_new_tokens)
    check_context(longest, dcfg, runner.pair.target.max_positions, depth)
    if runner.methods:
        check_context(longest, dcfg, runner.pair.drafter.max_positions, depth, who="draft")


def _header(cfg: ConcurrencyConfig, runner: _BatchRunner, prompts) -> dict:
    return {
        "kind": "header",
        "schema": SCHEMA_VERSION,
        "benchmark": BENCHMARK,
        "config": cfg.to_json(),
        "methods": [
            {
                "label": m.label,
                "name": m.name,
                "params": dict(m.spec.params),
                **runner.config_of(m.label),
            }
            for m in runner.methods
        ],
        "prompt_ids": [p.id for p in prompts],
        **pair_fields(runner.pair),
        "timestamp": utc_timestamp(),
    }


def _warm_up(runner: _BatchRunner, ids: dict[int, list[int]], quiet: bool) -> None:
    """Short unrecorded runs of every label (two requests at once, WARMUP_TOKENS each): first-call
    allocations, kernel selection and the batch's cost measurements stay out of timing."""
    cfg = runner.cfg
    if cfg.warmup == 0:
        return
    labels = [PLAIN] + [m.label for m in runner.methods] + ([SEQUENTIAL] if cfg.sequential else [])
    two = {i: ids[i] for i in sorted(ids)[:2]}
    with progress_bar(not quiet) as progress:
        task = progress.add_task("warm-up", total=cfg.warmup * len(labels), info="")
        for label in labels:
            for _ in range(cfg.warmup):
                runner.run(
                    label, two, min(2, len(two)), "burst", cfg.temperatures[0],
                    min(cfg.max_new_tokens, WARMUP_TOKENS),
                )
                progress.advance(task)


def _sweep(
    runner: _BatchRunner,
    ids: dict[int, list[int]],
    done: dict[CellKey, dict],
    results: ResultsFile,
    quiet: bool,
) -> None:
    cfg = runner.cfg
    cells = plan(cfg)
    total = sum(len(runner.labels(c, a)) for _, c, a, _ in cells)

    def run(key: CellKey, order: int) -> dict:
        served, wall = runner.run(
            key.method, ids, key.concurrency, key.arrival, key.temperature, cfg.max_new_tokens
        )
        return _record(runner, key, order, served, wall)

    def runs():
        for k, (temperature, concurrency, arrival, repeat) in enumerate(cells):
            for order, label in enumerate(rotated(runner.labels(concurrency, arrival), k)):
                key = CellKey(temperature, concurrency, arrival, repeat, label)
                description = f"c={concurrency} {arrival} r{repeat} T={temperature:g} {label}"
                yield key, description, functools.partial(run, key, order)

    record_missing(results, done, runs(), total, "bench-batch", quiet)
