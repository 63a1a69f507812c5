"""The figures of the concurrency benchmark from its records: pure functions, no models, no files.

A run's speedup is its tokens/s over plain batched tokens/s of the same (temperature,
concurrency, arrival, repeat); at temperature 0 its outputs are compared, request by request, with
plain batched decoding's (on the batch-invariant int8 target they must all be equal). Both are
derived from the records (a method may run before plain in its cell): per run (`run_figures`) and
per (temperature, arrival, concurrency, method) over its repeats (`summarize_cells`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from .batch_config import ARRIVALS, PLAIN, SEQUENTIAL


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
