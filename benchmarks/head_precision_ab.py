"""The draft head's own precision, A/B in one process: float layers against int8 layers (docs/algorithms.md §6).

    .venv/bin/python benchmarks/head_precision_ab.py --dtype int8 --temperature 0 --out benchmarks/head-precision-ab-t0.json
    .venv/bin/python benchmarks/head_precision_ab.py --versions OLD_DIR NEW_DIR --out ...   # two heads instead

Both heads draft with int8 draft-vocabulary logits; the second also runs `fc` and its decoder layer in int8
(`DraftHead.quantize_layers`, the CPU default since the ninth session). Per prompt, plain decoding, the float-layer
head and the int8-layer head run one after the other on the same loaded target (interleaved, so machine drift hits
all three alike; the two heads' order alternates from prompt to prompt, since the one run right after plain decoding
measured 2-3 % faster in the fourteenth session), with the same builder; at temperature 0 every output is checked token-identical to plain
decoding. Speedup = plain seconds per token / method seconds per token over all prompts (tokens counted the same
way: every new token of every generation).
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
from arborspec.drafters.head import HeadDrafter, load_head
from arborspec.engine.decode import DecodeConfig, SpeculativeDecoder, autoregressive_generate
from arborspec.engine.sampling import sampling_config
from arborspec.models import load_pair, parse_dtype, resolve_head_dir


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="int8")
    ap.add_argument("--method", default="dyspec")
    ap.add_argument("--budget", default="8")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/head-precision-ab.json")
    ap.add_argument("--versions", nargs=2, metavar=("OLD", "NEW"),
                    help="instead: two head directories, both with int8 layers and logits (e.g. the previous shipped head)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    budget = int(args.budget) if args.budget.isdigit() else args.budget
    pair = load_pair("embedded", "ngram", dtype=args.dtype)  # the target; the heads are loaded below
    target, builder = pair.target, make_builder(args.method, budget=budget)
    head_dir = resolve_head_dir("embedded-head")
    dtype = parse_dtype(args.dtype)
    if args.versions:
        heads = {name: load_head(path, target.model, dtype, int8_logits=True, int8_layers=True)
                 for name, path in zip(("old head", "new head"), args.versions)}
    else:
        heads = {"float layers": load_head(head_dir, target.model, dtype, int8_logits=True),
                 "int8 layers": load_head(head_dir, target.model, dtype, int8_logits=True, int8_layers=True)}
    decoders = {name: SpeculativeDecoder(target, HeadDrafter(head), builder) for name, head in heads.items()}
    sample = args.temperature > 0
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, seed=0, eos_token_ids=eos_ids(pair.tokenizer, target.model),
                       sampling=sampling_config(sample, args.temperature if sample else 1.0, 0, 1.0))
    prompts = [encode_prompt(pair.tokenizer, p.turns[0], True) for p in load_prompts("mt-bench", args.num_prompts)]
    for dec in decoders.values():  # warm-up, untimed
        dec.generate(prompts[0], cfg)
    seconds = {name: 0.0 for name in ["plain", *decoders]}
    tokens = dict.fromkeys(seconds, 0)
    accepted: dict[str, list[float]] = {name: [] for name in decoders}
    order = list(decoders)
    for i, ids in enumerate(prompts):
        t0 = time.perf_counter()
        plain = autoregressive_generate(target, ids, cfg)
        seconds["plain"] += time.perf_counter() - t0
        tokens["plain"] += len(plain.output_ids)
        for name in (order if i % 2 == 0 else order[::-1]):  # alternate which head runs right after plain decoding
            dec = decoders[name]
            t0 = time.perf_counter()
            out = dec.generate(ids, cfg)
            seconds[name] += time.perf_counter() - t0
            tokens[name] += len(out.output_ids)
            accepted[name].append(out.mean_accepted_length)
            if not sample and out.output_ids != plain.output_ids:
                raise SystemExit(f"{name}: output differs from plain decoding (prompt {ids[:8]}...)")
    per_token = {name: seconds[name] / tokens[name] for name in seconds}
    result = {"created": utc_timestamp(), "machine": machine_info(), "versions": versions(), "args": vars(args),
              "tokens_per_s": {name: round(1 / t, 2) for name, t in per_token.items()},
              "speedup_vs_plain": {name: round(per_token["plain"] / per_token[name], 3) for name in decoders},
              "mean_accepted_length": {name: round(statistics.mean(v), 3) for name, v in accepted.items()},
              "greedy_identical": not sample}
    report_json(result, args.out)


if __name__ == "__main__":
    main()
