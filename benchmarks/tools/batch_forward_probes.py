"""What packing a batched tree forward's real tokens into one row, and attending a long tree's
rows in a call of their own, save on the int8 target (docs/evaluation.md (i)).

    .venv/bin/python benchmarks/tools/batch_forward_probes.py \
        --out benchmarks/results/batch-forward-probes.json

The embedded target in int8; `--requests` MT-Bench prompts (first turns, the stratified selection)
join one batch (engine/batch_target.py), then, for each pattern of tree sizes (one star tree per
request, root included), one batched forward of every tree followed by the step's compaction (each
row keeps its root), as a step of batched decoding runs it. Three variants of the forward, timed in
turn within each round so that drift on the machine hits them alike, each on its own batch and
adapter:

* `replay, padded`: the forward replayed from a trace (engine/traced.py), `[B, N]` inputs, every
  request padded to the largest tree;
* `replay, packed`: the replay of a trace that takes the real tokens as one row `[1, S]` and where
  they sit in the batch as inputs (engine/packed_rows.py);
* `eager, packed`: the modules' own forward (an adapter without traces), packed.

Each pattern's figures: the median milliseconds per forward of each variant over `--rounds` rounds,
and each variant's median ratio to the first over the rounds (paired, round by round). Where every
tree has the same size nothing is padded and the packed variants run unpacked, as the engine does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from arborspec.bench.prompts import conversation, load_prompts
from arborspec.common.chat import encode_messages
from arborspec.common.jsonfiles import write_json_atomic
from arborspec.common.provenance import stamp
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.batch_target import BatchTarget
from arborspec.engine.packed_rows import split_width
from arborspec.engine.tree import TokenTree
from arborspec.models import load_pair

PATTERNS = {
    4: [
        "1,1,1,1", "2,2,2,2", "4,1,2,3", "8,2,2,2", "7,1,1,1", "8,8,2,2", "6,3,1,2", "10,3,6,1",
        "10,10,10,10",
    ],
    8: [
        "1,1,1,1,1,1,1,1",
        "2,2,2,2,2,2,2,2",
        "4,1,1,1,2,1,3,1",
        "7,1,1,1,1,1,1,1",
        "3,3,3,1,2,1,1,1",
    ],
}


def star(root: int, size: int) -> TokenTree:
    tree = TokenTree.from_root(root)
    for j in range(size - 1):
        tree.add(0, 100 + j)
    return tree


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", default="4,8")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/batch-forward-probes.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(dtype="int8", draft="embedded-head")
    counts = [int(c) for c in args.requests.split(",")]
    prompts = load_prompts("mt-bench", max(counts))
    ids = [encode_messages(pair.tokenizer, conversation(p, [])) for p in prompts]

    # name -> (replayed from a trace, packed, attention split)
    variants = {
        "replay, padded": (True, False, False),
        "replay, packed": (True, True, False),
        "replay, packed, split": (True, True, True),
        "eager, packed, split": (False, True, True),
    }
    names = list(variants)

    results = []
    for count in counts:
        batches = {}
        for name in names:  # each variant's own adapter and batch
            trace, packs, splits = variants[name]
            batches[name] = BatchTarget(ModelAdapter(pair.target.model, trace=trace))
            batches[name].packs, batches[name].splits = packs, splits
            for k in range(count):
                batches[name].join(k, ids[k])

        def forward(name: str, sizes: list[int]) -> float:
            batch = batches[name]
            trees = {k: star(ids[k][-1], sizes[k]) for k in range(count)}
            t0 = time.perf_counter()
            _, _, width = batch.verify_forward(trees)
            batch.keep({k: [] for k in range(count)}, width)
            return time.perf_counter() - t0

        for pattern in PATTERNS.get(count, ["1," * (count - 1) + "1"]):
            sizes = [int(s) for s in pattern.split(",")]
            times: dict[str, list[float]] = {n: [] for n in names}
            for name in names:
                forward(name, sizes)
            for r in range(args.rounds):
                for name in names[r % len(names):] + names[: r % len(names)]:
                    times[name].append(forward(name, sizes))
            base = times[names[0]]
            row = {
                "requests": count,
                "tree_sizes": sizes,
                "live_rows": sum(sizes) / (count * max(sizes)),
                "split_width": split_width(sizes),
                "ms": {n: round(statistics.median(t) * 1e3, 2) for n, t in times.items()},
                "ratio_to_first": {
                    n: round(statistics.median(a / b for a, b in zip(times[n], base)), 3)
                    for n in names[1:]
                },
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    out = {
        **stamp(),
        "threads": args.threads,
        "rounds": args.rounds,
        "prompt_tokens": [len(i) for i in ids],
        "results": results,
    }
    write_json_atomic(out, args.out)


if __name__ == "__main__":
    main()
