"""Overlap of a self-instructed data stage with the benchmark sets, when its shards are no longer on disk.

    .venv/bin/python benchmarks/self_instruct_overlap_regen.py --seed 6 --batches 107 --openings \
        --out benchmarks/self-instruct-overlap-s15.json

`train-head --self-instruct` writes each batch's user messages with `offline/head_data.batch_queries`, seeded by the
data seed and the batch index only, on the float32 target. This script writes the same batches' messages again with it (no answers: a few seconds a batch instead of a minute) and
runs `offline/prompt_overlap.benchmark_overlap` on them. The count of closed messages is compared with the count
the stage recorded (`--expect`): equal counts say the regenerated messages are the stage's (same torch build and
kernels); the script says so in its output either way.
"""

from __future__ import annotations

import argparse
import time

import torch

from arborspec.common.chat import eos_ids
from arborspec.common.jsonfiles import report_json
from arborspec.models import load_model, load_tokenizer
from arborspec.offline.head_data import HeadDataConfig, batch_queries
from arborspec.offline.prompt_overlap import benchmark_overlap, benchmark_references


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--seed", type=int, required=True, help="the stage's train-head --seed")
    ap.add_argument("--batches", type=int, required=True, help="how many batches the stage generated (0 .. N-1)")
    ap.add_argument("--openings", action="store_true", help="the stage ran with --self-instruct-openings")
    ap.add_argument("--expect", type=int, default=0, help="closed messages the stage recorded (0: not checked)")
    ap.add_argument("--ngram", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = HeadDataConfig(seed=a.seed, query_openings=a.openings)
    tok = load_tokenizer(a.target)
    model = load_model(a.target, "cpu", "float32")
    end = set(eos_ids(tok, model))
    messages: list[str] = []
    t0 = time.time()
    for b in range(a.batches):
        messages += batch_queries(model, tok, cfg, b, cfg.batch_size, end)
        print(f"batch {b + 1}/{a.batches}: {len(messages)} messages, {time.time() - t0:.0f} s", flush=True)
    res = benchmark_overlap(messages, benchmark_references(), a.ngram)
    res |= {"asked": a.batches * cfg.batch_size, "seed": a.seed, "regenerated": True,
            "expected_messages": a.expect or None,
            "matches_stage_count": (len(messages) == a.expect) if a.expect else None}
    report_json(res, a.out)


if __name__ == "__main__":
    main()
