"""The greedy screen (docs/algorithms.md §7), A/B in one process: full float32 LM-head rows against the screen.

    .venv/bin/python benchmarks/greedy_screen_ab.py --dtype int8 --out benchmarks/greedy-screen-ab-int8.json

Temperature 0 only (sampling reads full rows either way). Per prompt, plain decoding and a tree method run with
the screen off (every greedy token from the full row, as before the tenth session) and on, one after the other
on the same loaded target and draft (interleaved, so machine drift hits all four alike); every output is checked
token-identical to plain decoding with the screen off. Speedups = seconds per token over all prompts (every new
token of every generation counted), each against plain decoding *with the same setting*, plus the screen's own
gain on each.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from arborspec.bench.prompts import load_prompts
from arborspec.builders import make_builder
from arborspec.common.chat import encode_prompt, eos_ids
from arborspec.common.jsonfiles import report_json
from arborspec.common.provenance import machine_info, utc_timestamp, versions
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.sampling import sampling_config
from arborspec.models import load_pair


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="int8")
    ap.add_argument("--method", default="dyspec")
    ap.add_argument("--budget", default="8")
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/greedy-screen-ab.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    budget = int(args.budget) if args.budget.isdigit() else args.budget
    pair = load_pair("embedded", None, dtype=args.dtype)
    target, head_rows = pair.target, pair.target.head
    screen = head_rows.screen
    if screen is None:
        raise SystemExit("no greedy screen for this target (a float32 or int8 CPU head is needed)")
    decoder = SpeculativeDecoder(target, pair.drafter, make_builder(args.method, budget=budget))
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, seed=0, eos_token_ids=eos_ids(pair.tokenizer, target.model),
                       sampling=sampling_config(False, 1.0, 0, 1.0))
    prompts = [encode_prompt(pair.tokenizer, p.turns[0], True) for p in load_prompts("mt-bench", args.num_prompts)]
    runs = {"plain": lambda ids: autoregressive_generate(target, ids, cfg), args.method: lambda ids: decoder.generate(ids, cfg)}
    names = [f"{kind}, screen {state}" for kind in runs for state in ("off", "on")]
    for name in names:  # warm-up, untimed
        head_rows.screen = screen if name.endswith("on") else None
        runs[name.split(",")[0]](prompts[0])
    seconds, tokens = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0)
    accepted: dict[str, list[float]] = {name: [] for name in names}
    for ids in prompts:
        reference = None
        for name in names:
            head_rows.screen = screen if name.endswith("on") else None
            t0 = time.perf_counter()
            out = runs[name.split(",")[0]](ids)
            seconds[name] += time.perf_counter() - t0
            tokens[name] += len(out.output_ids)
            accepted[name].append(out.mean_accepted_length)
            if reference is None:
                reference = out.output_ids
            elif out.output_ids != reference:
                raise SystemExit(f"{name}: output differs from plain decoding with the screen off (prompt {ids[:8]}...)")
    head_rows.screen = screen
    per_token = {name: seconds[name] / tokens[name] for name in names}
    result = {"created": utc_timestamp(), "machine": machine_info(), "versions": versions(), "args": vars(args),
              "ms_per_token": {name: round(1e3 * t, 2) for name, t in per_token.items()},
              "screen_speedup": {kind: round(per_token[f"{kind}, screen off"] / per_token[f"{kind}, screen on"], 3)
                                 for kind in runs},
              "speedup_vs_plain_same_setting": {
                  state: round(per_token[f"plain, screen {state}"] / per_token[f"{args.method}, screen {state}"], 3)
                  for state in ("off", "on")},
              "mean_accepted_length": round(statistics.mean(accepted[f"{args.method}, screen on"]), 3),
              "greedy_identical": True}
    report_json(result, args.out)


if __name__ == "__main__":
    main()
