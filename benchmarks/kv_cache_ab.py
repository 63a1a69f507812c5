"""The float64 KV cache of the int8 target (engine/kv_cache.py), A/B in one process against transformers' own cache.

    .venv/bin/python benchmarks/kv_cache_ab.py --out benchmarks/kv-cache-ab-int8.json
    .venv/bin/python benchmarks/kv_cache_ab.py --forwards --out benchmarks/kv-cache-forwards-int8.json

Per prompt, plain decoding and a tree method run over transformers' `DynamicLayer` (float32, appended by
`torch.cat`, converted to float64 by the attention on every forward: how every int8 step ran before the
eleventh session) and over `Float64Layer` (float64 buffers grown in place), one after the other on the same
loaded target and draft (interleaved, so machine drift hits all four alike); every output is checked
token-identical to plain decoding over transformers' cache. Speedups = seconds per token over all prompts
(every new token of every generation counted), each against plain decoding *with the same cache*, plus the
cache's own gain on each.

`--forwards`: single tree forwards instead (a root and its chain-and-star tree of n - 1 nodes after a cache of
`--contexts` random tokens, both caches on the same model, interleaved round by round, median over `--repeats`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

from arborspec.bench.prompts import load_prompts
from arborspec.builders import make_builder
from arborspec.common.chat import encode_prompt, eos_ids
from arborspec.common.jsonfiles import report_json
from arborspec.common.provenance import machine_info, utc_timestamp, versions
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.cost import random_context
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.kv_cache import new_cache
from arborspec.engine.sampling import sampling_config
from arborspec.engine.tree import TokenTree
from arborspec.models import load_model, load_pair

CACHES = {"transformers": lambda model: DynamicCache(config=model.config), "float64": new_cache}


def time_forwards(args) -> dict:
    """Median seconds of one tree forward of n rows over each cache, per context length (module doc)."""
    model = load_model("embedded", "cpu", "int8")
    adapters = {name: ModelAdapter(model) for name in CACHES}
    sizes = [int(n) for n in args.sizes.split(",")]
    out = {}
    for context_len in (int(c) for c in args.contexts.split(",")):
        context = random_context(model.config.vocab_size, context_len)
        trees = {}
        for n in sizes:
            tree, parent = TokenTree.from_root(context[-1]), 0
            for j in range(n - 1):
                parent = tree.add(parent if j % 2 else 0, context[j] + 1)
            trees[n] = tree
        for name, adapter in adapters.items():
            adapter.new_cache = CACHES[name]
            adapter.reset()
            adapter.prefill(torch.tensor(context))
        times = {(name, n): [] for name in adapters for n in sizes}
        for round_ in range(args.repeats + 2):
            for n, tree in trees.items():
                for name, adapter in adapters.items():
                    t0 = time.perf_counter()
                    adapter.tree_forward(tree, lazy=True)
                    seconds = time.perf_counter() - t0
                    adapter.crop_to(context_len)
                    if round_ >= 2:  # two warm-up rounds
                        times[(name, n)].append(seconds)
        out[str(context_len)] = {
            str(n): {"transformers_ms": round(1e3 * statistics.median(times[("transformers", n)]), 3),
                     "float64_ms": round(1e3 * statistics.median(times[("float64", n)]), 3),
                     "gain": round(statistics.median(times[("transformers", n)]) / statistics.median(times[("float64", n)]), 3)}
            for n in sizes}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", default="dyspec")
    ap.add_argument("--budget", default="8")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--forwards", action="store_true", help="time single tree forwards instead of generations")
    ap.add_argument("--contexts", default="250,1200")
    ap.add_argument("--sizes", default="1,2,9,17")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default="benchmarks/kv-cache-ab-int8.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.forwards:
        report_json({"created": utc_timestamp(), "machine": machine_info(), "versions": versions(), "args": vars(args),
                     "tree_forward_by_context": time_forwards(args)}, args.out)
        return
    budget = int(args.budget) if args.budget.isdigit() else args.budget
    pair = load_pair("embedded", None, dtype="int8")
    target = pair.target
    decoder = SpeculativeDecoder(target, pair.drafter, make_builder(args.method, budget=budget))
    greedy = args.temperature == 0
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, seed=0, eos_token_ids=eos_ids(pair.tokenizer, target.model),
                       sampling=sampling_config(not greedy, args.temperature if not greedy else 1.0, 0, 1.0))
    prompts = [encode_prompt(pair.tokenizer, p.turns[0], True) for p in load_prompts("mt-bench", args.num_prompts)]
    runs = {"plain": lambda ids: autoregressive_generate(target, ids, cfg), args.method: lambda ids: decoder.generate(ids, cfg)}
    names = [f"{kind}, {cache} cache" for kind in runs for cache in CACHES]

    def run(name, ids):
        kind, cache = name.split(", ")
        target.new_cache = CACHES[cache.split()[0]]  # what the generation's ModelAdapter.reset builds
        return runs[kind](ids)

    for name in names:  # warm-up, untimed
        run(name, prompts[0])
    seconds, tokens = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0)
    accepted: dict[str, list[float]] = {name: [] for name in names}
    for ids in prompts:
        reference = None
        for name in names:
            t0 = time.perf_counter()
            out = run(name, ids)
            seconds[name] += time.perf_counter() - t0
            tokens[name] += len(out.output_ids)
            accepted[name].append(out.mean_accepted_length)
            if reference is None:
                reference = out.output_ids
            elif greedy and out.output_ids != reference:
                raise SystemExit(f"{name}: output differs from plain decoding over transformers' cache")
    per_token = {name: seconds[name] / tokens[name] for name in names}
    result = {"created": utc_timestamp(), "machine": machine_info(), "versions": versions(), "args": vars(args),
              "ms_per_token": {name: round(1e3 * t, 2) for name, t in per_token.items()},
              "cache_speedup": {kind: round(per_token[f"{kind}, transformers cache"] / per_token[f"{kind}, float64 cache"], 3)
                                for kind in runs},
              "speedup_vs_plain_same_cache": {
                  cache: round(per_token[f"plain, {cache} cache"] / per_token[f"{args.method}, {cache} cache"], 3)
                  for cache in CACHES},
              "mean_accepted_length": round(statistics.mean(accepted[f"{args.method}, float64 cache"]), 3),
              "greedy_identical": greedy}
    report_json(result, args.out)


if __name__ == "__main__":
    main()
