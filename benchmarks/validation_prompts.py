"""Write the validation slice of MT-Bench that tree sizes are chosen on, away from the benchmark's prompts.

    .venv/bin/python benchmarks/validation_prompts.py --out benchmarks/mtbench-validation.jsonl

`arborspec bench --prompts mt-bench --num-prompts 20` measures on MT-Bench's first 20 questions (writing and
roleplay). A fixed tree size picked on those same prompts would be tuned on the test set, so sizes are compared on
this file instead: every third of the other 60 questions (reasoning, math, coding, extraction, STEM, humanities;
20 prompts), all turns kept, in MT-Bench's order. `arborspec bench --prompts benchmarks/mtbench-validation.jsonl`
reads it like any prompt file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from arborspec.bench.prompts import load_prompts

BENCHMARK_PROMPTS = 20  # the first 20 questions: what `--num-prompts 20` measures
STRIDE = 3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/mtbench-validation.jsonl")
    a = ap.parse_args()
    chosen = load_prompts("mt-bench")[BENCHMARK_PROMPTS::STRIDE]
    lines = [json.dumps({"question_id": p.id, "category": p.category, "turns": p.turns}) for p in chosen]
    Path(a.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(chosen)} prompts ({', '.join(sorted({p.category for p in chosen}))}) -> {a.out}")


if __name__ == "__main__":
    main()
