"""Where a speculative step's time goes, from generations instrumented in one process.

    .venv/bin/python benchmarks/step_split_probe.py --out benchmarks/step-split-s18.json

Loads the embedded pair (int8 target, draft head), runs `--method` with `--lookup` on the first `--prompts` MT-Bench
prompts (`--max-new-tokens` each, T = 0, after one short warm-up generation), and times, per speculative step, the
calls that make it up: the drafter's `begin` (the head over the newly committed tokens, the root's draft logits),
the builder's `build` (its draft forwards through `expand` counted inside it and also on their own), the target's
tree forward, the verifier's walk (its screened LM-head rows), the target's compaction. Wall-clock wrappers around
those calls only: the figures include the wrappers' own microseconds and describe this machine at the time of the run.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from arborspec.api import SpeculativeGenerator
from arborspec.bench.prompts import load_prompts
from arborspec.common.jsonfiles import report_json
from arborspec.common.provenance import machine_info, utc_timestamp, versions
from arborspec.engine import verifiers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="dyspec")
    ap.add_argument("--budget", default="8")
    ap.add_argument("--lookup", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    budget = a.budget if a.budget == "auto" else int(a.budget)
    gen = SpeculativeGenerator(method=a.method, budget=budget, dtype="int8", lookup=a.lookup)
    seconds: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)

    def timed(inner, key: str):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                seconds[key] += time.perf_counter() - t0
                calls[key] += 1
        return call

    drafter, target, builder = gen.pair.drafter, gen.pair.target, gen.decoder.builder
    drafter.begin = timed(drafter.begin, "draft: begin (head over committed tokens, root logits)")
    drafter.expand = timed(drafter.expand, "draft: expand (head forwards inside build)")
    builder.build = timed(builder.build, "build (expand included)")
    target.tree_forward = timed(target.tree_forward, "target tree forward")
    target.compact = timed(target.compact, "target compaction")
    walk = verifiers.VERIFIERS["greedy"]  # the decoder picks its verifier from this table at each generation
    verifiers.VERIFIERS["greedy"] = timed(walk, "verifier walk (screened rows)")
    prompts = load_prompts("mt-bench", a.prompts)
    gen.generate(prompts[0].turns[0], 16)
    seconds.clear()
    calls.clear()
    t0, steps, tokens = time.perf_counter(), 0, 0
    try:
        for p in prompts:
            result = gen.generate(p.turns[0], a.max_new_tokens)
            steps += len(result.steps)
            tokens += result.new_tokens
    finally:
        verifiers.VERIFIERS["greedy"] = walk
    wall = time.perf_counter() - t0
    report_json({
        "method": a.method, "budget": a.budget, "lookup": a.lookup, "prompts": a.prompts,
        "max_new_tokens": a.max_new_tokens, "steps": steps, "accepted_length": round(tokens / steps, 3),
        "ms_per_step_wall": round(wall / steps * 1e3, 2),
        "ms_per_step": {k: round(v / steps * 1e3, 2) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])},
        "calls_per_step": {k: round(calls[k] / steps, 2) for k in seconds},
        "machine": machine_info(), "versions": versions(), "timestamp": utc_timestamp(),
    }, a.out)


if __name__ == "__main__":
    main()
