"""The value temperature of ordered draws at T = 0, A/B in one process (docs/algorithms.md §7).

    .venv/bin/python benchmarks/ordered_value_ab.py --temperatures 1.0 0.8 --out benchmarks/ordered-value-ab-s17.json
    .venv/bin/python benchmarks/ordered_value_ab.py --prompts pool --num-prompts 16 --no-timing ...  # accepted lengths only

At target temperature 0 the builders that draw without replacement take each node's most likely draft tokens in
order and value them with the draft distribution at `SamplingConfig.value_temperature` (engine/sampling.py;
`arborspec bench -m dyspec:budget=8:value_temperature=1.0` sets it per method too). Per prompt, plain
decoding and one decoder per value temperature run one after the other on the same loaded int8 target and draft
head (interleaved, the decoders' order alternating from prompt to prompt), with the same builder; every output is
checked token-identical to plain decoding. Speedup = plain seconds per token / method seconds per token over all
prompts (every new token of every generation). `--prompts pool` takes the last prompts of the built-in training pool
(`offline/head_data.head_prompts`, never benchmark data): where the temperature was chosen.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from arborspec.bench.prompts import load_prompts
from arborspec.builders import make_builder
from arborspec.common.chat import encode_prompt, eos_ids
from arborspec.common.jsonfiles import report_json
from arborspec.common.provenance import machine_info, utc_timestamp, versions
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.sampling import SamplingConfig
from arborspec.models import load_pair
from arborspec.offline.head_data import head_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.8])
    ap.add_argument("--method", default="dyspec")
    ap.add_argument("--budgets", type=int, nargs="+", default=[8])
    ap.add_argument("--lookup", type=int, default=6)
    ap.add_argument("--prompts", choices=("mt-bench", "pool"), default="mt-bench")
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-timing", action="store_true", help="accepted lengths only (no plain-decoding timings kept)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair("embedded", "embedded-head", dtype="int8")
    target = pair.target
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, eos_token_ids=eos_ids(pair.tokenizer, target.model))
    if args.prompts == "pool":
        texts = head_prompts(6000)[-args.num_prompts:]
    else:
        texts = [p.turns[0] for p in load_prompts("mt-bench", args.num_prompts)]
    prompts = [encode_prompt(pair.tokenizer, text, True) for text in texts]
    arms = {(b, t): SpeculativeDecoder(target, pair.drafter, make_builder(args.method, budget=b), lookup=args.lookup)
            for b in args.budgets for t in args.temperatures}

    def run(arm, ids):
        return arms[arm].generate(ids, replace(cfg, sampling=SamplingConfig(0.0, value_temperature=arm[1])))

    for arm in arms:  # warm-up, untimed
        run(arm, prompts[0])
    seconds = {arm: 0.0 for arm in ["plain", *arms]}
    tokens = dict.fromkeys(seconds, 0)
    steps = dict.fromkeys(arms, 0)
    order = list(arms)
    for i, ids in enumerate(prompts):
        t0 = time.perf_counter()
        plain = autoregressive_generate(target, ids, cfg)
        seconds["plain"] += time.perf_counter() - t0
        tokens["plain"] += len(plain.output_ids)
        for arm in (order if i % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            out = run(arm, ids)
            seconds[arm] += time.perf_counter() - t0
            tokens[arm] += len(out.output_ids)
            steps[arm] += len(out.steps)
            if out.output_ids != plain.output_ids:
                raise SystemExit(f"{arm}: output differs from plain decoding (prompt {i})")
    label = lambda arm: f"{args.method}:budget={arm[0]}:lookup={args.lookup}, value temperature {arm[1]}"  # noqa: E731
    per_token = {arm: seconds[arm] / tokens[arm] for arm in seconds}
    result = {"created": utc_timestamp(), "machine": machine_info(), "versions": versions(), "args": vars(args),
              "accepted_length": {label(arm): round(tokens[arm] / steps[arm], 3) for arm in arms},
              "greedy_identical": True}
    if not args.no_timing:
        result["plain_ms_per_token"] = round(1e3 * per_token["plain"], 2)
        result["speedup_vs_plain"] = {label(arm): round(per_token["plain"] / per_token[arm], 3) for arm in arms}
    report_json(result, args.out)


if __name__ == "__main__":
    main()
