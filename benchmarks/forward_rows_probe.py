"""Where a tree forward's extra time goes on the int8 target: one row against nine, by operator.

    .venv/bin/python benchmarks/forward_rows_probe.py --out benchmarks/forward-rows-probe-s17.json

Over a cache of `--cache` random tokens, the same loaded target runs, interleaved: a one-token forward and a tree
forward of nine rows (a chain; the tree mask then equals the causal one), medians over `--reps` each, then one
`torch.profiler` pass per kind (self CPU time per operator, per forward). Beside it: the float64 attention kernel
alone (`engine/invariant_attention.py`'s call, 9 query heads over 3 KV heads, hot caches) for one and nine query
rows, and in float32 for comparison (not batch-invariant: docs/algorithms.md §8), and the greedy screen of one
LM-head row (`engine/lm_head.GreedyScreen.argmax`) with its outlier gather. Timings of one process on this
machine: read them as shares and ratios.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from arborspec.common.jsonfiles import report_json
from arborspec.common.provenance import machine_info, utc_timestamp, versions
from arborspec.common.timing import median_seconds
from arborspec.engine.tree import TokenTree
from arborspec.models import load_pair


def median_us(fn, reps: int, warmup: int = 0) -> float:
    return round(median_seconds(fn, reps, warmup=warmup) * 1e6, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=int, default=300)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target = load_pair("embedded", "ngram", dtype="int8").target
    target.reset()
    target.hidden_forward(torch.randint(100, 20000, (a.cache,), generator=torch.Generator().manual_seed(0)))
    chain = TokenTree.from_root(5, "selected")
    parent = 0
    for i in range(8):
        parent = chain.add(parent, 100 + i, 0.5)
    def forward(rows: int) -> None:  # one forward, then the cache cropped back (a view: microseconds)
        if rows == 1:
            target.hidden_forward(torch.tensor([7]))
        else:
            target.tree_forward(chain, lazy=True)
        target.crop_to(a.cache)

    kinds = {"1 row": lambda: forward(1), "9 rows": lambda: forward(9)}
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    for round_ in range(3):  # interleaved rounds, the first after a warm-up forward of each kind
        for k, fn in kinds.items():
            wall[k].append(median_us(fn, a.reps, warmup=int(round_ == 0)))
    ops = {}
    for k, fn in kinds.items():
        per = defaultdict(float)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(a.reps):
                fn()
        for e in prof.key_averages():
            per[e.key] += e.self_cpu_time_total / a.reps
        ops[k] = per
    top = sorted(set(ops["1 row"]) | set(ops["9 rows"]), key=lambda key: -ops["9 rows"].get(key, 0.0))[:12]

    attention = {}
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(1, 3, a.cache + 9, 64, dtype=torch.float64, generator=gen)
    v = torch.randn(1, 3, a.cache + 9, 64, dtype=torch.float64, generator=gen)
    for rows in (1, 9):
        q = torch.randn(1, 9, rows, 64, dtype=torch.float64, generator=gen)
        for name, (qq, kk, vv) in {"float64": (q, k, v), "float32": (q.float(), k.float(), v.float())}.items():
            call = lambda: F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True)  # noqa: E731
            attention[f"{name}, {rows} query rows"] = median_us(call, 10 * a.reps, warmup=20)

    screen = target.head.screen
    hidden = target.hidden_forward(torch.tensor([7]))[-1:].float()
    target.crop_to(a.cache)
    keep = hidden[0].abs().topk(screen.OUTLIERS).indices
    screen_us = {"argmax of one row": median_us(lambda: screen.argmax(hidden), 10 * a.reps),
                 "outlier rows by advanced indexing (weight_t[keep])": median_us(lambda: screen.weight_t[keep], 10 * a.reps),
                 "outlier rows by index_select": median_us(lambda: screen.weight_t.index_select(0, keep), 10 * a.reps)}

    result = {"created": utc_timestamp(), "machine": machine_info(), "versions": versions(), "args": vars(a),
              "forward_us_median_per_round": wall,
              "forward_ratio_9_to_1": round(min(wall["9 rows"]) / min(wall["1 row"]), 3),
              "profiled_self_cpu_us_per_forward": {key: {kk: round(ops[kk].get(key, 0.0), 1) for kk in kinds}
                                                   for key in top},
              "profiled_total_us_per_forward": {kk: round(sum(ops[kk].values()), 1) for kk in kinds},
              "attention_kernel_us": attention, "greedy_screen_us": screen_us}
    report_json(result, a.out)


if __name__ == "__main__":
    main()
