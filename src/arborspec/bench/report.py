"""Re-render a benchmark report from saved results files, without running any model.

    write_report(["runs/bench/results.jsonl"], "runs/bench")   # -> runs/bench/report.md + *.png

The report holds one Spec-Bench-style Markdown table per temperature (rows =
method configs) and eight plots: accepted length vs tree budget (Sequoia Fig. 2,
OPT-Tree Fig. 6), speedup vs budget, accepted length vs temperature, the
builder's estimated accepted length vs the actual one (OPT-Tree Fig. 5),
acceptance rate vs draft probability (DySpec Fig. 2), the per-token time
split (DySpec Fig. 4), the tree sizes and the measured cost curve. When the
runs carry prompt categories (MT-Bench, Spec-Bench-style or user JSONL files),
each temperature also gets a table of speedup / accepted length per method x
category with the pooled figure last (`metrics.summarize_by_category`), and one
more plot: speedup per category. This module also owns reading the results format.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections import defaultdict
from pathlib import Path

from ..common.extras import require_plots
from ..common.jsonfiles import write_json_atomic
from ..errors import ArborError
from .metrics import (
    BASELINE,
    CategorySummary,
    MethodSummary,
    acceptance_by_draft_prob,
    estimated_vs_actual,
    summarize,
    summarize_by_category,
)

SCHEMA_VERSION = 1
HF_GENERATE = "hf-generate"
HF_ASSISTED = "hf-assisted"
PLOTS = (
    "accepted_length_vs_budget.png",
    "speedup_vs_budget.png",
    "accepted_length_vs_temperature.png",
    "estimated_vs_actual.png",
    "acceptance_vs_draft_prob.png",
    "time_split.png",
    "tree_sizes.png",
    "cost_curve.png",
)
CATEGORY_PLOT = "speedup_by_category.png"  # only when the runs carry prompt categories
SUMMARY = "summary.json"  # the report's figures without the per-step records


# ------------------------------------------------------------------------------------------ reading
def read_results(
    path: str | Path, allow_partial_tail: bool = True, allow_empty: bool = False
) -> tuple[dict, list[dict], list[str]]:
    """(header, run records, notes) of one results file; one-line ArborError on anything unusable.

    A half-written last line (the process was killed mid-write) is dropped when
    `allow_partial_tail`.
    """
    path = Path(path)
    if not path.is_file():
        raise ArborError(f"results file {str(path)!r} does not exist")
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    if not any(line.strip() for line in lines):
        raise ArborError(f"results file {str(path)!r} is empty: nothing to report")
    records = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if allow_partial_tail and lineno == len(lines):
                break
            raise ArborError(
                f"{path}:{lineno} is not valid JSON: not an arborspec results "
                "file (or a damaged one)"
            ) from None
    header = records[0]
    if not isinstance(header, dict) or header.get("kind") != "header":
        raise ArborError(
            f"{path} does not start with an arborspec header record: not a results file"
        )
    if header.get("schema") != SCHEMA_VERSION:
        raise ArborError(
            f"{path} uses results schema {header.get('schema')!r}, this arborspec reads schema "
            f"{SCHEMA_VERSION}: re-run the benchmark or use the arborspec version that wrote it"
        )
    runs = [r for r in records[1:] if isinstance(r, dict) and r.get("kind") == "run"]
    notes = list(header.get("notes", [])) + [
        r["text"] for r in records[1:] if isinstance(r, dict) and r.get("kind") == "note"
    ]
    if not runs and not allow_empty:
        raise ArborError(f"{path} holds a header but no finished runs: nothing to report")
    return header, runs, list(dict.fromkeys(notes))


def load_runs(paths: list[str | Path]) -> tuple[list[dict], list[dict], list[str]]:
    """Runs of several files; each run is tagged with `_file` so it is only compared with its
    own file's baseline."""
    if not paths:
        raise ArborError("give at least one results file")
    headers, runs, notes = [], [], []
    for i, path in enumerate(paths):
        header, file_runs, file_notes = read_results(path)
        if header.get("benchmark") == "concurrency":  # bench/batch_config.BENCHMARK
            raise ArborError(
                f"{path} holds `arborspec bench-batch` results: `arborspec report` renders it "
                "alone (bench/batch_report.write_concurrency_report)"
            )
        headers.append(header)
        notes += file_notes
        runs += [{**r, "_file": i} for r in file_runs]
    return headers, runs, list(dict.fromkeys(notes))


# ------------------------------------------------------------------------------------------- tables
def _fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def markdown_table(rows: list[MethodSummary]) -> str:
    head = [
        "method",
        "budget",
        "accepted length",
        "tree size",
        "depth",
        "est. / calibrated E[A]",
        "tokens/s",
        "ms/token",
        "speedup",
        "per-prompt speedup (min / median / max)",
        "draft / verify / build+other",
        "greedy identical",
        "runs",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in rows:
        spread = (
            f"{_fmt(s.speedup_min)} / {_fmt(s.speedup_median)} / {_fmt(s.speedup_max)}"
            if s.speedup_min is not None
            else "–"
        )
        split = (
            f"{s.draft_fraction:.0%} / {s.verify_fraction:.0%} / {s.build_other_fraction:.0%}"
            if s.draft_fraction is not None
            else "–"
        )
        cells = [
            f"`{s.method}`",
            _fmt(s.budget, "d"),
            _fmt(s.mean_accepted_length),
            _fmt(s.mean_tree_size, ".1f"),
            _fmt(s.mean_depth, ".1f"),
            f"{_fmt(s.mean_estimated_length)} / {_fmt(s.mean_calibrated_length)}",
            f"{s.tokens_per_second:.1f}",
            f"{s.latency_per_token_ms:.1f}",
            _fmt(s.speedup, ".2f", "x"),
            spread,
            split,
            _fmt(s.greedy_identity_rate, ".0%"),
            str(s.runs),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def category_table(groups: list[CategorySummary], temperature: float) -> str:
    """Rows = method configs (baseline left out), columns = categories then the pooled figure:
    `speedup / accepted length`."""
    groups = [g for g in groups if any(s.temperature == temperature for s in g.summaries)]
    cells = {
        (g.category, s.method): s
        for g in groups
        for s in g.summaries
        if s.temperature == temperature
    }
    methods = [
        s.method
        for s in groups[-1].summaries
        if s.temperature == temperature and s.method != BASELINE
    ]
    head = ["method"] + [f"{g.category} (n={g.prompts[temperature]})" for g in groups]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method in methods:
        row = [f"`{method}`"]
        for g in groups:
            s = cells.get((g.category, method))
            row.append(
                "–"
                if s is None
                else f"{_fmt(s.speedup, '.2f', 'x')} / {_fmt(s.mean_accepted_length)}"
            )
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _head_precision(value: str) -> str:
    """A header's draft-head precision as the report prints it (older files recorded "int8"
    / "float" logits)."""
    return f"{value} logits" if value in ("int8", "float") else value


def _describe_headers(headers: list[dict], paths: list[str | Path]) -> list[str]:
    lines = []
    for path, h in zip(paths, headers):
        c, m, v = h["config"], h.get("machine", {}), h.get("versions", {})
        lines.append(
            (
                f"* `{path}`: target `{h.get('target', c['target'])}`, draft "
                f"`{h.get('draft', c['draft'])}`"
            )
            + (f" ({_head_precision(h['draft_logits'])})" if h.get("draft_logits") else "")
            + f", prompts `{c['prompts']}` (n={c['num_prompts'] or 'all'}, "
            f"turns={c['turns'] or 'all'}), max_new_tokens {c['max_new_tokens']}, "
            f"{h.get('device')} {c['dtype']}"
            + (" (target decoder through torch.compile)" if c.get("compile") else "")
            + f", {m.get('cpu_count')} CPUs / {m.get('torch_threads')} threads, "
            f"{m.get('processor') or 'CPU model unknown'}, {m.get('platform', '')}; "
            + ", ".join(f"{k} {val}" for k, val in v.items())
            + f"; started {h.get('timestamp', '?')}"
        )
    return lines


# -------------------------------------------------------------------------------------------- plots
def _figure(n: int, max_cols: int = 3, width: float = 5.0):
    require_plots()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(n, max_cols)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return plt, fig, list(axes.flat[:n])


def _save(plt, fig, path: Path, outside_legend: bool = False) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight" if outside_legend else None)
    plt.close(fig)


def _no_data(ax, what: str) -> None:
    ax.text(
        0.5, 0.5, f"no {what} in these results", ha="center", va="center", transform=ax.transAxes
    )


def plot_vs_budget(summaries: list[MethodSummary], field: str, ylabel: str, path: Path) -> None:
    temps = sorted({s.temperature for s in summaries})
    plt, fig, axes = _figure(len(temps))
    for ax, t in zip(axes, temps):
        lines = defaultdict(list)
        for s in summaries:
            if s.temperature == t and s.budget is not None and getattr(s, field) is not None:
                lines[s.name].append((s.budget, getattr(s, field)))
        for name, pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        if lines:
            ax.set_xscale("log", base=2)
            ax.legend(fontsize=7)
        else:
            _no_data(ax, "tree methods")
        if field == "speedup":
            ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set(title=f"temperature {t:g}", xlabel="tree budget (draft nodes)", ylabel=ylabel)
    _save(plt, fig, path)


def plot_vs_temperature(summaries: list[MethodSummary], path: Path) -> None:
    budgets = sorted({s.budget for s in summaries if s.budget is not None}) or [None]
    plt, fig, axes = _figure(len(budgets))
    for ax, b in zip(axes, budgets):
        lines = defaultdict(list)
        for s in summaries:
            if s.budget == b and s.mean_accepted_length is not None and s.method != BASELINE:
                lines[s.method].append((s.temperature, s.mean_accepted_length))
        for method, pts in sorted(lines.items()):
            pts.sort()
            ax.plot(
                [p[0] for p in pts], [p[1] for p in pts], marker="o", label=method.split(":")[0]
            )
        if lines:
            ax.legend(fontsize=7)
        else:
            _no_data(ax, "tree methods")
        ax.set(
            title=f"budget {b}" if b is not None else "",
            xlabel="temperature",
            ylabel="accepted length / step",
        )
    _save(plt, fig, path)


def plot_estimated_vs_actual(runs: list[dict], path: Path) -> None:
    import numpy as np

    by_name = defaultdict(list)
    for r in runs:
        if r["method"] != BASELINE and r["steps"].get("estimated_length"):
            by_name[r.get("name", r["method"])].append(r)
    names = sorted(by_name) or ["-"]
    plt, fig, axes = _figure(len(names))
    for ax, name in zip(axes, names):
        est, act = estimated_vs_actual(by_name.get(name, []))
        if not est:
            _no_data(ax, "per-step estimates")
            continue
        top = max(max(est), max(act)) + 1
        h, xe, ye = np.histogram2d(
            est, act, bins=[np.linspace(1, top, 25), np.arange(0.5, int(top) + 1.5)]
        )
        # per estimated-length column: distribution of actual
        h = h / np.maximum(h.sum(axis=1, keepdims=True), 1)
        ax.pcolormesh(xe, ye, h.T, cmap="viridis", shading="auto")
        ax.plot([1, top], [1, top], color="white", lw=0.8, ls="--")
        for field, colour, label in (
            ("estimated_length", "white", "builder's estimate"),
            ("calibrated_length", "tab:red", "calibrated (online)"),
        ):
            e, a = estimated_vs_actual(by_name.get(name, []), field)
            if e:  # mean actual length per estimate bin
                idx = np.clip(np.digitize(e, xe), 1, len(xe) - 1)
                xs = [(xe[i - 1] + xe[i]) / 2 for i in sorted(set(idx))]
                ys = [
                    float(np.mean([a_ for i_, a_ in zip(idx, a) if i_ == i]))
                    for i in sorted(set(idx))
                ]
                ax.plot(xs, ys, color=colour, marker=".", lw=1, label=label)
        ax.legend(fontsize=6, loc="upper left")
        ax.set(title=name, xlabel="estimated E[accepted length]", ylabel="actual accepted length")
    _save(plt, fig, path)


def plot_acceptance_vs_prob(runs: list[dict], path: Path) -> None:
    temps = sorted({float(r["temperature"]) for r in runs})
    plt, fig, axes = _figure(len(temps))
    for ax, t in zip(axes, temps):
        by_name = defaultdict(list)
        for r in runs:
            if float(r["temperature"]) == t and any(r["steps"].get("examined_draft_probs", [])):
                by_name[r.get("name", r["method"])].append(r)
        for name, rs in sorted(by_name.items()):
            centres, rates, _ = acceptance_by_draft_prob(rs)
            pts = [(c, a) for c, a in zip(centres, rates) if a is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
        if by_name:
            ax.legend(fontsize=7)
        else:
            _no_data(ax, "examined draft tokens")
        ax.set(
            title=f"temperature {t:g}",
            xlabel="draft probability of the token",
            ylabel="acceptance rate",
            xlim=(0, 1),
            ylim=(0, 1.02),
        )
    _save(plt, fig, path)


def plot_time_split(summaries: list[MethodSummary], runs: list[dict], path: Path) -> None:
    temps = sorted({s.temperature for s in summaries})
    plt, fig, axes = _figure(len(temps))
    parts = (
        ("draft_time", "draft"),
        ("verify_time", "verify (target)"),
        ("build_time", "build"),
        ("other_time", "other"),
    )
    for ax, t in zip(axes, temps):
        groups = defaultdict(list)
        for r in runs:
            if float(r["temperature"]) == t and r["steps"].get("verify_time"):
                groups[r["method"]].append(r)
        labels = [s.method for s in summaries if s.temperature == t and s.method in groups]
        bottom = [0.0] * len(labels)
        for key, name in parts:
            ms = [
                1000
                * sum(sum(r["steps"][key]) for r in groups[m])
                / max(1, sum(r["new_tokens"] for r in groups[m]))
                for m in labels
            ]
            ax.bar(range(len(labels)), ms, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, ms)]
        ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=6)
        ax.set(title=f"temperature {t:g}", ylabel="ms per generated token")
        ax.legend(fontsize=7)
    _save(plt, fig, path)


def plot_tree_sizes(summaries: list[MethodSummary], runs: list[dict], path: Path) -> None:
    """How many draft nodes each method verified per step (a fixed budget is one bar;
    budget=auto a spread)."""
    temps = sorted({s.temperature for s in summaries})
    plt, fig, axes = _figure(len(temps))
    for ax, t in zip(axes, temps):
        sizes = defaultdict(list)
        for r in runs:
            if float(r["temperature"]) == t and r["steps"].get("tree_size"):
                sizes[r["method"]] += r["steps"]["tree_size"]
        labels = [s.method for s in summaries if s.temperature == t and s.method in sizes]
        if labels:
            ax.boxplot([sizes[m] for m in labels], whis=(5, 95), showfliers=False)
            ax.set_xticks(range(1, len(labels) + 1), labels, rotation=60, ha="right", fontsize=6)
        else:
            _no_data(ax, "tree steps")
        ax.set(title=f"temperature {t:g}", ylabel="draft nodes per step (5-95 %)")
    _save(plt, fig, path)


def plot_cost_curve(headers: list[dict], paths: list[str | Path], path: Path) -> None:
    """The measured t(n)/t(1) of each results file (what budget=auto divided by)."""
    plt, fig, axes = _figure(1)
    ax = axes[0]
    curves = [(p, h["cost_curve"]) for p, h in zip(paths, headers) if h.get("cost_curve")]
    for p, c in curves:
        ax.plot(
            c["tokens"],
            c["relative"],
            marker="o",
            label=(
                f"{Path(p).parent.name or p}: t(1) = {1000 * c['one_token_s']:.1f} ms, draft "
                f"{c['draft_cost']:.3f}"
            ),
        )
    if curves:
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
    else:
        _no_data(ax, "cost curve")
    ax.set(
        xlabel="rows in the target forward (tree nodes + root)",
        ylabel="t(n) / t(1)",
        title="measured cost curve",
    )
    _save(plt, fig, path)


def plot_speedup_by_category(groups: list[CategorySummary], path: Path) -> None:
    """Grouped bars, one panel per temperature: one group per category (the pooled one last),
    one bar per method."""
    temps = sorted({s.temperature for s in groups[-1].summaries})
    widest = max(len({s.method for s in groups[-1].summaries if s.temperature == t}) for t in temps)
    plt, fig, axes = _figure(
        len(temps), max_cols=1, width=max(6.0, 0.12 * len(groups) * widest + 2)
    )
    for ax, t in zip(axes, temps):
        shown = [g for g in groups if g.prompts.get(t)]
        speedup = {
            (g.category, s.method): s.speedup
            for g in shown
            for s in g.summaries
            if s.temperature == t
        }
        methods = [
            s.method for s in groups[-1].summaries if s.temperature == t and s.method != BASELINE
        ]
        bar = 0.8 / max(1, len(methods))
        colours = plt.get_cmap("tab20" if len(methods) <= 20 else "turbo")
        for i, method in enumerate(methods):
            heights = [speedup.get((g.category, method)) or 0.0 for g in shown]
            ax.bar(
                [x + (i - (len(methods) - 1) / 2) * bar for x in range(len(shown))],
                heights,
                bar,
                label=method,
                color=colours(i if len(methods) <= 20 else i / max(1, len(methods) - 1)),
            )
        ax.set_xticks(
            range(len(shown)), [f"{g.category}\n(n={g.prompts[t]})" for g in shown], fontsize=7
        )
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        if methods:
            ax.legend(
                fontsize=6,
                ncol=1 + len(methods) // 18,
                loc="upper left",
                bbox_to_anchor=(1.01, 1.0),
            )
        else:
            _no_data(ax, "methods besides the baseline")
        ax.set(title=f"temperature {t:g}", ylabel="speedup vs autoregressive")
    _save(plt, fig, path, outside_legend=True)


# what budget=auto learnt (engine/cost.CostCurve.with_overhead_of), as the report words each
LEARNT_COSTS = (
    (
        "step_overhead",
        "Step overhead each `budget=auto` method sized its trees with, learnt from its decoder's "
        "previous generation (time per step outside the timed forwards / t(1); median and range "
        "over its recorded runs; docs/algorithms.md §7)",
    ),
    (
        "draft_overhead",
        "Per draft forward, the step time it added beyond the timed draft forward, learnt the same "
        "way (drawing children, bookkeeping; / t(1))",
    ),
    (
        "token_cost",
        "Per committed token, the step time it added (the verifier's LM-head row for it, cache "
        "compaction, the draft catching up; / t(1)), learnt the same way",
    ),
)


def step_overheads(runs: list[dict], field: str = "step_overhead") -> dict[str, list[float]]:
    """Per method label, what its recorded runs were sized with (`step_overhead`, or a learnt slope:
    `draft_overhead`, `token_cost`; `LEARNT_COSTS`), in run order (each learnt from the decoder's
    previous generation)."""
    out: dict[str, list[float]] = {}
    for r in runs:
        value = (r.get("config") or {}).get(field)
        if value is not None:
            out.setdefault(r["method"], []).append(float(value))
    return out


# ------------------------------------------------------------------------------------------- report
def report_dir(out_dir: str | Path) -> Path:
    """The report's folder, created (one-line error where it cannot be)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArborError(
            f"cannot create report dir {str(out)!r} ({exc.strerror or exc}): choose another --out"
        ) from None
    return out


def write_report(results_paths: list[str | Path], out_dir: str | Path) -> Path:
    """Tables + plots from saved results; returns the path of `report.md`."""
    headers, runs, notes = load_runs(list(results_paths))
    out = report_dir(out_dir)
    summaries = summarize(runs)
    plot_vs_budget(summaries, "mean_accepted_length", "accepted length / step", out / PLOTS[0])
    plot_vs_budget(summaries, "speedup", "speedup vs autoregressive", out / PLOTS[1])
    plot_vs_temperature(summaries, out / PLOTS[2])
    plot_estimated_vs_actual(runs, out / PLOTS[3])
    plot_acceptance_vs_prob(runs, out / PLOTS[4])
    plot_time_split(summaries, runs, out / PLOTS[5])
    plot_tree_sizes(summaries, runs, out / PLOTS[6])
    plot_cost_curve(headers, list(results_paths), out / PLOTS[7])
    groups = summarize_by_category(runs)
    plots = list(PLOTS)
    if groups:
        plot_speedup_by_category(groups, out / CATEGORY_PLOT)
        plots.append(CATEGORY_PLOT)
    lines = [
        "# arborspec benchmark",
        "",
        *_describe_headers(headers, list(results_paths)),
        "",
        "Accepted length = tokens committed per target forward, bonus included; tree size = "
        "draft nodes verified per step (root excluded); speedup = total baseline seconds per "
        "token / total method seconds per token over the same runs (prefill included); time "
        "split = share of per-step time.",
        "",
    ]
    for t in sorted({s.temperature for s in summaries}):
        lines += [
            f"## Temperature {t:g}",
            "",
            markdown_table([s for s in summaries if s.temperature == t]),
            "",
        ]
        if groups:
            lines += [
                f"### By prompt category (temperature {t:g})",
                "",
                "speedup / accepted length, computed as above over each category's prompts only; "
                f"`{groups[-1].category}` = the pooled figures of the table above.",
                "",
                category_table(groups, t),
                "",
            ]
    curves = [(p, h["cost_curve"]) for p, h in zip(results_paths, headers) if h.get("cost_curve")]
    if curves:
        lines += [
            "## Cost curve",
            "",
            "t(n)/t(1): one target forward over n rows relative to one row, measured at the "
            "start of the run; draft = one draft forward / t(1).",
            "",
        ]
        for p, c in curves:
            pts = ", ".join(f"{n}: {r:.2f}" for n, r in zip(c["tokens"], c["relative"]))
            lines.append(
                f"* `{p}`: t(1) = {1000 * c['one_token_s']:.1f} ms; {pts}; draft "
                f"{c['draft_cost']:.3f}"
            )
        for field, what in LEARNT_COSTS:
            learnt = step_overheads(runs, field)
            if learnt:
                lines += [
                    "",
                    what
                    + ": "
                    + ", ".join(
                        f"`{m}` {statistics.median(o):.3f} ({min(o):.3f}-{max(o):.3f})"
                        for m, o in learnt.items()
                    )
                    + ".",
                ]
        lines.append("")
    lines += lookup_lines(runs)
    if notes:
        lines += ["## Notes", "", *[f"* {n}" for n in notes], ""]
    lines += ["## Plots", "", *[f"![{p[:-4]}]({p})" for p in plots], ""]
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    write_json_atomic(summary_json(headers, summaries, groups), out / SUMMARY, indent=1)
    return path


def summary_json(
    headers: list[dict], summaries: list[MethodSummary], groups: list[CategorySummary]
) -> dict:
    """Every figure of the report's tables, and the runs' settings and cost curves: what a results
    folder keeps when the per-step records (results.jsonl) are left out."""
    return {
        "runs": [
            {"config": h.get("config", {}), "cost_curve": h.get("cost_curve")} for h in headers
        ],
        "methods": [dataclasses.asdict(s) for s in summaries],
        "categories": [
            {
                "category": g.category,
                "prompts": {str(t): n for t, n in g.prompts.items()},
                "methods": [dataclasses.asdict(s) for s in g.summaries],
            }
            for g in groups
        ],
    }


def lookup_lines(runs: list[dict]) -> list[str]:
    """The report's context-lookup section (docs/algorithms.md §9): per method and temperature that
    grafted anything, grafted nodes per step and the share of committed tokens that
    were grafted nodes."""
    totals: dict[tuple[str, float], list[int]] = {}
    for r in runs:
        grafted = r.get("steps", {}).get("lookup_nodes", [])
        if sum(grafted):
            t = totals.setdefault((r["method"], float(r["temperature"])), [0, 0, 0, 0])
            t[0] += sum(grafted)
            t[1] += len(grafted)
            t[2] += sum(r["steps"].get("lookup_accepted", []))
            t[3] += r["new_tokens"]
    if not totals:
        return []
    return [
        "## Context lookup",
        "",
        "Nodes copied from earlier in the context and grafted onto each tree (docs/algorithms.md "
        "§9; part of the tree size above), and the accepted tokens that were such nodes.",
        "",
        (
            "| method | temperature | grafted nodes per step | grafted tokens accepted per step | "
            "share of new tokens |"
        ),
        "|---|---|---|---|---|",
        *[
            f"| `{m}` | {t:g} | {g / n:.2f} | {a / n:.2f} | {a / max(tok, 1):.1%} |"
            for (m, t), (g, n, a, tok) in sorted(totals.items())
        ],
        "",
    ]
