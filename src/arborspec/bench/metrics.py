"""Benchmark figures from results records: pure functions, no models, no files.

Conventions (docs/algorithms.md §1): *accepted length* counts the tokens committed
per target forward **including the bonus token**; *tree size* counts draft
nodes, root excluded. Speedup is a ratio of **totals**:

    speedup = (sum of baseline seconds / sum of baseline tokens)
            / (sum of method seconds   / sum of method tokens)

over the runs both have (same prompt, turn, temperature, seed, repeat) —
never the mean of per-prompt ratios, which over-weights short answers. The
per-prompt ratios are reported only as a spread (min / median / max).
`summarize_by_category` applies the same `summarize` to the runs of each prompt
category (Spec-Bench-style sets, MT-Bench's eight), so a category's speedup is
the same ratio of totals over that category's prompts only.

A record is one `kind == "run"` line of a results file (see `bench/run.py`); its
`steps` field holds per-step columns (`accepted_length`, `tree_size`, ...).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass

BASELINE = "autoregressive"


@dataclass
class MethodSummary:
    method: str  # the config label, e.g. "dyspec:budget=16"
    name: str  # the builder name, e.g. "dyspec"
    budget: int | None
    temperature: float
    runs: int
    new_tokens: int
    steps: int  # target forwards (speculative steps); 0 when the method reports none (transformers)
    wall_time: float  # seconds, summed over runs
    mean_accepted_length: float | None  # tokens per step, bonus included
    accepted_histogram: dict[int, int]  # accepted length -> number of steps
    mean_tree_size: float | None  # draft nodes verified per step
    total_candidate_tokens: int  # sum of tree sizes: target positions spent on draft tokens
    mean_depth: float | None
    mean_estimated_length: float | None  # the builder's own E[accepted length], per step
    # the same under the online acceptance model (engine/acceptance.py)
    mean_calibrated_length: float | None
    tokens_per_second: float
    latency_per_token_ms: float
    speedup: float | None  # ratio of totals vs the baseline on the same runs
    speedup_min: float | None
    speedup_median: float | None
    speedup_max: float | None
    draft_fraction: float | None  # of step time
    verify_fraction: float | None
    build_other_fraction: float | None
    greedy_identity_rate: float | None  # share of greedy runs whose tokens equal the baseline's


def pair_key(record: dict) -> tuple:
    """Which baseline run a record is compared with: same file, prompt, turn,
    temperature, seed and repeat."""
    return (
        record.get("_file", 0),
        record["prompt_index"],
        record["turn"],
        float(record["temperature"]),
        record["seed"],
        record["repeat"],
    )


def seconds_per_token(records: list[dict]) -> float | None:
    tokens = sum(r["new_tokens"] for r in records)
    return sum(r["wall_time"] for r in records) / tokens if tokens else None


def speedup_vs_baseline(
    method_runs: list[dict], baseline_runs: list[dict]
) -> tuple[float | None, list[float]]:
    """(ratio of total seconds per token, per-run ratios), over the runs both sides have."""
    base = {pair_key(r): r for r in baseline_runs}
    matched = [(base[pair_key(r)], r) for r in method_runs if pair_key(r) in base]
    matched = [
        (b, m) for b, m in matched if b["new_tokens"] and m["new_tokens"] and m["wall_time"] > 0
    ]
    if not matched:
        return None, []
    spt_base = seconds_per_token([b for b, _ in matched])
    spt_method = seconds_per_token([m for _, m in matched])
    per_run = [
        (b["wall_time"] / b["new_tokens"]) / (m["wall_time"] / m["new_tokens"]) for b, m in matched
    ]
    return spt_base / spt_method, per_run


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _column(runs: list[dict], name: str) -> list:
    return [v for r in runs for v in r["steps"].get(name, [])]


def summarize_method(runs: list[dict], baseline_runs: list[dict]) -> MethodSummary:
    """Aggregate the runs of one (method config, temperature)."""
    first = runs[0]
    tokens = sum(r["new_tokens"] for r in runs)
    wall = sum(r["wall_time"] for r in runs)
    accepted = _column(runs, "accepted_length")
    sizes = _column(runs, "tree_size")
    times = {
        k: sum(_column(runs, k)) for k in ("draft_time", "build_time", "verify_time", "other_time")
    }
    step_time = sum(times.values())
    speedup, per_run = speedup_vs_baseline(runs, baseline_runs)
    greedy = [r["same_as_baseline"] for r in runs if r.get("same_as_baseline") is not None]
    frac = (lambda x: x / step_time) if step_time > 0 else (lambda x: None)
    return MethodSummary(
        method=first["method"],
        name=first.get("name", first["method"].split(":")[0]),
        budget=first.get("budget"),
        temperature=float(first["temperature"]),
        runs=len(runs),
        new_tokens=tokens,
        steps=len(accepted),
        wall_time=wall,
        mean_accepted_length=sum(accepted) / len(accepted) if accepted else None,
        accepted_histogram=dict(sorted(Counter(accepted).items())),
        mean_tree_size=_mean(sizes),
        total_candidate_tokens=sum(sizes),
        mean_depth=_mean(_column(runs, "tree_depth")),
        mean_estimated_length=None
        if first["method"] == BASELINE
        else _mean(_column(runs, "estimated_length")),
        mean_calibrated_length=None
        if first["method"] == BASELINE
        else _mean(_column(runs, "calibrated_length")),
        tokens_per_second=tokens / wall if wall > 0 else 0.0,
        latency_per_token_ms=1000 * wall / tokens if tokens else 0.0,
        speedup=speedup,
        speedup_min=min(per_run) if per_run else None,
        speedup_median=statistics.median(per_run) if per_run else None,
        speedup_max=max(per_run) if per_run else None,
        draft_fraction=frac(times["draft_time"]),
        verify_fraction=frac(times["verify_time"]),
        build_other_fraction=frac(times["build_time"] + times["other_time"]),
        greedy_identity_rate=sum(greedy) / len(greedy) if greedy else None,
    )


def summarize(records: list[dict]) -> list[MethodSummary]:
    """One summary per (method config, temperature), baseline first, in first-seen order."""
    groups: dict[tuple[str, float], list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["method"], float(r["temperature"]))].append(r)
    out = []
    for (_method, temperature), runs in groups.items():
        out.append(summarize_method(runs, groups.get((BASELINE, temperature), [])))
    return sorted(out, key=lambda s: (s.temperature, s.method != BASELINE))


UNCATEGORISED = "(none)"  # runs without a category, when others have one (mixed results files)
POOLED = "all"


@dataclass
class CategorySummary:
    """`summarize` over the runs of one prompt category (or of all of them:
    `category == POOLED`)."""

    category: str
    prompts: dict[float, int]  # temperature -> distinct prompts of the category run at it
    # one per (method config, temperature), as `summarize` returns them
    summaries: list[MethodSummary]


def run_category(record: dict) -> str:
    return str(record.get("category") or "")


def categories(records: list[dict]) -> list[str]:
    """The prompt categories of the runs, first seen first; [] when no run carries one."""
    seen = list(dict.fromkeys(run_category(r) for r in records))
    return [c or UNCATEGORISED for c in seen] if any(seen) else []


def _prompts(records: list[dict]) -> dict[float, int]:
    seen = {(float(r["temperature"]), r.get("_file", 0), r["prompt_index"]) for r in records}
    return dict(sorted(Counter(t for t, *_ in seen).items()))


def summarize_by_category(records: list[dict]) -> list[CategorySummary]:
    """One `CategorySummary` per category (first seen first), then the pooled one; []
    without categories."""
    out = []
    for category in categories(records):
        wanted = "" if category == UNCATEGORISED else category
        runs = [r for r in records if run_category(r) == wanted]
        out.append(CategorySummary(category, _prompts(runs), summarize(runs)))
    return (out + [CategorySummary(POOLED, _prompts(records), summarize(records))]) if out else []


def acceptance_by_draft_prob(
    records: list[dict], bins: int = 10
) -> tuple[list[float], list[float | None], list[int]]:
    """Acceptance rate of examined children, binned by their draft probability (DySpec Fig. 2).

    Returns (bin centres, acceptance rate per bin or None when empty, children per bin).
    """
    hits, counts = [0] * bins, [0] * bins
    for r in records:
        for probs, flags in zip(
            r["steps"].get("examined_draft_probs", []), r["steps"].get("examined_accepted", [])
        ):
            for p, ok in zip(probs, flags):
                b = min(int(p * bins), bins - 1)
                counts[b] += 1
                hits[b] += int(ok)
    centres = [(i + 0.5) / bins for i in range(bins)]
    return centres, [h / c if c else None for h, c in zip(hits, counts)], counts


def estimated_vs_actual(
    records: list[dict], field: str = "estimated_length"
) -> tuple[list[float], list[int]]:
    """Per step: (an estimated accepted length, the actual one) — OPT-Tree Fig. 5. `field`: the
    builder's own estimate, or "calibrated_length" (the online acceptance model's; absent
    in older results)."""
    est, act = [], []
    for r in records:
        values = r["steps"].get(field, [])
        if len(values) == len(r["steps"].get("accepted_length", [])):
            est += values
            act += r["steps"]["accepted_length"]
    return est, act
