"""Per-step statistics of a bench results file, by method x temperature, as a markdown table.

    .venv/bin/python benchmarks/step_stats.py benchmarks/int8-head-mtbench-t0/results.jsonl
    git show 0e02a54:benchmarks/estimate-ngram/results.jsonl > /tmp/r.jsonl && \\
        .venv/bin/python benchmarks/step_stats.py /tmp/r.jsonl --label "estimate-ngram at 0e02a54"

For every (method, temperature) of a results file written by `arborspec bench`, over all its runs' speculative
steps (a step = one target forward):

* `steps` and the mean accepted length (tokens committed per step, bonus included);
* `step ms`: wall time per step (the runs' wall time over their steps, prefill included); `verify ms/step`: the
  target's tree forward and its screened rows per step;
* `draft fw/step`: draft forwards per step; `build ms/step`: time spent building the tree per step (the
  `build_time` the engine records, which excludes the draft forwards' own `draft_time`); `draft ms/step`;
* `verify ms/node`: the least-squares slope of a step's verification time (target forward + screened rows) on its
  tree size, over all its steps (needs two tree sizes: `budget=auto`, or lookup grafts), beside `curve ms/node`,
  what the file's timed cost curve says a node adds (t(9) - t(1) over 8 nodes);
* `calibrated / actual` for the generation's steps 0-9, 10-29 and 30 on: the sum of the calibrated E[accepted
  length] (docs/algorithms.md §6) over those steps divided by the sum of the accepted lengths, in per cent
  off (`+138 %` = estimated 2.38x what was accepted); the same for the builder's own `estimated_length`.

Plain decoding rows (no tree) are left out. The numbers are read from the file, never timed here, so they
describe the machine and load the file was written under (its header says which commit's code and when).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from arborspec.bench.report import read_results
from arborspec.engine.cost import CostCurve
from arborspec.errors import ArborError

BUCKETS = ((0, 10, "0-9"), (10, 30, "10-29"), (30, None, "30+"))


def _ratio(estimated: float, actual: float) -> str:
    return "–" if actual <= 0 else f"{100 * (estimated / actual - 1):+.0f} %"


def curve_ms_per_node(header: dict) -> float | None:
    """What the results file's cost curve says a node adds to a step, in ms: (t(9) - t(1)) / 8 (`CostCurve.t`)."""
    if not header.get("cost_curve"):
        return None
    curve = CostCurve(**{k: tuple(v) if isinstance(v, list) else v for k, v in header["cost_curve"].items()})
    return 1000 * curve.one_token_s * (curve.t(9) - 1.0) / 8


def step_rows(runs: list[dict]) -> list[dict]:
    """One dict per (method, temperature) with the aggregated step statistics, in first-seen order."""
    groups: dict[tuple[str, float], list[dict]] = defaultdict(list)
    walls: dict[tuple[str, float], float] = defaultdict(float)
    for run in runs:
        steps = run.get("steps") or {}
        if not steps or not any(steps.get("tree_size", [])):
            continue  # plain decoding and HF baselines: no tree
        groups[(run["method"], run["temperature"])].append(steps)
        walls[(run["method"], run["temperature"])] += run["wall_time"]
    rows = []
    for (method, temperature), all_steps in groups.items():
        n = sum(len(s["accepted_length"]) for s in all_steps)
        total = lambda field: sum(sum(s.get(field) or [0.0]) for s in all_steps)  # noqa: E731
        row = {"method": method, "temperature": temperature, "steps": n,
               "accepted": total("accepted_length") / n,
               "step_ms": 1000 * walls[(method, temperature)] / n,
               "verify_ms": 1000 * total("verify_time") / n,
               "draft_forwards": total("draft_forwards") / n,
               "build_ms": 1000 * total("build_time") / n,
               "draft_ms": 1000 * total("draft_time") / n}
        sizes = [x for s in all_steps for x in s["tree_size"]]
        verify = [1000 * x for s in all_steps for x in s["verify_time"]]
        row["verify_ms_per_node"] = statistics.linear_regression(sizes, verify).slope if len(set(sizes)) > 1 else None
        for lo, hi, name in BUCKETS:
            acc = cal = est = 0.0
            for s in all_steps:
                part = slice(lo, hi)
                acc += sum(s["accepted_length"][part])
                cal += sum(s.get("calibrated_length", [])[part])
                est += sum(s.get("estimated_length", [])[part])
            row[f"calibrated {name}"] = _ratio(cal, acc) if cal > 0 else "–"
            row[f"estimated {name}"] = _ratio(est, acc)
        rows.append(row)
    return rows


def markdown(rows: list[dict], label: str, header: dict) -> str:
    cfg = header.get("config", {})
    lines = [f"## {label}", "",
             f"target {cfg.get('target')}, draft {cfg.get('draft')}, dtype {cfg.get('dtype')}, "
             f"{cfg.get('num_prompts')} prompts x {cfg.get('max_new_tokens')} tokens, written {header.get('timestamp')}",
             "",
             "| method | T | steps | accepted | step ms | verify ms/step | draft fw/step | build ms/step | "
             "draft ms/step | verify ms/node | curve ms/node | "
             + " | ".join(f"calibrated / actual, steps {b[2]}" for b in BUCKETS) + " | "
             + " | ".join(f"estimated / actual, steps {b[2]}" for b in BUCKETS) + " |",
             "|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * (2 * len(BUCKETS))]
    curve = curve_ms_per_node(header)
    for r in rows:
        lines.append(f"| `{r['method']}` | {r['temperature']:g} | {r['steps']} | {r['accepted']:.2f} | "
                     f"{r['step_ms']:.1f} | {r['verify_ms']:.1f} | {r['draft_forwards']:.2f} | {r['build_ms']:.1f} | {r['draft_ms']:.1f} | "
                     + ("–" if r["verify_ms_per_node"] is None else f"{r['verify_ms_per_node']:.2f}") + " | "
                     + ("–" if curve is None else f"{curve:.2f}") + " | "
                     + " | ".join(r[f"calibrated {b[2]}"] for b in BUCKETS) + " | "
                     + " | ".join(r[f"estimated {b[2]}"] for b in BUCKETS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a results.jsonl written by `arborspec bench`")
    parser.add_argument("--label", default=None, help="heading of the table (default: the file's path)")
    args = parser.parse_args(argv)
    try:
        header, runs, _ = read_results(args.results)
    except ArborError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = step_rows(runs)
    if not rows:
        print(f"error: {args.results} holds no speculative runs (only plain decoding?)", file=sys.stderr)
        return 2
    print(markdown(rows, args.label or str(args.results), header), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
