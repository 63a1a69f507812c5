"""How far the int8 target (`--dtype int8`, docs/algorithms.md §8) is from the float32 one.

    .venv/bin/python benchmarks/tools/int8_quality.py --out benchmarks/results/int8-quality.json

Int8 is a different target: speculative decoding reproduces *it* exactly, not the float32 model. This reports
what a user gives up for its speed, on text the int8 calibration never saw:

* teacher-forced, on human-written code (HumanEval prompt + canonical solution, 164 samples): how often the int8
  model's greedy token equals float32's, and both perplexities;
* free-running, on MT-Bench first turns (chat template, greedy): how many of the first `--max-new-tokens` tokens
  the int8 model generates identically to float32 before the first difference, and how often all of them match.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from arborspec.bench.prompts import load_prompts
from arborspec.common.chat import encode_prompt
from arborspec.common.datafiles import humaneval_file, read_jsonl
from arborspec.common.provenance import machine_info, utc_timestamp, versions
from arborspec.engine.adapter import ModelAdapter
from arborspec.engine.decode import DecodeConfig, autoregressive_generate
from arborspec.models import load_model, load_tokenizer


def teacher_forced(fp32, int8, tokenizer) -> dict:
    agree = total = 0
    nll = {"float32": 0.0, "int8": 0.0}
    with torch.inference_mode():
        for row in read_jsonl(humaneval_file()):
            prompt = tokenizer(row["prompt"])["input_ids"]
            ids = torch.tensor([prompt + tokenizer(row["canonical_solution"], add_special_tokens=False)["input_ids"]])
            answer = slice(len(prompt) - 1, ids.shape[1] - 1)  # positions predicting the solution's tokens
            targets = ids[0, len(prompt):]
            logits = {"float32": fp32(ids).logits[0, answer], "int8": int8(ids).logits[0, answer]}
            agree += int((logits["float32"].argmax(-1) == logits["int8"].argmax(-1)).sum())
            total += targets.numel()
            for name, lg in logits.items():
                nll[name] += float(F.cross_entropy(lg.float(), targets, reduction="sum"))
    return {"text": "HumanEval prompt + canonical solution (164, human-written)", "tokens": total,
            "greedy_agreement": round(agree / total, 4),
            "perplexity": {name: round(math.exp(v / total), 3) for name, v in nll.items()}}


def free_running(fp32, int8, tokenizer, num_prompts: int, new_tokens: int) -> dict:
    cfg = DecodeConfig(max_new_tokens=new_tokens)
    prefixes, position_agree, total = [], 0, 0
    for prompt in load_prompts("mt-bench", num_prompts):
        ids = encode_prompt(tokenizer, prompt.turns[0])
        a = autoregressive_generate(ModelAdapter(fp32), ids, cfg).output_ids
        b = autoregressive_generate(ModelAdapter(int8), ids, cfg).output_ids
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefixes.append(same)
        position_agree += sum(x == y for x, y in zip(a, b))
        total += len(a)
        print(f"  {prompt.id}: identical for {same}/{len(a)} tokens", flush=True)
    return {"prompts": "MT-Bench first turns", "num_prompts": len(prefixes), "max_new_tokens": new_tokens,
            "mean_identical_prefix": round(sum(prefixes) / len(prefixes), 2),
            "all_identical": round(sum(p == new_tokens for p in prefixes) / len(prefixes), 3),
            "identical_prefixes": prefixes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/int8-quality.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    tokenizer = load_tokenizer(args.target)
    fp32, int8 = load_model(args.target, "cpu", "float32"), load_model(args.target, "cpu", "int8")
    result = {"created": utc_timestamp(), "machine": machine_info(), "versions": versions(), "args": vars(args),
              "teacher_forced": teacher_forced(fp32, int8, tokenizer)}
    print(json.dumps(result["teacher_forced"]), flush=True)
    result["free_running"] = free_running(fp32, int8, tokenizer, args.num_prompts, args.max_new_tokens)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["free_running"]))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
