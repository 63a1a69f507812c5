"""What the padded-rows cache layout of batched decoding costs, on the embedded int8 target
(docs/algorithms.md §10), interleaved in one process.

    .venv/bin/python benchmarks/tools/batch_layout.py --out benchmarks/results/batch-layout.json

Three comparisons, each the median of `--repeats` interleaved rounds of verifying forwards
(`engine/batch_target.BatchTarget`, screened argmax of every root), chains of N - 1 nodes per request:

* `holes`: 8 requests of 256 cached tokens each against 8 requests of 32, 64, ..., 256 (the cache as wide,
  every shorter row's columns past its length masked holes), N = 1 and 4: what holes cost, i.e. what
  repacking rows of different lengths could save at most;
* `padding`: 4 requests whose trees have 1, 1, 1 and 8 rows against 4 requests of 3 rows each (about the
  same 11 real rows): what uneven trees cost (packed into one row on the int8 target, the long
  tree's attention in a call of its own, engine/packed_rows.py);
* `batching`: 8 requests of N = 4 rows in one forward against the same 8 forwards one request at a time
  (a batch of one each): what the layout buys.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from arborspec.common.timing import clock
from arborspec.engine.batch_target import BatchTarget
from arborspec.engine.cost import random_context
from arborspec.engine.lm_head import screen_rows
from arborspec.engine.tree import TokenTree
from arborspec.models import load_pair


def chain(root: int, tokens: list[int], rows: int) -> TokenTree:
    tree = TokenTree.from_root(root)
    for d in range(rows - 1):
        tree.add(d, tokens[d])
    return tree


def batch_of(adapter, lengths: list[int], seed: int = 0) -> tuple[BatchTarget, list[list[int]]]:
    target = BatchTarget(adapter)
    contexts = []
    for k, n in enumerate(lengths):
        ids = random_context(adapter.vocab_size, n + 1, seed + k)
        target.join(k, ids)
        contexts.append(ids)
    return target, contexts


def timed_forward(target: BatchTarget, contexts, widths: list[int]) -> float:
    trees = {k: chain(ids[-1], ids, w) for k, (ids, w) in enumerate(zip(contexts, widths))}
    t0 = clock()
    logits, _, at = target.verify_forward(trees)
    screen_rows([(logits[k], 0) for k in trees])
    seconds = clock() - t0
    target.keep({k: [] for k in trees}, at)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(dtype="int8")
    adapter = pair.target

    even, even_ids = batch_of(adapter, [256] * 8)
    uneven, uneven_ids = batch_of(adapter, [32 * (k + 1) for k in range(8)], seed=100)
    skewed, skewed_ids = batch_of(adapter, [128] * 4, seed=200)
    singles = [batch_of(adapter, [128], seed=300 + k) for k in range(8)]
    together, together_ids = batch_of(adapter, [128] * 8, seed=300)
    cases = {
        "holes: 8 x 256 tokens, N=1": lambda: timed_forward(even, even_ids, [1] * 8),
        "holes: 8 x 32..256 tokens, N=1": lambda: timed_forward(uneven, uneven_ids, [1] * 8),
        "holes: 8 x 256 tokens, N=4": lambda: timed_forward(even, even_ids, [4] * 8),
        "holes: 8 x 32..256 tokens, N=4": lambda: timed_forward(uneven, uneven_ids, [4] * 8),
        "padding: trees of 1, 1, 1, 8 rows": lambda: timed_forward(skewed, skewed_ids, [1, 1, 1, 8]),
        "padding: trees of 3, 3, 3, 3 rows": lambda: timed_forward(skewed, skewed_ids, [3, 3, 3, 3]),
        "batching: 8 requests x 4 rows, one forward": lambda: timed_forward(together, together_ids, [4] * 8),
        "batching: 8 requests x 4 rows, one forward each": lambda: sum(
            timed_forward(t, ids, [4]) for t, ids in singles
        ),
    }
    for run in cases.values():  # warm-up
        run()
    times = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, run in cases.items():
            times[name].append(run())
    medians = {name: statistics.median(t) for name, t in times.items()}
    names = list(cases)
    result = {
        "command": "benchmarks/tools/batch_layout.py --repeats %d --threads %d" % (args.repeats, args.threads),
        "target": "embedded SmolLM2-135M-Instruct, int8, cpu",
        "median_seconds": medians,
        "ratios": {
            "holes N=1 (uneven / even)": medians[names[1]] / medians[names[0]],
            "holes N=4 (uneven / even)": medians[names[3]] / medians[names[2]],
            "padding (1,1,1,8 / 3,3,3,3)": medians[names[4]] / medians[names[5]],
            "batching (one each / one forward)": medians[names[7]] / medians[names[6]],
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["ratios"], indent=2))


if __name__ == "__main__":
    main()
