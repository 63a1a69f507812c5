"""The concurrency benchmark (`arborspec bench-batch`, bench/batch_*.py): the closed loop's schedule, exact
records on a tiny int8 pair (token counts, every request identical to plain batched decoding at T = 0), resume after
Ctrl-C, the report's cells from the records, and one-line errors for bad options."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
from arborspec.bench.batch_clients import closed_loop
from arborspec.bench.batch_config import (
    PLAIN,
    SEQUENTIAL,
    ConcurrencyConfig,
    expand_batch_methods,
    parse_arrivals,
    parse_concurrency,
)
from arborspec.bench.batch_report import PLOT, write_concurrency_report
from arborspec.bench.batch_runner import CellKey, plan, rotated, run_concurrency
from arborspec.bench.batch_stats import percentile, run_figures, summarize_cells
from arborspec.bench.report import read_results, write_report
from arborspec.engine.decode import DecodeConfig, autoregressive_generate
from arborspec.engine.sampling import SamplingConfig
from arborspec.errors import ArborError
from arborspec.models import load_pair

from conftest import char_tokenizer, perturbed_copy, tiny_llama

METHODS = ["dyspec:budget=3:lookup=2", "shared:max_nodes=3:lookup=2"]
PROMPTS = ["Hello there, tiny model.", "Count: 1 2 3 4", "abcabcabcabc", "Why is the sky blue?"]


# ---------------------------------------------------------------------------------------------- the schedule
class FakeDecoder:
    """Each request ends after `steps` steps (`lengths`: prompt -> its own count); records when each prompt
    was submitted and in which step."""

    def __init__(self, steps: int, step_s: float = 0.0, lengths: dict | None = None) -> None:
        self.steps, self.step_s, self.lengths = steps, step_s, lengths or {}
        self.active: dict = {}
        self.submitted: list[tuple[int, int, float]] = []  # (prompt, step number, time)
        self.count = 0

    def submit(self, index: int):
        handle = object()
        self.active[handle] = self.lengths.get(index, self.steps)
        self.submitted.append((index, self.count, time.perf_counter()))
        return handle

    @property
    def idle(self) -> bool:
        return not self.active

    def step(self):
        self.count += 1
        time.sleep(self.step_s)
        for h in self.active:
            self.active[h] -= 1
        ended = [h for h, left in self.active.items() if left == 0]
        for h in ended:
            del self.active[h]
        return ended


def test_clients_send_the_next_prompt_of_one_queue_as_soon_as_their_previous_one_ends():
    dec = FakeDecoder(steps=3)
    handles, wall = closed_loop(dec, list(range(5)), [0.0, 0.0], dec.submit)
    assert sorted(handles) == list(range(5)) and wall > 0
    # burst: both first requests before the first step; each next one right after a request ended
    assert [(i, n) for i, n, _ in dec.submitted] == [(0, 0), (1, 0), (2, 3), (3, 3), (4, 6)]
    assert dec.count == 9
    # requests of different lengths: the client whose requests are short sends the queue's next ones
    # (prompts dealt in advance would have sent 2 after 0, at step 6, and the run would last 8 steps)
    dec = FakeDecoder(steps=2, lengths={0: 6})
    closed_loop(dec, [0, 1, 2, 3], [0.0, 0.0], dec.submit)
    assert [(i, n) for i, n, _ in dec.submitted] == [(0, 0), (1, 0), (2, 2), (3, 4)]
    assert dec.count == 6
    # more clients than prompts: every prompt at once
    dec = FakeDecoder(steps=2)
    closed_loop(dec, [7, 8], [0.0, 0.0, 0.0], dec.submit)
    assert [(i, n) for i, n, _ in dec.submitted] == [(7, 0), (8, 0)] and dec.count == 2


def test_staggered_clients_start_one_plain_step_apart():
    dec = FakeDecoder(steps=40, step_s=0.002)
    unit = 0.01
    t0 = time.perf_counter()
    closed_loop(dec, list(range(3)), [0.0, unit, 2 * unit], dec.submit)
    firsts = {i: (n, t - t0) for i, n, t in dec.submitted}
    assert firsts[0][0] == 0 and firsts[1][1] >= unit and firsts[2][1] >= 2 * unit  # never before its start
    # ... and joined between steps while the first request was still in flight (not once the batch went idle)
    assert 0 < firsts[1][0] <= firsts[2][0] < 40
    assert [i for i, _, _ in dec.submitted] == [0, 1, 2]


def test_plan_rotation_and_option_parsing():
    cfg = ConcurrencyConfig(concurrency=[1, 2], arrivals=["burst", "staggered"], repeats=2, temperatures=[0.0])
    # staggered at concurrency 1 is the burst schedule: run once
    assert plan(cfg) == [(0.0, 1, "burst", 0), (0.0, 2, "burst", 0), (0.0, 2, "staggered", 0),
                         (0.0, 1, "burst", 1), (0.0, 2, "burst", 1), (0.0, 2, "staggered", 1)]
    assert rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert parse_concurrency("16, 1,2,2") == [1, 2, 16]
    assert parse_arrivals("staggered,burst") == ["burst", "staggered"]
    labels = [m.label for m in expand_batch_methods(["dyspec:budget=1,2:lookup=6", "shared:max_nodes=8:lookup=6",
                                                      "shared:max_nodes=4:budget=auto"])]
    assert labels == ["dyspec:budget=1:lookup=6", "dyspec:budget=2:lookup=6", "shared:max_nodes=8:lookup=6",
                      "shared:max_nodes=4:budget=auto"]
    shared = expand_batch_methods(["shared:max_nodes=4:max_depth=3:budget=6"])[0]
    assert (shared.shared().max_nodes, shared.shared().max_depth, shared.shared().budget) == (4, 3, 6)
    assert shared.make().name == "dyspec" and shared.make().budget == 4
    assert percentile([4.0, 1.0, 3.0, 2.0], 90) == pytest.approx(np.percentile([1, 2, 3, 4], 90))


@pytest.mark.parametrize("spec", ["shared:bogus=1", "shared:max_nodes=0", "shared:budget=x", "nosuch:budget=2",
                                  "dyspec:budget=0", "plain"])
def test_bad_methods_fail_up_front(spec):
    with pytest.raises(ArborError):
        expand_batch_methods([spec])


# ---------------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """A tiny random Llama target + a perturbed draft saved with a character tokenizer, and a prompts file."""
    root = tmp_path_factory.mktemp("tiny-batch")
    target = tiny_llama(0)
    draft = perturbed_copy(target, 1, 0.3)
    tok = char_tokenizer()
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return root


@pytest.fixture(scope="module")
def int8_pair(tiny_dirs):
    return load_pair(str(tiny_dirs / "target"), str(tiny_dirs / "draft"), "cpu", "int8")


def _cfg(root: Path, out: Path, **kw) -> ConcurrencyConfig:
    base = dict(target=str(root / "target"), draft=str(root / "draft"), dtype="int8", methods=list(METHODS),
                prompts=str(root / "prompts.jsonl"), num_prompts=None, max_new_tokens=8, concurrency=[1, 2],
                arrivals=["burst", "staggered"], sequential=True, warmup=0, out_dir=out, threads=1)
    base.update(kw)
    return ConcurrencyConfig(**base)


@pytest.fixture(scope="module")
def full_run(tiny_dirs, int8_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("batch-full")
    path = run_concurrency(_cfg(tiny_dirs, out, warmup=1), pair=int8_pair, quiet=True)
    return path, out


def _references(pair, prompts_file: Path, max_new_tokens: int = 8) -> list[list[int]]:
    """Each prompt decoded plainly, alone, seeded by its index: what every request of every method must give at
    T = 0."""
    from arborspec.bench.prompts import conversation, load_prompts
    from arborspec.common.chat import encode_messages, eos_ids

    eos = eos_ids(pair.tokenizer, pair.target.model)
    refs = []
    for i, p in enumerate(load_prompts(str(prompts_file))):
        ids = encode_messages(pair.tokenizer, conversation(p, []))
        cfg = DecodeConfig(max_new_tokens=max_new_tokens, sampling=SamplingConfig(0.0), seed=i, eos_token_ids=eos)
        refs.append(autoregressive_generate(pair.target, ids, cfg).output_ids)
    return refs


def test_records_hold_exact_tokens_and_every_request_equals_plain(full_run, int8_pair, tiny_dirs):
    path, out = full_run
    header, runs, _ = read_results(path)
    assert header["benchmark"] == "concurrency" and [m["label"] for m in header["methods"]] == METHODS
    # cells: (1, burst) with the sequential run, (2, burst), (2, staggered): 4 + 3 + 3 runs, each once
    keys = [CellKey.of(r) for r in runs]
    assert len(keys) == len(set(keys)) == 10
    assert {k.method for k in keys if k.concurrency == 1} == {PLAIN, SEQUENTIAL, *METHODS}
    refs = _references(int8_pair, tiny_dirs / "prompts.jsonl")
    for r in runs:
        assert r["prompt_index"] == [0, 1, 2, 3] and r["requests"] == 4
        assert r["output_ids"] == refs, r["method"]  # exact tokens, every method, batched or not
        assert r["new_tokens"] == sum(map(len, refs)) == sum(r["request_tokens"])
        assert r["accepted"] == r["new_tokens"]  # every committed token accounted to a step
        assert r["tokens_per_second"] == r["new_tokens"] / r["wall_time"]
        assert all(0 < f <= lat for f, lat in zip(r["ttft"], r["latency"]))
        if r["method"] in (PLAIN, SEQUENTIAL):
            assert r["steps"] == r["new_tokens"] and r["tree_nodes"] == 0
        assert (r["plain_step_s"] is not None) == (r["arrival"] == "staggered")
    # the run order rotates by one from cell to cell
    orders = {}
    for r in runs:
        orders.setdefault((r["concurrency"], r["arrival"]), {})[r["order"]] = r["method"]
    first = [orders[cell][0] for cell in ((1, "burst"), (2, "burst"), (2, "staggered"))]
    assert first == [PLAIN, METHODS[0], METHODS[1]]
    figures = run_figures(runs)
    assert all(f["identical"] == 1.0 for f in figures if f["method"] != PLAIN)
    assert all(s.identical == 1.0 for s in summarize_cells(runs) if s.method != PLAIN)
    for name in ("report.md", "summary.json", PLOT):
        assert (out / name).stat().st_size > 500, name


def _table_rows(report: str, heading: str) -> list[list[str]]:
    section = report.split(heading, 1)[1].split("\n#", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| concurrency")]


def test_report_cells_are_the_records_figures(full_run):
    """Every cell of the report's tables, recomputed here from the records with numpy: equal as written."""
    path, out = full_run
    _, runs, _ = read_results(path)
    report = (out / "report.md").read_text()
    for arrival in ("burst", "staggered"):
        rows = _table_rows(report, f"## {arrival.capitalize()}, temperature 0")
        assert len(rows) == (4 + 3 if arrival == "burst" else 3)
        for row in rows:
            c, method = int(row[0]), row[1].strip("`")
            [r] = [r for r in runs if r["concurrency"] == c and r["arrival"] == arrival and r["method"] == method]
            [base] = [p for p in runs if p["concurrency"] == c and p["arrival"] == arrival and p["method"] == PLAIN]
            rate = r["new_tokens"] / r["wall_time"]
            lat, ttft = np.array(r["latency"]), np.array(r["ttft"])
            same = [a == b for a, b in zip(r["output_ids"], base["output_ids"])]
            want = [str(c), f"`{method}`", f"{rate:.1f}", f"{rate / (base['new_tokens'] / base['wall_time']):.2f}x",
                    f"{np.percentile(lat, 50):.2f} / {np.percentile(lat, 90):.2f}", f"{np.percentile(ttft, 50):.3f}",
                    f"{r['accepted'] / r['steps']:.2f}", f"{r['tree_nodes'] / r['steps']:.1f}",
                    "–" if method == PLAIN else f"{sum(same) / len(same):.0%}", "1"]
            assert row == want, (arrival, method)
    [seq] = [r for r in runs if r["method"] == SEQUENTIAL]
    ratio_rows = _table_rows(report.split("## Plain batched decoding vs one request after another", 1)[1],
                             "### Burst, temperature 0")
    assert [row[0] for row in ratio_rows] == ["1", "2"]
    for row in ratio_rows:
        [base] = [p for p in runs
                  if p["concurrency"] == int(row[0]) and p["arrival"] == "burst" and p["method"] == PLAIN]
        batched, one = base["new_tokens"] / base["wall_time"], seq["new_tokens"] / seq["wall_time"]
        assert row[1:] == [f"{batched:.1f}", f"{one:.1f}", f"{batched / one:.2f}x"]
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["runs"]) == len(runs) and len(summary["cells"]) == 10


def _synthetic(method, c, repeat, tokens, wall, latency, outputs, steps, nodes, arrival="burst"):
    return {"kind": "run", "temperature": 0.0, "concurrency": c, "arrival": arrival, "repeat": repeat,
            "method": method, "name": method.split(":")[0], "order": 0, "requests": len(outputs),
            "new_tokens": tokens, "wall_time": wall, "tokens_per_second": tokens / wall, "steps": steps,
            "accepted": tokens, "tree_nodes": nodes, "prompt_index": list(range(len(outputs))), "latency": latency,
            "ttft": [x / 10 for x in latency], "request_tokens": [len(o) for o in outputs],
            "request_steps": [1] * len(outputs), "stop_reason": ["length"] * len(outputs), "output_ids": outputs,
            "plain_step_s": None, "config": {}}


def test_report_pools_repeats_as_ratios_of_totals(tmp_path):
    """Hand-computed cells: two repeats pooled (tokens/s and speedup as ratios of totals, percentiles over every
    request, accepted length and tree size per step), 3 of 4 requests identical."""
    m = "dyspec:budget=3:lookup=6"
    same, other = [[1, 2], [3], [4, 5], [6]], [[1, 2], [3], [4, 9], [6]]
    runs = [_synthetic(PLAIN, 2, 0, 60, 2.0, [1.0, 2.0, 3.0, 4.0], same, 60, 0),
            _synthetic(PLAIN, 2, 1, 60, 4.0, [1.0, 2.0, 3.0, 4.0], same, 60, 0),
            _synthetic(m, 2, 0, 60, 1.0, [0.5, 1.0, 1.5, 2.0], same, 30, 90),
            _synthetic(m, 2, 1, 60, 1.0, [0.5, 1.0, 1.5, 2.0], other, 30, 90),
            _synthetic(SEQUENTIAL, 1, 0, 60, 6.0, [1.0, 1.0, 1.0, 1.0], same, 60, 0),
            _synthetic(PLAIN, 1, 0, 60, 3.0, [1.0, 1.0, 1.0, 1.0], same, 60, 0)]
    header = {"kind": "header", "schema": 1, "benchmark": "concurrency", "target": "t", "draft": "d",
              "device": "cpu", "config": {"dtype": "int8", "prompts": "x", "max_new_tokens": 8},
              "methods": [{"label": m}], "machine": {}, "versions": {}}
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [header, *runs]))
    report = write_concurrency_report(path, tmp_path / "rep").read_text()
    rows = _table_rows(report, "## Burst, temperature 0")
    # plain at 2: 120 tokens / 6 s = 20.0; the method 120 / 2 s = 60.0, speedup 3.00x; latencies pooled over both
    # repeats: p50 of [.5, .5, 1, 1, 1.5, 1.5, 2, 2] = 1.25, p90 = 2.0; accepted 120 / 60 steps, 180 nodes / 60 steps
    assert rows == [
        ["1", f"`{PLAIN}`", "20.0", "1.00x", "1.00 / 1.00", "0.100", "1.00", "0.0", "–", "1"],
        ["1", f"`{SEQUENTIAL}`", "10.0", "0.50x", "1.00 / 1.00", "0.100", "1.00", "0.0", "100%", "1"],
        ["2", f"`{PLAIN}`", "20.0", "1.00x", "2.50 / 4.00", "0.250", "1.00", "0.0", "–", "2"],
        ["2", f"`{m}`", "60.0", "3.00x", "1.25 / 2.00", "0.125", "2.00", "3.0", "88%", "2"],
    ]
    ratios = _table_rows(report.split("vs one request after another", 1)[1], "### Burst, temperature 0")
    # over the repeats the sequential run has (repeat 0 only here): at 2, plain's 60 tokens / 2 s
    assert ratios == [["1", "20.0", "10.0", "2.00x"], ["2", "30.0", "10.0", "3.00x"]]
    assert (tmp_path / "rep" / PLOT).stat().st_size > 1000
    # `arborspec report` renders it (alone); the single-sequence report refuses it in one line
    with pytest.raises(ArborError, match="bench-batch"):
        write_report([path], tmp_path / "r2")
    from arborspec.cli import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["report", str(path), "--out", str(tmp_path / "r3")])
    assert result.exit_code == 0 and (tmp_path / "r3" / "report.md").read_text() == report


def test_interrupt_then_resume_runs_only_what_is_missing(tiny_dirs, int8_pair, full_run, tmp_path, monkeypatch):
    from arborspec.bench import batch_runner as bench

    cfg = dict(concurrency=[1, 2], arrivals=["burst"], sequential=False)
    calls = {"n": 0}
    real = bench._BatchRunner.run

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(bench._BatchRunner, "run", flaky)
    out = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt, match="finished runs kept in .*--resume"):  # Ctrl-C in the 4th run
        run_concurrency(_cfg(tiny_dirs, out, **cfg), pair=int8_pair, quiet=True)
    path = out / "results.jsonl"
    assert len(read_results(path)[1]) == 3 and (out / "report.md").is_file()
    with pytest.raises(ArborError, match="--resume"):
        run_concurrency(_cfg(tiny_dirs, out, **cfg), pair=int8_pair, quiet=True)
    calls["n"] = -100
    run_concurrency(_cfg(tiny_dirs, out, resume=True, **cfg), pair=int8_pair, quiet=True)
    assert calls["n"] == -100 + 3  # only the three runs missing
    keys = [CellKey.of(r) for r in read_results(path)[1]]
    want = {CellKey(0.0, c, "burst", 0, m) for c in (1, 2) for m in [PLAIN, *METHODS]}
    assert len(keys) == len(set(keys)) and set(keys) == want
    # a file cut mid-record (killed while writing) resumes cleanly, the cut run rerun
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][:25])
    run_concurrency(_cfg(tiny_dirs, out, resume=True, **cfg), pair=int8_pair, quiet=True)
    keys = [CellKey.of(r) for r in read_results(path)[1]]
    assert len(keys) == len(set(keys)) and set(keys) == want
    with pytest.raises(ArborError, match="max_new_tokens"):
        run_concurrency(_cfg(tiny_dirs, out, resume=True, max_new_tokens=5, **cfg), pair=int8_pair, quiet=True)


def test_ctrl_c_in_the_command_exits_in_one_line(tiny_dirs, tmp_path, monkeypatch):
    from arborspec.bench import batch_runner as bench
    from arborspec.cli import app
    from typer.testing import CliRunner

    def stop(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench._BatchRunner, "run", stop)
    out = tmp_path / "stopped"
    result = CliRunner().invoke(app, [
        "bench-batch", "--target", str(tiny_dirs / "target"), "--draft", str(tiny_dirs / "draft"), "--dtype", "int8",
        "--prompts", str(tiny_dirs / "prompts.jsonl"), "--concurrency", "1", "--arrival", "burst", "--warmup", "0",
        "-m", "dyspec:budget=2", "--out", str(out)])
    last = result.output.strip().splitlines()[-1]  # above it: transformers' loading bar, "no report written"
    assert result.exit_code == 130 and last.startswith("interrupted; finished runs kept in"), result.output
    assert last.endswith("rerun with --resume to continue") and (out / "results.jsonl").is_file()


@pytest.mark.parametrize("args,needle", [
    (["--concurrency", "0"], "--concurrency"),
    (["--concurrency", "1,x"], "--concurrency"),
    (["--concurrency", ","], "--concurrency"),
    (["--concurrency", "-2"], "--concurrency"),
    (["--arrival", "poisson"], "--arrival"),
    (["--sequential", "--concurrency", "2,4"], "--sequential"),
    (["--concurrency", "1,8"], "raise --num-prompts"),
    (["-m", "shared:max_nodes=0"], "max_nodes"),
    (["--temperatures", "0,hot"], "comma-separated"),
])
def test_bench_batch_options_fail_in_one_line_before_loading(tiny_dirs, tmp_path, args, needle):
    from arborspec.cli import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["bench-batch", "--target", "nowhere/no-such-model", "--prompts",
                                      str(tiny_dirs / "prompts.jsonl"), "--out", str(tmp_path / "x"), *args])
    assert result.exit_code == 2 and needle in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "x").exists()


def test_bench_batch_command_runs_on_tiny_models(tiny_dirs, tmp_path):
    from arborspec.cli import app
    from typer.testing import CliRunner

    out = tmp_path / "cli"
    result = CliRunner().invoke(app, [
        "bench-batch", "--target", str(tiny_dirs / "target"), "--draft", str(tiny_dirs / "draft"), "--dtype", "int8",
        "--prompts", str(tiny_dirs / "prompts.jsonl"), "--num-prompts", "2", "-n", "4", "--concurrency", "2",
        "--arrival", "staggered", "--warmup", "0", "--threads", "1", "-m", "dyspec:budget=2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    _, runs, _ = read_results(out / "results.jsonl")
    assert {r["method"] for r in runs} == {PLAIN, "dyspec:budget=2"}
    assert all(r["arrival"] == "staggered" and r["plain_step_s"] > 0 for r in runs)
    assert re.search(r"\| 2 \| `dyspec:budget=2` \| [0-9.]+ \| [0-9.]+x \|", (out / "report.md").read_text())
