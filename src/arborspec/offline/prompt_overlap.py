"""Do training prompts overlap the benchmark sets? Exact matches and shared word n-grams.

The draft head must never train on benchmark prompts. Self-instructed prompts
(`self_instruct.py`) are written by the target, so nothing guarantees it by
construction; this check measures it after the fact:
`arborspec dev prompt-overlap --data-dir runs/head/data-self-instruct --out FILE`
compares every user message in the shards with MT-Bench's turns and HumanEval's prompts
(lower-cased, punctuation as spaces): exact matches, and messages sharing an n-word sequence
(default 8) with any benchmark text.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..common.jsonfiles import read_json_file


def words(text: str) -> list[str]:
    return re.sub(r"\W+", " ", text.lower()).split()


def ngrams(text: str, n: int) -> set[str]:
    w = words(text)
    return {" ".join(w[i : i + n]) for i in range(len(w) - n + 1)}


def benchmark_overlap(
    messages: list[str], references: dict[str, list[str]], n: int = 8, examples: int = 10
) -> dict:
    """Per reference set: messages equal to one of its texts, messages sharing an n-word sequence
    with one, and the first `examples` of the latter (to be read)."""
    out = {
        "messages": len(messages),
        "distinct": len(set(messages)),
        "mean_words": round(sum(len(words(m)) for m in messages) / max(len(messages), 1), 2),
        "ngram": n,
    }
    for name, texts in references.items():
        exact = {" ".join(words(t)) for t in texts}
        grams = set().union(*(ngrams(t, n) for t in texts)) if texts else set()
        sharing = [m for m in messages if ngrams(m, n) & grams]
        out[name] = {
            "texts": len(texts),
            "exact": sum(" ".join(words(m)) in exact for m in messages),
            "sharing_ngram": len(sharing),
            "examples": sharing[:examples],
        }
    return out


def benchmark_references() -> dict[str, list[str]]:
    """The benchmark texts training prompts must not overlap: every MT-Bench turn and every
    HumanEval prompt."""
    from ..common.datafiles import mt_bench_file, read_jsonl
    from .draft_quality import humaneval_prompts

    return {
        "mt_bench": [turn for row in read_jsonl(mt_bench_file()) for turn in row["turns"]],
        "humaneval": humaneval_prompts(),
    }


def shard_overlap(data_dir: str | Path, target: str = "embedded", n: int = 8) -> dict:
    """`benchmark_overlap` of the user messages in the head data shards of `data_dir` (rendered by
    `target`'s tokenizer), with `asked`: the user messages the stored batches asked for (the rest
    were not closed in time)."""
    from ..models import load_tokenizer
    from .head_data import load_head_data
    from .self_instruct import user_message

    data_dir = Path(data_dir)
    tok = load_tokenizer(target)
    seqs = load_head_data(data_dir)
    messages = [user_message(tok, s.tokens[: s.prompt_len].tolist()) for s in seqs]
    res = benchmark_overlap(messages, benchmark_references(), n)
    meta = read_json_file(data_dir / "meta.json", "head data file")
    res["asked"] = len(list(data_dir.glob("shard_*.safetensors"))) * meta["settings"]["batch_size"]
    return res
