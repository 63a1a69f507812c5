"""t(n) of the embedded target's forward paths, interleaved in one process (docs/evaluation.md (a)).

    .venv/bin/python benchmarks/tools/cost_paths.py --out benchmarks/results/cost-paths.json

Paths, each a forward of n rows (a star tree: root + n - 1 children) over a cache of 200 random tokens:

* `model-logits`: the model's own forward, LM head (`F.linear`) on all n rows;
* `decoder+rows`: the decoder, then the LM head on the rows a verifier reads (`--rows`, default 2: an accepted
  length of 2), one row at a time by the matrix-vector product (engine/lm_head.py): how a step runs;
* `int8 decoder+rows`: the same on the batch-invariant int8 target (`--dtype int8`, engine/int8.py;
  docs/algorithms.md §8), a different target whose quality benchmarks/tools/int8_quality.py reports.

With `--compile`, two more paths: `compiled decoder+rows` and `compiled int8 decoder+rows`, the same on copies whose
decoder runs through `torch.compile` (`--compile` of generate/bench, `ModelAdapter.compile`); `first_round_s` records
each path's first (warm-up) round, which pays the compilation.

For n = 1 `decoder+rows` computes one row: plain decoding's step. Ratios are to `model-logits` at n = 1
(the unmodified model's one-token forward) and to each path's own n = 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from arborspec.common.hf_cache import cache_kwargs
from arborspec.common.provenance import machine_info, utc_timestamp, versions
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.cost import random_context
from arborspec.engine.tree import TokenTree
from arborspec.models import load_model


def star(context: list[int], n: int) -> TokenTree:
    tree = TokenTree.from_root(context[-1])
    for j in range(n - 1):
        tree.add(0, context[j] + 1)
    return tree


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64")
    ap.add_argument("--rows", type=int, default=2, help="LM-head rows the verifier reads (accepted length)")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="also time compiled copies of both decoder paths")
    ap.add_argument("--out", default="benchmarks/results/cost-paths.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    adapter = ModelAdapter(load_model(args.target, "cpu", "float32"))
    int8 = ModelAdapter(load_model(args.target, "cpu", "int8"))
    adapters = [adapter, int8]
    if args.compile:
        compiled, compiled8 = ModelAdapter(load_model(args.target, "cpu", "float32")), ModelAdapter(load_model(args.target, "cpu", "int8"))
        compiled.compile()
        compiled8.compile()
        adapters += [compiled, compiled8]
    context = random_context(adapter.vocab_size, args.context)
    for a in (adapter, int8):
        a.prefill(torch.tensor(context))
    past = adapter.cache_len

    def model_logits(tree: TokenTree) -> None:
        ids = torch.tensor(tree.tokens)
        out = adapter.model(input_ids=ids.view(1, -1), attention_mask=tree.attention_mask(past, adapter.dtype),
                            position_ids=tree.position_ids(past),
                            **cache_kwargs(adapter.model, adapter.cache), use_cache=True)
        out.logits.float()

    def decoder_rows(tree: TokenTree, on: ModelAdapter = adapter) -> None:
        lazy = on.tree_forward(tree, lazy=True)
        for i in range(min(args.rows, tree.num_nodes)):
            lazy[i]

    paths = {"model-logits": model_logits, "decoder+rows": decoder_rows,
             "int8 decoder+rows": lambda tree: decoder_rows(tree, int8)}
    first_round = {p: 0.0 for p in paths}
    if args.compile:
        for a in (compiled, compiled8):  # the prefill is a compiled forward too: count it in the first round
            t0 = time.perf_counter()
            a.prefill(torch.tensor(context))
            first_round["compiled int8 decoder+rows" if a is compiled8 else "compiled decoder+rows"] = time.perf_counter() - t0
        paths["compiled decoder+rows"] = lambda tree: decoder_rows(tree, compiled)
        paths["compiled int8 decoder+rows"] = lambda tree: decoder_rows(tree, compiled8)
    times: dict[str, dict[int, list[float]]] = {p: {n: [] for n in sizes} for p in paths}
    with torch.inference_mode():
        for rep in range(args.repeats + 2):  # interleaved: every path and size once per round; 2 warm-up rounds
            for n in sizes:
                tree = star(context, n)
                for name, fn in paths.items():
                    t0 = time.perf_counter()
                    fn(tree)
                    dt = time.perf_counter() - t0
                    for a in adapters:
                        a.crop_to(past)
                    if rep >= 2:
                        times[name][n].append(dt)
                    elif rep == 0:
                        first_round[name] += dt
    med = {p: {n: statistics.median(v) for n, v in d.items()} for p, d in times.items()}
    today = med["model-logits"][1]
    result = {"created": utc_timestamp(), "machine": machine_info(), "versions": versions(), "args": vars(args),
              "first_round_s": {p: round(t, 2) for p, t in first_round.items()},
              "median_ms": {p: {n: round(1000 * t, 2) for n, t in d.items()} for p, d in med.items()},
              "relative_to_todays_one_token": {p: {n: round(t / today, 3) for n, t in d.items()} for p, d in med.items()},
              "relative_to_own_one_token": {p: {n: round(t / d[1], 3) for n, t in d.items()} for p, d in med.items()}}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'n':>4} " + " ".join(f"{p:>28}" for p in paths))
    for n in sizes:
        print(f"{n:>4} " + " ".join(f"{1000 * med[p][n]:9.1f} ms {med[p][n] / today:5.2f}x {med[p][n] / med[p][1]:5.2f}x "
                                      for p in paths))
    print("first round (compilation included for compiled paths): "
          + ", ".join(f"{p} {t:.1f} s" for p, t in first_round.items()))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
