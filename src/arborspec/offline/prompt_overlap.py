"""Do training prompts overlap the benchmark sets? Exact matches and shared word n-grams.

The draft head must never train on benchmark prompts. Self-instructed prompts
(`self_instruct.py`) are written by the target, so nothing guarantees it by
construction; this check measures it after the fact:
`python -m arborspec.offline.prompt_overlap --data-dir runs/head/data-self-instruct --out FILE`
compares every user message in the shards with MT-Bench's turns and HumanEval's prompts (lower-cased, punctuation
as spaces): exact matches, and messages sharing an n-word sequence (default 8) with any benchmark text.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from ..common.jsonfiles import report_json


def words(text: str) -> list[str]:
    return re.sub(r"\W+", " ", text.lower()).split()


def ngrams(text: str, n: int) -> set[str]:
    w = words(text)
    return {" ".join(w[i:i + n]) for i in range(len(w) - n + 1)}


def benchmark_overlap(messages: list[str], references: dict[str, list[str]], n: int = 8, examples: int = 10) -> dict:
    """Per reference set: messages equal to one of its texts, messages sharing an n-word sequence with one, and the
    first `examples` of the latter (to be read)."""
    out = {"messages": len(messages), "distinct": len(set(messages)),
           "mean_words": round(sum(len(words(m)) for m in messages) / max(len(messages), 1), 2), "ngram": n}
    for name, texts in references.items():
        exact = {" ".join(words(t)) for t in texts}
        grams = set().union(*(ngrams(t, n) for t in texts)) if texts else set()
        sharing = [m for m in messages if ngrams(m, n) & grams]
        out[name] = {"texts": len(texts), "exact": sum(" ".join(words(m)) in exact for m in messages),
                     "sharing_ngram": len(sharing), "examples": sharing[:examples]}
    return out


def benchmark_references() -> dict[str, list[str]]:
    """The benchmark texts training prompts must not overlap: every MT-Bench turn and every HumanEval prompt."""
    from ..common.datafiles import mt_bench_file, read_jsonl
    from .draft_quality import humaneval_prompts

    return {"mt_bench": [turn for row in read_jsonl(mt_bench_file()) for turn in row["turns"]],
            "humaneval": humaneval_prompts()}


def main(argv=None) -> int:
    from ..models import load_tokenizer
    from .head_data import load_head_data
    from .self_instruct import user_message

    p = argparse.ArgumentParser(prog="python -m arborspec.offline.prompt_overlap", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True, help="head data shards (train-head's <work>/data-self-instruct)")
    p.add_argument("--target", default="embedded", help="whose tokenizer rendered the prompts")
    p.add_argument("--ngram", type=int, default=8)
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    tok = load_tokenizer(a.target)
    messages = [user_message(tok, s.tokens[:s.prompt_len].tolist()) for s in load_head_data(Path(a.data_dir))]
    res = benchmark_overlap(messages, benchmark_references(), a.ngram)
    shards = len(list(Path(a.data_dir).glob("shard_*.safetensors")))
    batch = json.loads((Path(a.data_dir) / "meta.json").read_text())["settings"]["batch_size"]
    res["asked"] = shards * batch  # user messages asked for in the stored batches (the rest were not closed in time)
    report_json(res, a.out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
