"""Where a step of batched decoding spends its time, plain against speculative
(docs/evaluation.md (j)).

    .venv/bin/python benchmarks/tools/batch_step_split.py \
        --out benchmarks/results/batch-step-split.json

The embedded pair in int8; `--concurrency` clients in a closed loop over the stratified MT-Bench
selection (first turns, burst arrival, one queue: every client sends the next prompt as soon as its
previous one ends, as `arborspec bench-batch` runs them), T = 0, `--max-new-tokens` each. For plain batched
decoding and each `-m` method (the `bench-batch` method syntax, `shared:` included), every step of
`BatchDecoder.step` is split by wrapping the decoder's own phases:

* `admit`: requests joining (their prefill, target and draft side);
* `draft_forwards`: the batched draft forwards (the drafter's own clock);
* `build`: the rest of drafting: the builders growing their trees, lookup proposals, greenlets;
* `target_forward`: the one target forward over every request's tree (`BatchTarget.verify_forward`);
* `screen`: the greedy screen of the LM-head rows the verifiers read (`_screen_walks`);
* `other`: verification walks, cache compaction, statistics, callbacks.

Per method: milliseconds per step of each phase (mean over every step of every round), tokens per
step, rows fed per target forward (the real rows where the int8 target packs uneven trees into one
row, engine/packed_rows.py; else every request padded to the widest tree) and rows that are real,
the cache width during the target forward (the longest row plus the step's new columns), tokens/s. Methods take turns within each of `--rounds` rounds; every output is
checked equal to plain batched decoding's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch

from arborspec.bench.concurrency import closed_loop, expand_batch_methods
from arborspec.bench.prompts import conversation, load_prompts
from arborspec.common.chat import encode_messages, eos_ids
from arborspec.common.jsonfiles import write_json_atomic
from arborspec.common.provenance import stamp
from arborspec.common.timing import clock
from arborspec.engine.batch_decode import BatchDecoder, BatchRequest
from arborspec.engine.decode import DecodeConfig
from arborspec.models import load_pair

PHASES = ("admit", "draft_forwards", "build", "target_forward", "screen", "other")


class Recorder:
    """Wraps one decoder's phases and keeps, per step, the seconds of each and the rows fed."""

    def __init__(self, decoder: BatchDecoder) -> None:
        self.decoder = decoder
        self.steps: list[dict] = []
        self.current: dict = defaultdict(float)
        for name, phase in (
            ("_admit", "admit"),
            ("_draft", "drafting"),
            ("_screen_walks", "screen"),
        ):
            self._wrap(decoder, name, phase)
        self._wrap(decoder.target, "verify_forward", "target_forward", rows=True)

    def _wrap(self, owner, name: str, phase: str, rows: bool = False) -> None:
        inner = getattr(owner, name)
        drafts = self.decoder.drafts

        def timed(*args, **kwargs):
            before = drafts.forward_time if drafts is not None else 0.0
            t0 = clock()
            out = inner(*args, **kwargs)
            self.current[phase] += clock() - t0
            if phase == "drafting" and drafts is not None and drafts.forward_time != before:
                # the drafter's clock restarts at its `begin`: this step's draft forwards
                self.current["draft_forwards"] = drafts.forward_time
            if rows:
                sizes = [tree.num_nodes for tree in args[0].values()]
                packs = self.decoder.target.packs and len(set(sizes)) > 1  # engine/packed_rows.py
                self.current["rows_fed"] += sum(sizes) if packs else len(sizes) * max(sizes)
                self.current["rows_real"] += sum(sizes)
                self.current["width"] += self.decoder.target.width
            return out

        setattr(owner, name, timed)

    def step(self, inner):
        def step():
            self.current = defaultdict(float)
            t0 = clock()
            ended = inner()
            total = clock() - t0
            cur = self.current
            cur["build"] = cur.pop("drafting", 0.0) - cur["draft_forwards"]
            cur["other"] = total - sum(cur[p] for p in PHASES if p != "other")
            cur["total"] = total
            self.steps.append(dict(cur))
            return ended

        return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("-m", "--method", action="append", dest="methods")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/batch-step-split.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    methods = expand_batch_methods(
        args.methods or ["dyspec:budget=3:lookup=6", "shared:max_nodes=8:lookup=6"]
    )
    pair = load_pair(dtype="int8", draft="embedded-head")
    eos = eos_ids(pair.tokenizer, pair.target.model)
    prompts = load_prompts("mt-bench", args.num_prompts)
    ids = [encode_messages(pair.tokenizer, conversation(p, [])) for p in prompts]
    by_label = {m.label: m for m in methods}
    builders = {m.label: m.make() for m in methods}

    def run(label: str) -> tuple[dict, list[list[int]]]:
        method = by_label.get(label)
        decoder = BatchDecoder(
            pair.target,
            pair.drafter if method else None,
            max_rows=1024,
            max_requests=args.concurrency,
            shared=method.shared() if method else None,
        )
        recorder = Recorder(decoder)
        decoder.step = recorder.step(decoder.step)

        def submit(index: int):
            cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, seed=index, eos_token_ids=eos)
            return decoder.submit(
                BatchRequest(
                    list(ids[index]),
                    cfg,
                    builders.get(label),
                    lookup=method.lookup if method else 0,
                )
            )

        t0 = time.perf_counter()
        handles, _ = closed_loop(
            decoder,
            list(range(len(ids))),
            [0.0] * min(args.concurrency, len(ids)),
            submit,
        )
        wall = time.perf_counter() - t0
        outputs = [list(handles[i].output) for i in range(len(ids))]
        tokens = sum(len(o) for o in outputs)
        steps = recorder.steps
        row = {
            "method": label,
            "steps": len(steps),
            "tokens": tokens,
            "tokens_per_second": tokens / wall,
            "tokens_per_step": tokens / len(steps),
            "ms_per_step": {
                p: 1e3 * statistics.mean(s[p] for s in steps) for p in PHASES + ("total",)
            },
            "median_step_ms": 1e3 * statistics.median(s["total"] for s in steps),
            "rows_fed_per_forward": statistics.mean(s["rows_fed"] for s in steps),
            "rows_real_per_forward": statistics.mean(s["rows_real"] for s in steps),
            "cache_width": statistics.mean(s["width"] for s in steps),
        }
        return row, outputs

    labels = ["plain"] + [m.label for m in methods]
    # warm-up: first forwards, the shared budget's cost measurement; plain's outputs: the reference
    reference = run("plain")[1]
    for label in labels[1:]:
        run(label)
    rounds: dict[str, list[dict]] = defaultdict(list)
    identical = {label: True for label in labels}
    for r in range(args.rounds):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            row, outputs = run(label)
            rounds[label].append(row)
            print(
                json.dumps(
                    {
                        k: (round(v, 2) if isinstance(v, float) else v)
                        for k, v in row.items()
                        if k != "ms_per_step"
                    }
                ),
                flush=True,
            )
            identical[label] &= outputs == reference
    results = []
    for label in labels:
        rows = rounds[label]
        mean = lambda key: round(statistics.mean(r[key] for r in rows), 2)  # noqa: E731
        results.append(
            {
                "method": label,
                "rounds": len(rows),
                "tokens_per_second": mean("tokens_per_second"),
                "tokens_per_step": mean("tokens_per_step"),
                "median_step_ms": mean("median_step_ms"),
                "ms_per_step": {
                    p: round(statistics.mean(r["ms_per_step"][p] for r in rows), 2)
                    for p in PHASES + ("total",)
                },
                "rows_fed_per_forward": mean("rows_fed_per_forward"),
                "rows_real_per_forward": mean("rows_real_per_forward"),
                "cache_width": mean("cache_width"),
                "identical_to_plain": identical[label],
            }
        )
    out = {
        **stamp(),
        "threads": args.threads,
        "concurrency": args.concurrency,
        "prompts": len(ids),
        "max_new_tokens": args.max_new_tokens,
        "results": results,
    }
    write_json_atomic(out, args.out)
    for r in results:
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
