"""Where a step of single-request speculative decoding spends its time, against a plain token.

    .venv/bin/python benchmarks/tools/step_split.py --out benchmarks/results/step-split.json

The int8 embedded pair, the stratified MT-Bench first turns, 128 new tokens, T = 0 (`--temperature`
to sample). Plain decoding and each `-m` method take turns prompt by prompt (after one warm-up
generation each); their milliseconds per token give the speedup, as `arborspec bench` computes
it. For each method the step is split by timing the engine's own calls around them (wrappers, so
the split adds a few microseconds per call): the target's tree forward (`ModelAdapter.tree_forward`,
with the replay of engine/traced.py inside it), the greedy screens of the rows the verifier reads
(`GreedyScreen.argmax_rows`; when sampling, `logits`: full LM-head rows), the drafter's `begin`
and `expand` (the draft head's forwards and logits), the cache compaction, and the rest of the
step (building the tree, the verifier's walk, statistics), and `feed` (the prompt's prefill; plain
decoding's one-token forwards). The same split of plain decoding gives what one plain token
costs. `trace_seconds`: what making each trace
of engine/traced.py cost (once per kind of forward, during the warm-up).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from arborspec.bench.prompts import conversation, load_prompts
from arborspec.builders import make_builder, parse_params
from arborspec.common.chat import encode_messages, eos_ids
from arborspec.common.jsonfiles import write_json_atomic
from arborspec.common.provenance import stamp
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.lm_head import GreedyScreen, HeadRows
from arborspec.engine.sampling import SamplingConfig
from arborspec.engine.traced import TracedDecoder
from arborspec.models import load_pair

PHASES = (
    ("target_forward", ModelAdapter, "tree_forward"),
    ("feed", ModelAdapter, "feed"),
    ("screen", GreedyScreen, "argmax_rows"),
    ("compaction", ModelAdapter, "compact"),
    ("logits", HeadRows, "logits"),
)


class Timers:
    """Seconds spent inside wrapped methods, by phase, while `active`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.active = False

    def wrap(self, phase: str, cls, name: str) -> None:
        inner = getattr(cls, name)
        timers = self

        def timed(*args, **kwargs):
            if not timers.active:
                return inner(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                timers.seconds[phase] += time.perf_counter() - t0
                timers.calls[phase] += 1

        setattr(cls, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--method", action="append", default=None)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--out", default="benchmarks/results/step-split.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair("embedded", dtype="int8")
    timers = Timers()
    for phase, cls, name in PHASES:
        timers.wrap(phase, cls, name)
    trace_seconds: list[float] = []
    make_trace = TracedDecoder._trace

    def timed_trace(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return make_trace(self, *args, **kwargs)
        finally:
            trace_seconds.append(round(time.perf_counter() - t0, 3))

    TracedDecoder._trace = timed_trace
    drafter_cls = type(pair.drafter)
    timers.wrap("draft_begin", drafter_cls, "begin")
    timers.wrap("draft_expand", drafter_cls, "expand")
    prompts = [
        encode_messages(pair.tokenizer, conversation(p, []), True)
        for p in load_prompts("mt-bench", args.num_prompts)
    ]
    cfg = DecodeConfig(
        max_new_tokens=args.max_new_tokens,
        sampling=SamplingConfig(temperature=args.temperature),
        eos_token_ids=tuple(eos_ids(pair.tokenizer, pair.target.model)),
    )
    runners = {"plain": lambda ids: autoregressive_generate(pair.target, ids, cfg)}
    for spec in args.method or ["dyspec:budget=3:lookup=6"]:
        name, *items = spec.split(":")
        params = parse_params(items)
        lookup = int(params.pop("lookup", 0))
        decoder = SpeculativeDecoder(
            pair.target, pair.drafter, make_builder(name, **params), lookup=lookup
        )
        runners[spec] = lambda ids, decoder=decoder: decoder.generate(ids, cfg)
    totals = {label: defaultdict(float) for label in runners}
    with torch.inference_mode():
        for run in runners.values():
            run(prompts[0])
        for ids in prompts:
            for label, run in runners.items():
                timers.seconds.clear()
                timers.calls.clear()
                timers.active = True
                t0 = time.perf_counter()
                result = run(ids)
                wall = time.perf_counter() - t0
                timers.active = False
                t = totals[label]
                t["seconds"] += wall
                t["tokens"] += len(result.output_ids)
                t["steps"] += len(result.steps) or len(result.output_ids)
                for phase, seconds in timers.seconds.items():
                    t[phase] += seconds
                    t[phase + "_calls"] += timers.calls[phase]
    plain_ms = 1e3 * totals["plain"]["seconds"] / totals["plain"]["tokens"]
    rows = []
    for label, t in totals.items():
        steps = t["steps"]
        phases = {
            phase: round(1e3 * t[phase] / steps, 3)
            for phase in [p for p, _, _ in PHASES] + ["draft_begin", "draft_expand"]
            if t[phase]
        }
        step_ms = 1e3 * t["seconds"] / steps
        phases["rest"] = round(step_ms - sum(phases.values()), 3)
        ms_per_token = 1e3 * t["seconds"] / t["tokens"]
        rows.append(
            {
                "method": label,
                "ms_per_token": round(ms_per_token, 3),
                "speedup": round(plain_ms / ms_per_token, 3),
                "tokens_per_step": round(t["tokens"] / steps, 3),
                "ms_per_step": round(step_ms, 3),
                "phase_ms_per_step": phases,
                "calls_per_step": {
                    phase: round(t[phase + "_calls"] / steps, 2)
                    for phase in phases
                    if phase != "rest"
                },
            }
        )
        print(rows[-1])
    write_json_atomic(
        {
            "command": "benchmarks/tools/step_split.py",
            "num_prompts": args.num_prompts,
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature,
            "rows": rows,
            "trace_seconds": trace_seconds,
            **stamp(),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
