"""How often batched greedy decoding on a float target gives what each request gives alone
(docs/algorithms.md §10, "Exactness").

    .venv/bin/python benchmarks/tools/batch_agreement.py --dtype float32 \
        --out benchmarks/results/batch-agreement-float32.json

The stratified MT-Bench questions (`--num-prompts`), `--max-new-tokens` each, temperature 0: every question
decoded alone by plain decoding (the reference), then all of them together, `--concurrency` at a time, by plain
batched decoding and by batched DySpec (`--budget` nodes + lookup 6, the draft head). Per way: the share of
questions whose tokens equal the reference, and where the others part (the first differing token's index, and
the reference row's gap between its two best logits there, to tell a rounding tie from a fault).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from arborspec import SpeculativeGenerator
from arborspec.bench.prompts import load_prompts
from arborspec.common.chat import encode_prompt


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def top2_gap(model, ids: list[int]) -> float:
    logits = model(torch.tensor([ids])).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--budget", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = SpeculativeGenerator(dtype=args.dtype, method="dyspec", budget=args.budget, lookup=6)
    prompts = load_prompts("mt-bench", args.num_prompts)
    ids = [encode_prompt(gen.tokenizer, p.turns[0], True) for p in prompts]
    alone = [gen.generate_autoregressive(i, max_new_tokens=args.max_new_tokens).output_ids for i in ids]
    ways = {
        "plain batched": lambda: gen.generate_autoregressive_batch(
            ids, max_new_tokens=args.max_new_tokens, max_requests=args.concurrency
        ),
        f"DySpec {args.budget} + lookup 6, batched": lambda: gen.generate_batch(
            ids, max_new_tokens=args.max_new_tokens, max_requests=args.concurrency
        ),
    }
    model = gen.pair.target.model
    result = {
        "command": f"benchmarks/tools/batch_agreement.py --dtype {args.dtype} --num-prompts {args.num_prompts} "
        f"--max-new-tokens {args.max_new_tokens} --concurrency {args.concurrency} --budget {args.budget}",
        "target": f"embedded SmolLM2-135M-Instruct, {args.dtype}, cpu",
        "ways": {},
    }
    for name, run in ways.items():
        outs = [r.output_ids for r in run()]
        parted = []
        for k, (mine, ref) in enumerate(zip(outs, alone)):
            i = first_difference(mine, ref)
            if i is not None:
                parted.append({"question": k, "token": i, "reference_top2_gap": top2_gap(model, ids[k] + ref[:i])})
        result["ways"][name] = {
            "identical": (len(outs) - len(parted)) / len(outs),
            "identical_count": len(outs) - len(parted),
            "questions": len(outs),
            "parted": parted,
        }
        print(name, result["ways"][name]["identical_count"], "/", len(outs), "identical", parted)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
