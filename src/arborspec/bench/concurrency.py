"""The concurrency benchmark: batched decoding (engine/batch_decode.py) with several clients at
once, every method against plain batched decoding, same process, same requests, interleaved.

    cfg = ConcurrencyConfig(methods=["dyspec:budget=1,2,3:lookup=6", "shared:max_nodes=8:lookup=6"],
                            concurrency=[1, 2, 4, 8, 16], arrivals=["burst", "staggered"])
    run_concurrency(cfg)         # runs/bench-batch/results.jsonl + report.md + concurrency.png

`arborspec bench-batch` builds the same `ConcurrencyConfig` from its options.

The workload. The first `num_prompts` prompts of the set (first turns; `mt-bench` is the stratified
MT-Bench selection `arborspec bench` uses, bench/prompts.py) are served by `c` clients in a closed
loop over one queue, as a load generator with a concurrency limit sends them: each client sends
the next prompt nobody has sent yet (in order) as soon as its previous request has ended (the next
request joins the batch at the decoder's next step). With prompts dealt to the clients in advance
instead (client i sending i, i + c, ...), the run's end would depend on how the prompts happen to
add up per client: a method whose requests vary more in duration (a speculative one: acceptance
varies by prompt) would spend more of the run with a client's last requests decoding alone.
Request k is decoded with seed k, so every method gets the same requests. Arrivals:

* `burst`: every client sends its first request at time 0;
* `staggered`: client i sends its first request at i x one plain step, where one plain step is the
  median duration of a step of plain batched decoding of one request alone, measured once per
  process after the warm-up (`plain_step_s` in every record). Requests are submitted between steps,
  so an arrival during a step joins at the next one. At concurrency 1 this is the burst schedule:
  it is run only when `burst` is not.

Methods. Every run of a (temperature, concurrency, arrival, repeat) runs plain batched decoding
(`plain`: every request's root alone in the batch's forward, no drafter) and each method on the same
requests, in an order rotated by one from cell to cell, so machine drift hits all of them alike.
A method is a builder spec as `bench` takes it (`dyspec:budget=3:lookup=6`: that builder for every
request, context lookup per request) or `shared:max_nodes=8[:max_depth=D][:budget=B|auto]:lookup=6`:
DySpec trees of every request grown from one heap (builders/shared_budget.py), at most `max_nodes`
per request, `budget` draft nodes per step for the whole batch (auto, the default: sized by the
batch's measured costs). With `sequential`, plain decoding one request after another
(`plain-sequential`, `engine.decode.autoregressive_generate`) also runs in the concurrency-1 burst
cells: the ratio of plain batched to one-after-another throughput.

Measurement: wall seconds from the first submission to the end of the last request; tokens are the
new tokens of the requests (`GenerationResult.output_ids`), counted the same way for every method;
per request the latency (submission to end) and the time to its first token (submission to the end
of the step that committed it). A run's speedup is its tokens/s over plain batched tokens/s of the
same cell; at temperature 0 its outputs are compared, request by request, with plain batched
decoding's (on the batch-invariant int8 target they must all be equal). Both are derived by the
report from the records (a method may run before plain in its cell), per run in `summary.json`.

The results file is JSON Lines, as `bench` writes it (bench/run.py): a header (`benchmark:
"concurrency"`), then one record per (temperature, concurrency, arrival, repeat, method), flushed as
soon as it exists; Ctrl-C keeps every finished run and `resume=True` runs only the missing ones.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..builders import make_builder
from ..builders.shared_budget import SharedBudget
from ..common.chat import encode_messages, eos_ids
from ..common.jsonfiles import write_json_atomic
from ..common.progress import progress_bar
from ..common.provenance import machine_info, utc_timestamp, versions
from ..common.timing import clock
from ..engine.batch_decode import BatchDecoder, BatchRequest, RequestHandle
from ..engine.contracts import TreeBuilder
from ..engine.decode import DecodeConfig, autoregressive_generate, check_context
from ..engine.sampling import SamplingConfig, sampling_config
from ..errors import ArborError, Interrupted
from ..models import ModelPair, default_draft, head_int8, load_pair
from .prompts import conversation, load_prompts
from .report import SCHEMA_VERSION, _figure, _no_data, _save, read_results
from .run import MethodConfig, ResultsFile, open_results, parse_method_spec

BENCHMARK = "concurrency"  # the header's `benchmark`: what `arborspec report` tells apart
REPORT_NAME = "report.md"
PLOT = "concurrency.png"
SUMMARY = "summary.json"
PLAIN = "plain"  # plain batched decoding: every run's baseline
SEQUENTIAL = "plain-sequential"  # plain decoding one request after another (concurrency 1)
SHARED = "shared"  # DySpec trees of the whole batch from one heap (builders/shared_budget.py)
SHARED_KEYS = ("max_nodes", "max_depth", "budget", "lookup")
ARRIVALS = ("burst", "staggered")
WARMUP_TOKENS = 16  # new tokens of a warm-up request
PLAIN_STEP_TOKENS = 32  # new tokens of the request whose steps time one plain step
# Header fields that must match for `resume` to append to an existing results file
_RESUME_KEYS = (
    "target",
    "draft",
    "draft_logits",
    "prompts",
    "num_prompts",
    "max_new_tokens",
    "device",
    "dtype",
    "chat",
    "top_k",
    "top_p",
    "compile",
)


@dataclass(kw_only=True)
class ConcurrencyConfig:
    target: str = "embedded"
    draft: str | None = None  # None = the target's default draft
    draft_logits: str = "auto"
    methods: list[str] = field(default_factory=lambda: ["dyspec:budget=3:lookup=6"])
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    prompts: str = "mt-bench"
    num_prompts: int | None = 16
    max_new_tokens: int = 128
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    arrivals: list[str] = field(default_factory=lambda: ["burst", "staggered"])
    repeats: int = 1
    warmup: int = 1  # untimed warm-up runs per method (two requests of WARMUP_TOKENS each)
    sequential: bool = False  # also plain decoding one request after another, concurrency 1
    device: str = "cpu"
    dtype: str = "float32"
    out_dir: Path = Path("runs/bench-batch")
    resume: bool = False
    chat: bool = True
    top_k: int = 0
    top_p: float = 1.0
    draft_temperature: float | None = None
    threads: int | None = None
    compile: bool = False

    def validate(self) -> None:
        if not self.concurrency or any(
            not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in self.concurrency
        ):
            raise ArborError(f"concurrency must be whole numbers >= 1, got {self.concurrency}")
        bad = [a for a in self.arrivals if a not in ARRIVALS]
        if not self.arrivals or bad:
            raise ArborError(
                f"arrival must be {' or '.join(ARRIVALS)}, got {bad[0] if bad else 'nothing'!r}"
            )
        if self.sequential and (1 not in self.concurrency or "burst" not in self.arrivals):
            raise ArborError(
                "--sequential times plain decoding one request after another in the concurrency-1 "
                "burst runs: include 1 in --concurrency and burst in --arrival"
            )
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ArborError(f"temperatures must be >= 0 (0 = greedy), got {self.temperatures}")
        for name, value in (("max_new_tokens", self.max_new_tokens), ("repeats", self.repeats)):
            if value < 1:
                raise ArborError(f"{name} must be >= 1, got {value}")
        if self.warmup < 0:
            raise ArborError(f"warmup must be >= 0, got {self.warmup}")
        if self.threads is not None and self.threads < 1:
            raise ArborError(f"threads must be >= 1, got {self.threads}")
        head_int8(self.draft_logits, self.device, False)
        SamplingConfig(max(self.temperatures), self.top_k, self.top_p, self.draft_temperature)

    def to_json(self) -> dict:
        d = asdict(self)
        d["out_dir"] = str(self.out_dir)
        return d


# ------------------------------------------------------------------------------------------ methods
@dataclass(frozen=True)
class BatchMethod:
    """One method of the concurrency benchmark: a builder spec point, or the shared budget."""

    spec: MethodConfig

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def lookup(self) -> int:
        return self.spec.lookup

    def shared(self) -> SharedBudget | None:
        """The shared budget of a `shared:` method (None for a per-request builder)."""
        if self.name != SHARED:
            return None
        params = dict(self.spec.params)
        unknown = sorted(set(params) - set(SHARED_KEYS))
        if unknown:
            raise ArborError(
                f"method {self.label!r} has no parameter {unknown[0]!r}: {SHARED} takes "
                f"{', '.join(SHARED_KEYS)}"
            )
        if isinstance(params.get("budget"), str) and params["budget"].lower() == "auto":
            params["budget"] = None
        for key in ("max_nodes", "max_depth", "budget"):
            value = params.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ArborError(
                    f"method {self.label!r}: {key} must be a whole number >= 1"
                    + (" or auto" if key == "budget" else "")
                    + f", got {value!r}"
                )
        return SharedBudget(
            max_nodes=params.get("max_nodes", 16),
            max_depth=params.get("max_depth"),
            budget=params.get("budget"),
        )

    def make(self) -> TreeBuilder:
        """The builder every request of this method gets (for `shared`: DySpec up to its
        per-request cap, which the shared budget grows)."""
        shared = self.shared()
        if shared is not None:
            return make_builder("dyspec", budget=shared.max_nodes)
        return self.spec.make()


def expand_batch_methods(specs: list[str]) -> list[BatchMethod]:
    """Parse every spec (bench/run.parse_method_spec) and build each builder once, so a bad value
    fails before any model loads."""
    out: list[BatchMethod] = []
    for spec in specs:
        for point in parse_method_spec(spec):
            method = BatchMethod(point)
            if method.label in (PLAIN, SEQUENTIAL):
                raise ArborError(f"{method.label!r} always runs: give only tree methods with -m")
            method.make(), method.lookup  # one-line ArborErrors
            if method not in out:
                out.append(method)
    return out


def parse_concurrency(text: str) -> list[int]:
    """`--concurrency "1,2,4"` -> [1, 2, 4] (ascending, each once); one-line error otherwise."""
    items = [v for v in text.replace(" ", "").split(",") if v]
    if not items or not all(v.isdecimal() and v.isascii() and int(v) >= 1 for v in items):
        raise ArborError(
            "--concurrency must be a comma list of whole numbers >= 1, e.g. 1,2,4,8,16; "
            f"got {text!r}"
        )
    return sorted({int(v) for v in items})


def parse_arrivals(text: str) -> list[str]:
    """`--arrival "burst,staggered"` -> in ARRIVALS order, each once; one-line error otherwise."""
    items = [v.strip().lower() for v in text.split(",") if v.strip()]
    bad = [v for v in items if v not in ARRIVALS]
    if not items or bad:
        raise ArborError(
            f"--arrival must be a comma list of {', '.join(ARRIVALS)}; got {text!r}"
        )
    return [a for a in ARRIVALS if a in items]


# ------------------------------------------------------------------------------------------ running
@dataclass(frozen=True)
class CellKey:
    """What one run is: a method on the requests of one (temperature, concurrency, arrival,
    repeat)."""

    temperature: float
    concurrency: int
    arrival: str
    repeat: int
    method: str

    @classmethod
    def of(cls, record: dict) -> "CellKey":
        return cls(
            float(record["temperature"]),
            record["concurrency"],
            record["arrival"],
            record["repeat"],
            record["method"],
        )


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


def start_offsets(clients: int, arrival: str, plain_step_s: float) -> list[float]:
    """Seconds after the start at which each client sends its first request."""
    return [0.0 if arrival == "burst" else i * plain_step_s for i in range(clients)]


def closed_loop(
    decoder: BatchDecoder,
    indices: list[int],
    offsets: list[float],
    submit,
    device=None,
) -> tuple[dict[int, RequestHandle], float]:
    """Serve the prompts `indices` on `decoder` with `len(offsets)` clients drawing from one queue
    (module doc): client i sends its first request at `offsets[i]` (seconds from the start), and
    whenever one of its requests ends it sends the next prompt nobody has sent yet, in the order of
    `indices`. `submit(index)` submits prompt `index` and returns its handle. Returns the handles by
    prompt index and the wall seconds from the start to the end of the last request."""
    pending = list(indices)
    waiting = sorted(offsets)
    handles: dict[int, RequestHandle] = {}

    def send() -> None:
        if pending:
            index = pending.pop(0)
            handles[index] = submit(index)

    t0 = clock(device)
    while True:
        now = clock() - t0
        while waiting and waiting[0] <= now:
            waiting.pop(0)
            send()
        if decoder.idle:
            if not (waiting and pending):
                break
            time.sleep(max(0.0, waiting[0] - (clock() - t0)))
            continue
        for _ in decoder.step():
            send()
    return handles, clock(device) - t0


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
        for key in _RESUME_KEYS:
            if old_header["config"].get(key) != header["config"].get(key):
                raise ArborError(
                    f"{path} was made with {key}={old_header['config'].get(key)!r}, not "
                    f"{header['config'].get(key)!r}: resume with the same settings or choose "
                    "another --out"
                )
    results = ResultsFile(path)
    interrupted = False
    try:
        if old_header is None:
            results.write(header)
        _warm_up(runner, ids, quiet)
        if any(a == "staggered" for _, _, a, _ in plan(cfg)):
            runner.plain_step_s = runner.measure_plain_step(ids[0], cfg.temperatures[0])
        _sweep(runner, ids, done, results, quiet)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        results.close()
    _finish(path, Path(cfg.out_dir), quiet)
    if interrupted:
        raise Interrupted(
            f"interrupted; finished runs kept in {path}; rerun with --resume to continue"
        )
    return path


def _prepare_output(cfg: ConcurrencyConfig) -> tuple[Path, dict | None, dict[CellKey, dict]]:
    """Create/check the output dir; with `resume`, read what is there (bench/run.open_results)."""
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
        "versions": versions(),
        "device": str(runner.device),
        "machine": machine_info(),
        "target": runner.pair.target_name,
        "draft": runner.pair.draft_name,
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
    with progress_bar(not quiet) as progress:
        task = progress.add_task("bench-batch", total=total, info="")
        for k, (temperature, concurrency, arrival, repeat) in enumerate(cells):
            for order, label in enumerate(rotated(runner.labels(concurrency, arrival), k)):
                key = CellKey(temperature, concurrency, arrival, repeat, label)
                progress.update(
                    task,
                    description=f"c={concurrency} {arrival} r{repeat} T={temperature:g} {label}",
                )
                if key not in done:
                    served, wall = runner.run(
                        label, ids, concurrency, arrival, temperature, cfg.max_new_tokens
                    )
                    record = _record(runner, key, order, served, wall)
                    results.write(record)
                    done[key] = record
                    progress.update(task, info=f"{record['tokens_per_second'] or 0:6.1f} tok/s")
                progress.advance(task)


def _finish(path: Path, out_dir: Path, quiet: bool) -> None:
    from rich.console import Console

    console = Console(stderr=True, quiet=quiet)
    try:
        report = write_concurrency_report(path, out_dir)
    except ArborError as exc:
        console.print(f"no report written: {exc}")
        return
    console.print(f"results: {path}\nreport:  {report}")


# ------------------------------------------------------------------------------------------ figures
def is_concurrency_results(path: str | Path) -> bool:
    """Whether a results file was written by the concurrency benchmark (its header line says so;
    False for anything else, which the reader of `bench` results then judges)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            header = json.loads(fh.readline())
    except (OSError, ValueError):
        return False
    return isinstance(header, dict) and header.get("benchmark") == BENCHMARK


def read_concurrency_results(path: str | Path) -> tuple[dict, list[dict]]:
    header, runs, _ = read_results(path)
    if header.get("benchmark") != BENCHMARK:
        raise ArborError(
            f"{path} holds `arborspec bench` results, not `arborspec bench-batch` ones"
        )
    return header, runs


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between the closest ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def identical_fraction(record: dict, plain: dict) -> float | None:
    """The share of `record`'s requests whose tokens equal plain batched decoding's for the same
    prompt (None above temperature 0, or with no request in common)."""
    if float(record["temperature"]) != 0:
        return None
    theirs = dict(zip(plain["prompt_index"], plain["output_ids"]))
    pairs = [
        (o, theirs[i])
        for i, o in zip(record["prompt_index"], record["output_ids"])
        if i in theirs
    ]
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else None


def _plain_of(runs: list[dict]) -> dict[tuple, dict]:
    """The plain batched record of each (temperature, concurrency, arrival, repeat)."""
    return {
        (float(r["temperature"]), r["concurrency"], r["arrival"], r["repeat"]): r
        for r in runs
        if r["method"] == PLAIN
    }


def _baseline_for(record: dict, plain: dict[tuple, dict]) -> dict | None:
    return plain.get(
        (float(record["temperature"]), record["concurrency"], record["arrival"], record["repeat"])
    )


def run_figures(runs: list[dict]) -> list[dict]:
    """Every run's figures: tokens, seconds, tokens/s, latency and time-to-first-token
    percentiles, accepted length, tree size, the speedup over plain batched decoding of the same
    cell and the share of requests identical to it."""
    plain = _plain_of(runs)
    out = []
    for r in runs:
        base = _baseline_for(r, plain)
        rate = r["new_tokens"] / r["wall_time"] if r["wall_time"] > 0 else None
        base_rate = (
            base["new_tokens"] / base["wall_time"] if base and base["wall_time"] > 0 else None
        )
        out.append(
            {
                **{k: r[k] for k in ("temperature", "concurrency", "arrival", "repeat", "method")},
                "requests": r["requests"],
                "new_tokens": r["new_tokens"],
                "wall_time": r["wall_time"],
                "tokens_per_second": rate,
                "speedup": rate / base_rate if rate is not None and base_rate else None,
                "latency_p50": percentile(r["latency"], 50),
                "latency_p90": percentile(r["latency"], 90),
                "ttft_p50": percentile(r["ttft"], 50),
                "mean_accepted_length": r["accepted"] / r["steps"] if r["steps"] else None,
                "mean_tree_size": r["tree_nodes"] / r["steps"] if r["steps"] else None,
                "identical": (
                    identical_fraction(r, base) if base is not None and r is not base else None
                ),
            }
        )
    return out


@dataclass
class CellSummary:
    """One (temperature, arrival, concurrency, method) over its repeats."""

    temperature: float
    arrival: str
    concurrency: int
    method: str
    runs: int
    requests: int
    new_tokens: int
    wall_time: float
    tokens_per_second: float | None  # total tokens / total seconds
    speedup: float | None  # over plain batched decoding on the same repeats: ratio of totals
    latency_p50: float | None  # seconds, over every request of every repeat
    latency_p90: float | None
    ttft_p50: float | None
    mean_accepted_length: float | None  # total accepted / total steps (bonus included)
    mean_tree_size: float | None  # draft nodes per step
    identical: float | None  # share of requests equal to plain batched decoding's (T = 0)


def _rate(records: list[dict]) -> float | None:
    wall = sum(r["wall_time"] for r in records)
    return sum(r["new_tokens"] for r in records) / wall if wall > 0 else None


def summarize_cells(runs: list[dict], order: list[str] | None = None) -> list[CellSummary]:
    """The report's rows: every (temperature, arrival, concurrency, method), methods in `order`
    (plain batched first, then the header's methods, then the sequential run)."""
    plain = _plain_of(runs)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        groups[(float(r["temperature"]), r["arrival"], r["concurrency"], r["method"])].append(r)
    rank = {m: i for i, m in enumerate(order or [])}

    def sort_key(k):
        t, arrival, c, method = k
        kind = 0 if method == PLAIN else 2 if method == SEQUENTIAL else 1
        return (t, ARRIVALS.index(arrival), c, kind, rank.get(method, len(rank)), method)

    out = []
    for k in sorted(groups, key=sort_key):
        t, arrival, c, method = k
        records = groups[k]
        bases = [_baseline_for(r, plain) for r in records]
        matched = [(r, b) for r, b in zip(records, bases) if b is not None]
        rate = _rate(records)
        speedup = None
        if matched and method != PLAIN:
            mine, theirs = _rate([r for r, _ in matched]), _rate([b for _, b in matched])
            speedup = mine / theirs if mine is not None and theirs else None
        elif method == PLAIN:
            speedup = 1.0 if rate else None
        same = [
            (a == b)
            for r, base in matched
            if method != PLAIN and float(r["temperature"]) == 0
            for i, a in zip(r["prompt_index"], r["output_ids"])
            for b in [dict(zip(base["prompt_index"], base["output_ids"])).get(i)]
            if b is not None
        ]
        steps = sum(r["steps"] for r in records)
        out.append(
            CellSummary(
                temperature=t,
                arrival=arrival,
                concurrency=c,
                method=method,
                runs=len(records),
                requests=sum(r["requests"] for r in records),
                new_tokens=sum(r["new_tokens"] for r in records),
                wall_time=sum(r["wall_time"] for r in records),
                tokens_per_second=rate,
                speedup=speedup,
                latency_p50=percentile([v for r in records for v in r["latency"]], 50),
                latency_p90=percentile([v for r in records for v in r["latency"]], 90),
                ttft_p50=percentile([v for r in records for v in r["ttft"]], 50),
                mean_accepted_length=sum(r["accepted"] for r in records) / steps if steps else None,
                mean_tree_size=sum(r["tree_nodes"] for r in records) / steps if steps else None,
                identical=sum(same) / len(same) if same else None,
            )
        )
    return out


def sequential_ratios(runs: list[dict]) -> list[dict]:
    """Plain batched tokens/s at each (temperature, arrival, concurrency) over plain decoding one
    request after another (its concurrency-1 runs of the same temperature and repeats)."""
    seq: dict[float, dict[int, dict]] = defaultdict(dict)
    for r in runs:
        if r["method"] == SEQUENTIAL:
            seq[float(r["temperature"])][r["repeat"]] = r
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        if r["method"] == PLAIN and float(r["temperature"]) in seq:
            groups[(float(r["temperature"]), r["arrival"], r["concurrency"])].append(r)
    out = []
    for (t, arrival, c), records in sorted(
        groups.items(), key=lambda kv: (kv[0][0], ARRIVALS.index(kv[0][1]), kv[0][2])
    ):
        matched = [(r, seq[t][r["repeat"]]) for r in records if r["repeat"] in seq[t]]
        if not matched:
            continue
        batched, one = _rate([r for r, _ in matched]), _rate([s for _, s in matched])
        out.append(
            {
                "temperature": t,
                "arrival": arrival,
                "concurrency": c,
                "plain_batched_tokens_per_second": batched,
                "sequential_tokens_per_second": one,
                "ratio": batched / one if batched is not None and one else None,
            }
        )
    return out


# ------------------------------------------------------------------------------------------ report
def _fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


TABLE_HEAD = (
    "concurrency",
    "method",
    "tokens/s",
    "speedup",
    "latency p50 / p90 (s)",
    "first token p50 (s)",
    "accepted length",
    "tree size",
    "identical",
    "runs",
)


def table_cells(s: CellSummary) -> list[str]:
    """One row of the report's table, as written."""
    return [
        str(s.concurrency),
        f"`{s.method}`",
        _fmt(s.tokens_per_second, ".1f"),
        _fmt(s.speedup, ".2f", "x"),
        f"{_fmt(s.latency_p50)} / {_fmt(s.latency_p90)}",
        _fmt(s.ttft_p50, ".3f"),
        _fmt(s.mean_accepted_length),
        _fmt(s.mean_tree_size, ".1f"),
        _fmt(s.identical, ".0%"),
        str(s.runs),
    ]


def markdown_table(rows: list[CellSummary]) -> str:
    lines = ["| " + " | ".join(TABLE_HEAD) + " |", "|" + "---|" * len(TABLE_HEAD)]
    lines += ["| " + " | ".join(table_cells(s)) + " |" for s in rows]
    return "\n".join(lines)


def sequential_table(ratios: list[dict]) -> str:
    head = ("concurrency", "plain batched tokens/s", "one after another tokens/s", "ratio")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for q in ratios:
        lines.append(
            f"| {q['concurrency']} | {_fmt(q['plain_batched_tokens_per_second'], '.1f')} | "
            f"{_fmt(q['sequential_tokens_per_second'], '.1f')} | {_fmt(q['ratio'], '.2f', 'x')} |"
        )
    return "\n".join(lines)


def plot_concurrency(summaries: list[CellSummary], order: list[str], path: Path) -> None:
    """Per (temperature, arrival): tokens/s and speedup over plain batched decoding vs
    concurrency, one line per method."""
    panels = sorted(
        {(s.temperature, s.arrival) for s in summaries},
        key=lambda p: (p[0], ARRIVALS.index(p[1])),
    )
    plt, fig, axes = _figure(2 * len(panels), max_cols=2, width=5.5)
    for i, (t, arrival) in enumerate(panels):
        rate_ax, speed_ax = axes[2 * i], axes[2 * i + 1]
        rows = [s for s in summaries if s.temperature == t and s.arrival == arrival]
        methods = [m for m in order if any(s.method == m for s in rows)]
        for method in [m for m in methods if m != SEQUENTIAL]:
            pts = sorted(
                ((s.concurrency, s) for s in rows if s.method == method), key=lambda p: p[0]
            )
            style = {"ls": "--", "color": "grey"} if method == PLAIN else {}
            rates = [(c, s.tokens_per_second) for c, s in pts if s.tokens_per_second is not None]
            if rates:
                rate_ax.plot(
                    [c for c, _ in rates], [v for _, v in rates], marker="o", label=method, **style
                )
            ups = [(c, s.speedup) for c, s in pts if s.speedup is not None]
            if method != PLAIN and ups:
                speed_ax.plot(
                    [c for c, _ in ups], [v for _, v in ups], marker="o", label=method, **style
                )
        for s in rows:  # one request after another: a level, measured at concurrency 1
            if s.method == SEQUENTIAL and s.tokens_per_second is not None:
                rate_ax.axhline(
                    s.tokens_per_second, color="black", lw=0.8, ls=":", label=f"{SEQUENTIAL} (c=1)"
                )
        ticks = sorted({s.concurrency for s in rows})
        for ax, ylabel in (
            (rate_ax, "tokens / s (all requests)"),
            (speed_ax, "speedup vs plain batched"),
        ):
            if rows:
                ax.set_xscale("log", base=2)
                ax.set_xticks(ticks, [str(c) for c in ticks])
                ax.minorticks_off()
                ax.legend(fontsize=6)
            else:
                _no_data(ax, "runs")
            ax.set(
                title=f"{arrival}, temperature {t:g}",
                xlabel="concurrency (clients)",
                ylabel=ylabel,
            )
        speed_ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    _save(plt, fig, path)


def _describe(header: dict, path: Path) -> list[str]:
    c, m, v = header.get("config", {}), header.get("machine", {}), header.get("versions", {})
    return [
        f"* `{path}`: target `{header.get('target')}`, draft `{header.get('draft')}`, "
        f"{header.get('device')} {c.get('dtype')}"
        + (" (target decoder through torch.compile)" if c.get("compile") else "")
        + f"; prompts `{c.get('prompts')}` x {len(header.get('prompt_ids', []))} (first turns), "
        f"{c.get('max_new_tokens')} new tokens each; {m.get('cpu_count')} CPUs / "
        f"{m.get('torch_threads')} threads, {m.get('processor') or 'CPU model unknown'}, "
        f"{m.get('platform', '')}; "
        + ", ".join(f"{k} {val}" for k, val in v.items())
        + f"; started {header.get('timestamp', '?')}"
    ]


def write_concurrency_report(results_path: str | Path, out_dir: str | Path) -> Path:
    """report.md, concurrency.png and summary.json from a concurrency results file; returns the
    path of report.md."""
    results_path = Path(results_path)
    header, runs = read_concurrency_results(results_path)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArborError(
            f"cannot create report dir {str(out)!r} ({exc.strerror or exc}): choose another --out"
        ) from None
    order = [PLAIN] + [m["label"] for m in header.get("methods", [])] + [SEQUENTIAL]
    summaries = summarize_cells(runs, order)
    ratios = sequential_ratios(runs)
    plot_concurrency(summaries, order, out / PLOT)
    steps = sorted({r["plain_step_s"] for r in runs if r.get("plain_step_s") is not None})
    lines = [
        "# arborspec concurrency benchmark",
        "",
        *_describe(header, results_path),
        "",
        "c clients in a closed loop over one queue: each sends the next prompt not yet sent (in "
        "order) as soon as its previous request ends. *burst*: every client starts at once; "
        "*staggered*: client i starts i plain steps later (one plain step = the median step of "
        "plain batched decoding of one request"
        + (f": {', '.join(f'{1000 * s:.1f}' for s in steps)} ms" if steps else "")
        + "; at concurrency 1 the burst schedule). tokens/s = new tokens of all requests / wall "
        "seconds from the first submission to the end of the last request; speedup = that over "
        "plain batched decoding's (`plain`) on the same requests and repeats; latency = submission "
        "to end of a request, first token = submission to its first token (percentiles over every "
        "request); accepted length = tokens committed per step, bonus included; tree size = draft "
        "nodes per step; identical = share of requests whose tokens equal plain batched decoding's "
        "(temperature 0).",
        "",
    ]
    for t in sorted({s.temperature for s in summaries}):
        for arrival in [a for a in ARRIVALS if any(s.arrival == a for s in summaries)]:
            rows = [s for s in summaries if s.temperature == t and s.arrival == arrival]
            if rows:
                heading = f"## {arrival.capitalize()}, temperature {t:g}"
                lines += [heading, "", markdown_table(rows), ""]
    if ratios:
        lines += [
            "## Plain batched decoding vs one request after another",
            "",
            "Plain batched decoding's tokens/s at each concurrency over plain decoding of the same "
            f"requests one after another (`{SEQUENTIAL}`, a single client) on the same repeats.",
            "",
        ]
        for t in sorted({q["temperature"] for q in ratios}):
            for arrival in ARRIVALS:
                rows = [q for q in ratios if q["temperature"] == t and q["arrival"] == arrival]
                if rows:
                    lines += [
                        f"### {arrival.capitalize()}, temperature {t:g}",
                        "",
                        sequential_table(rows),
                        "",
                    ]
    lines += ["## Plot", "", f"![{PLOT[:-4]}]({PLOT})", ""]
    path = out / REPORT_NAME
    path.write_text("\n".join(lines), encoding="utf-8")
    write_json_atomic(
        {
            "config": header.get("config", {}),
            "cells": [dataclasses.asdict(s) for s in summaries],
            "sequential": ratios,
            "runs": run_figures(runs),
        },
        out / SUMMARY,
        indent=1,
    )
    return path
