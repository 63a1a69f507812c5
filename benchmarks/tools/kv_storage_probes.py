"""What the int8 target's KV cache costs kept in float32 (converted to float64 as the attention
reads it) against kept in float64 (docs/evaluation.md (k)).

    .venv/bin/python benchmarks/tools/kv_storage_probes.py \
        --out benchmarks/results/kv-storage-probes.json

The embedded target in int8; for each pattern (requests x rows per request), that many MT-Bench
prompts (first turns of the stratified selection, each repeated to a length of 150-250 tokens, so
that the cache is as wide as in the middle of a 128-token answer) join one batch
(engine/batch_target.py), then one batched forward of a star tree per request and the step's
compaction, replayed from traces as batched decoding runs it. Two variants, each on its own adapter
and batch, taking turns within each of `--rounds` rounds: the batch's cache buffers in float32
(`batch_rows.BATCH_STORAGE`, what batched decoding keeps) and in float64 (what a single sequence's
cache keeps: the float32 states converted as they are written; the attention's conversion then has
nothing to do). Both compute the same values bit for
bit; the tool checks the hidden states equal. Figures: the median milliseconds per forward of
each and the median of the per-round ratios (float32 over float64; below 1: float32 faster).

Then whole plain batched decoding (`BatchDecoder`, no drafter) of 1, 2, 4 and 8 MT-Bench prompts,
`--decode-tokens` new tokens each, over float32 and over float64 buffers, taking turns within
each of `--decode-rounds` rounds: the milliseconds per step after the first (which holds the
prefills), whose ratio decides `batch_rows.storage_for` (one sequence or more). Every output is
checked equal between the two.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import contextmanager

import torch

import arborspec.engine.batch_rows as batch_rows
from arborspec.bench.prompts import conversation, load_prompts
from arborspec.common.chat import encode_messages
from arborspec.common.jsonfiles import write_json_atomic
from arborspec.common.provenance import stamp
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.batch_decode import BatchDecoder, BatchRequest
from arborspec.engine.batch_target import BatchTarget
from arborspec.engine.decode import DecodeConfig
from arborspec.models import load_pair
from batch_forward_probes import star  # the sibling tool's star trees (root + children)

PATTERNS = ["1x1", "1x4", "4x1", "4x2", "4x4", "8x1", "16x1"]
LENGTHS = (150, 190, 230, 250, 170, 210, 180, 240)  # prompt tokens per request, cycled


DECODE_REQUESTS = (1, 2, 4, 8)


@contextmanager
def buffers(storage: torch.dtype):
    """Within this block, a batch of any size keeps its `InPlaceLayer`s in `storage` (the float32
    states written to them are converted exactly)."""
    saved = batch_rows.BATCH_STORAGE, batch_rows.SINGLE_STORAGE
    batch_rows.BATCH_STORAGE = batch_rows.SINGLE_STORAGE = storage
    try:
        yield
    finally:
        batch_rows.BATCH_STORAGE, batch_rows.SINGLE_STORAGE = saved


def decode_steps(pair, ids: list[list[int]], requests: int, tokens: int) -> tuple[float, list]:
    """Plain batched decoding of the first `requests` prompts: (median seconds per step after the
    first, the outputs)."""
    decoder = BatchDecoder(pair.target, None, max_rows=256, max_requests=requests)
    handles = [
        decoder.submit(BatchRequest(list(ids[k]), DecodeConfig(max_new_tokens=tokens, seed=k)))
        for k in range(requests)
    ]
    decoder.step()  # the prefills
    times = []
    while not decoder.idle:
        t0 = time.perf_counter()
        decoder.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), [h.output for h in handles]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--decode-rounds", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/kv-storage-probes.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair(dtype="int8", draft="embedded-head")
    patterns = [tuple(int(x) for x in p.split("x")) for p in args.patterns.split(",")]
    count = max(r for r, _ in patterns)
    prompts = load_prompts("mt-bench", min(count, 16))
    ids = [encode_messages(pair.tokenizer, conversation(p, [])) for p in prompts]
    ids = [(ids[k % len(ids)] * 8)[: LENGTHS[k % len(LENGTHS)]] for k in range(count)]
    names = ("float32 buffers", "float64 buffers")

    def scope(name: str):
        return buffers(torch.float64 if name == names[1] else torch.float32)

    results = []
    with torch.inference_mode():
        for requests, rows in patterns:
            batches = {}
            for name in names:
                with scope(name):
                    batches[name] = BatchTarget(ModelAdapter(pair.target.model, trace=True))
                    for k in range(requests):
                        batches[name].join(k, ids[k])

            def forward(name: str) -> tuple[float, dict]:
                batch = batches[name]
                trees = {k: star(ids[k][-1], rows) for k in range(requests)}
                with scope(name):
                    t0 = time.perf_counter()
                    _, hidden, width = batch.verify_forward(trees)
                    batch.keep({k: [] for k in range(requests)}, width)
                    return time.perf_counter() - t0, hidden

            first = [forward(name)[1] for name in names]  # traces made; the same values
            same = all(torch.equal(first[0][k], first[1][k]) for k in range(requests))
            times: dict[str, list[float]] = {n: [] for n in names}
            for r in range(args.rounds):
                for name in names[r % 2 :] + names[: r % 2]:
                    times[name].append(forward(name)[0])
            row = {
                "requests": requests,
                "rows_per_request": rows,
                "prompt_tokens": [len(ids[k]) for k in range(requests)],
                "ms": {n: round(statistics.median(t) * 1e3, 2) for n, t in times.items()},
                "float32_over_float64": round(
                    statistics.median(a / b for a, b in zip(times[names[0]], times[names[1]])), 3
                ),
                "same_hidden_states": same,
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    decoding = []
    prompts = [
        encode_messages(pair.tokenizer, conversation(p, [])) for p in load_prompts("mt-bench", 8)
    ]
    with torch.inference_mode():
        for requests in DECODE_REQUESTS:
            times: dict[str, list[float]] = {n: [] for n in names}
            outputs: dict[str, list] = {}
            for r in range(args.decode_rounds + 1):  # round 0 warms up (traces)
                for name in names[r % 2 :] + names[: r % 2]:
                    with scope(name):
                        seconds, outputs[name] = decode_steps(
                            pair, prompts, requests, args.decode_tokens
                        )
                    if r:
                        times[name].append(seconds)
            row = {
                "requests": requests,
                "ms_per_step": {n: [round(t * 1e3, 2) for t in ts] for n, ts in times.items()},
                "float32_over_float64": round(
                    statistics.median(a / b for a, b in zip(times[names[0]], times[names[1]])), 3
                ),
                "same_outputs": outputs[names[0]] == outputs[names[1]],
            }
            decoding.append(row)
            print(json.dumps(row), flush=True)
    write_json_atomic(
        {
            **stamp(),
            "threads": args.threads,
            "rounds": args.rounds,
            "results": results,
            "decode_rounds": args.decode_rounds,
            "decode_tokens": args.decode_tokens,
            "decoding": decoding,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
