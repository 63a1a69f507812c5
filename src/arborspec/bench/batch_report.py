"""The report of the concurrency benchmark: report.md (a table per temperature and arrival, plain
batched decoding against one request after another), concurrency.png and summary.json, from a
results file; `arborspec report` renders such a file alone."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..common.jsonfiles import write_json_atomic
from ..errors import ArborError
from .batch_config import ARRIVALS, BENCHMARK, PLAIN, SEQUENTIAL
from .batch_stats import CellSummary, run_figures, sequential_ratios, summarize_cells
from .report import _figure, _fmt, _no_data, _save, read_results, report_dir

REPORT_NAME = "report.md"
PLOT = "concurrency.png"
SUMMARY = "summary.json"


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
    out = report_dir(out_dir)
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
