"""What oneDNN's int8 kernel saves on the int8 target's forwards of many rows
(docs/algorithms.md §8).

    .venv/bin/python benchmarks/tools/int8_kernel_probes.py \
        --out benchmarks/results/int8-kernel-probes.json

The embedded target in int8 on a CPU with AMX int8 tiles. Two settings of the product kernel, each
forward timed in turn with both within every round (drift on the machine hits them alike):
`fbgemm` (every product through fbgemm's kernel) and `oneDNN from N rows` (products of
`int8.ONEDNN_MIN_ROWS` rows or more through oneDNN's, the engine's setting). Every output is the
same bit for bit (checked here on each forward), so only the time differs.

* one product, the first layer's gate/up projection (3072 x 576) on 1, 16, 48 and 64 random rows,
  `fbgemm` against `oneDNN` on every row count (microseconds per call, 200 calls a round);
* prompt prefills (eager forwards) of 64, 256 and 1024 tokens of this repository's README;
* batched tree forwards replayed from traces (engine/batch_target.py): `requests` MT-Bench prompts,
  each with a star tree of `nodes` rows (root included), every row through the products.

Per case: the median milliseconds of each setting over `--rounds` rounds and the median of the
paired ratios (oneDNN over fbgemm).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import arborspec.engine.int8 as int8
from arborspec.bench.prompts import conversation, load_prompts
from arborspec.common.chat import encode_messages
from arborspec.common.jsonfiles import write_json_atomic
from arborspec.common.provenance import stamp
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.batch_target import BatchTarget
from arborspec.engine.tree import TokenTree
from arborspec.models import load_pair

NEVER = 10**9
PRODUCT_CALLS = 200
BATCHES = [(4, 10), (8, 8), (16, 1), (16, 4)]  # (requests, rows per request)


def star(root: int, size: int) -> TokenTree:
    tree = TokenTree.from_root(root)
    for j in range(size - 1):
        tree.add(0, 100 + j)
    return tree


def paired(run, settings: dict[str, int], rounds: int) -> tuple[dict, float]:
    """Each setting's median ms and the median paired ratio of the second over the first;
    `run(name)` returns (seconds, output) and the outputs of one round must be equal."""
    times: dict[str, list[float]] = {n: [] for n in settings}
    names = list(settings)
    for r in range(rounds + 1):
        outs = []
        for name in names if r % 2 == 0 else names[::-1]:
            int8.ONEDNN_MIN_ROWS = settings[name]
            seconds, out = run(name)
            outs.append(out)
            if r:  # the first round warms up (and records the traces)
                times[name].append(seconds)
        assert all(torch.equal(outs[0], o) for o in outs[1:]), "kernels disagree"
    ms = {n: round(statistics.median(t) * 1e3, 2) for n, t in times.items()}
    ratio = statistics.median(b / a for a, b in zip(times[names[0]], times[names[1]]))
    return ms, round(ratio, 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/int8-kernel-probes.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not int8.amx_int8():
        raise SystemExit("no AMX int8 on this CPU: the engine runs fbgemm only, nothing to compare")
    pair = load_pair(dtype="int8", draft="embedded-head")
    model = pair.target.model
    engine = int8.ONEDNN_MIN_ROWS
    settings = {"fbgemm": NEVER, f"oneDNN from {engine} rows": engine}
    results = []
    group = model.model.layers[0].mlp.gate_proj.group
    gen = torch.Generator().manual_seed(0)
    for n in (1, 16, 48, 64):
        rows = torch.randn(n, group.members[0].in_features, generator=gen)

        def product(_name, rows=rows):
            t0 = time.perf_counter()
            for _ in range(PRODUCT_CALLS):
                out = int8.int8_rows_product(rows, group.packed, group.onednn)[0]
            # seconds per call x 1000: `paired`'s milliseconds are then microseconds per call
            return (time.perf_counter() - t0) / PRODUCT_CALLS * 1e3, out

        us, ratio = paired(product, {"fbgemm": NEVER, "oneDNN": 1}, args.rounds)
        case = f"one product {group.out_features} x {rows.shape[1]}, {n} rows"
        results.append({"case": case, "us_per_call": us, "ratio": ratio})
        print(json.dumps(results[-1]), flush=True)
    readme = Path(__file__).resolve().parents[2] / "README.md"
    text_ids = pair.tokenizer(readme.read_text(), return_tensors="pt").input_ids
    for tokens in (64, 256, 1024):
        ids = text_ids[:, :tokens]

        def prefill(_name, ids=ids):
            with torch.inference_mode():
                t0 = time.perf_counter()
                out = model.model(ids).last_hidden_state
                return time.perf_counter() - t0, out

        ms, ratio = paired(prefill, settings, args.rounds)
        results.append({"case": f"prefill of {tokens} tokens", "ms": ms, "ratio": ratio})
        print(json.dumps(results[-1]), flush=True)
    prompts = [
        encode_messages(pair.tokenizer, conversation(p, []))
        for p in load_prompts("mt-bench", max(r for r, _ in BATCHES))
    ]
    for requests, nodes in BATCHES:
        batches = {}
        for name, rows in settings.items():  # each setting's own adapter, traced under it
            int8.ONEDNN_MIN_ROWS = rows
            batches[name] = BatchTarget(ModelAdapter(model, trace=True))
            for k in range(requests):
                batches[name].join(k, prompts[k])

        def forward(name, requests=requests, nodes=nodes, batches=batches):
            batch = batches[name]
            trees = {k: star(prompts[k][-1], nodes) for k in range(requests)}
            with torch.inference_mode():
                t0 = time.perf_counter()
                _, hidden, width = batch.verify_forward(trees)
                seconds = time.perf_counter() - t0
                batch.keep({k: [] for k in range(requests)}, width)
            return seconds, torch.cat([hidden[k] for k in range(requests)])

        ms, ratio = paired(forward, settings, args.rounds)
        results.append(
            {
                "case": f"batched forward, {requests} requests x {nodes} rows",
                "rows": requests * nodes,
                "ms": ms,
                "ratio": ratio,
            }
        )
        print(json.dumps(results[-1]), flush=True)
    write_json_atomic(
        {
            "command": "benchmarks/tools/int8_kernel_probes.py",
            "rounds": args.rounds,
            "threads": args.threads,
            "onednn_min_rows": engine,
            "results": results,
            **stamp(),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
