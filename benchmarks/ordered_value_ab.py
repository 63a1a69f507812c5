"""Accepted length at T = 0 by the value temperature of ordered draws, on prompts of the training pool.

    .venv/bin/python benchmarks/ordered_value_ab.py --num-prompts 16 --budgets 16 8 --temperatures 1.0 0.9 0.8 0.7 \
        --out benchmarks/ordered-value-pool-s17.json

At target temperature 0 the builders that draw without replacement take each node's most likely draft tokens in
order and value them with the draft distribution at `SamplingConfig.value_temperature` (engine/sampling.py). This
script is where that temperature was chosen: the last prompts of the built-in training pool
(`offline/head_data.head_prompts`, never benchmark data), the int8 target and the shipped draft head, one decoder per
(budget, value temperature), no context lookup by default. Accepted length at T = 0 does not depend on timing, so
only it is reported; every output is checked token-identical to plain decoding. Speed against the old valuation is
an `arborspec bench` run with `value_temperature=1.0` beside the default (step 12 of benchmarks/reproduce-s16.sh).
"""

from __future__ import annotations

import argparse

import torch

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
    ap.add_argument("--lookup", type=int, default=0)
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair("embedded", "embedded-head", dtype="int8")
    target = pair.target
    eos = eos_ids(pair.tokenizer, target.model)
    prompts = [encode_prompt(pair.tokenizer, text, True) for text in head_prompts(6000)[-args.num_prompts:]]
    plain = [autoregressive_generate(target, ids, DecodeConfig(args.max_new_tokens, eos_token_ids=eos)).output_ids
             for ids in prompts]
    accepted = {}
    for budget in args.budgets:
        for temp in args.temperatures:
            cfg = DecodeConfig(args.max_new_tokens, sampling=SamplingConfig(0.0, value_temperature=temp), eos_token_ids=eos)
            dec = SpeculativeDecoder(target, pair.drafter, make_builder(args.method, budget=budget), lookup=args.lookup)
            tokens = steps = 0
            for i, (ids, ref) in enumerate(zip(prompts, plain)):
                out = dec.generate(ids, cfg)
                if out.output_ids != ref:
                    raise SystemExit(f"budget {budget}, value temperature {temp}: output differs from plain decoding "
                                     f"(prompt {i})")
                tokens, steps = tokens + len(out.output_ids), steps + len(out.steps)
            accepted[f"{args.method}:budget={budget}:lookup={args.lookup}, value temperature {temp}"] = round(tokens / steps, 3)
    report_json({"created": utc_timestamp(), "machine": machine_info(), "versions": versions(), "args": vars(args),
                 "prompts": "pool", "accepted_length": accepted, "greedy_identical": True}, args.out)


if __name__ == "__main__":
    main()
