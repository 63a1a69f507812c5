"""A draft model's vocabulary cut to the frequent tokens (FR-Spec, docs/algorithms.md §6, "Reduced
draft vocabulary"): the `size` tokens most frequent in a reference text as the pair's tokenizer
splits it, plus every special token. A request's own context tokens join it for that request
(`drafters/model.py`), so identifiers and names a prompt introduces stay draftable.

The reference text is the Python standard library's source (code, comments and docstrings: prose
and code), which every Python installation has; nothing of it comes from a benchmark set. The
ranking is computed once per tokenizer (a few tens of seconds) and kept as a JSON list of token ids
by descending count in `cache_dir`, under a name of the tokenizer's vocabulary's digest.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from collections import Counter
from pathlib import Path

from ..common.jsonfiles import write_json_atomic

# folders of the standard library left out of the reference text: tests and bundled apps
SKIPPED_PARTS = {"test", "tests", "idlelib", "site-packages", "turtledemo", "lib2to3"}


def reference_files() -> list[Path]:
    """The standard library's source files the counts are taken over, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if not SKIPPED_PARTS & set(p.parts))


def vocabulary_digest(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


def ranked_tokens(tokenizer, cache_dir: Path | None = None) -> list[int]:
    """Token ids of the reference text by descending count (ties by id); cached in `cache_dir`."""
    cache = None if cache_dir is None else Path(cache_dir) / f"{vocabulary_digest(tokenizer)}.json"
    if cache is not None and cache.is_file():
        return json.loads(cache.read_text())
    counts: Counter[int] = Counter()
    for path in reference_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        counts.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    ranked = [token for token, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
    if cache is not None:
        write_json_atomic(ranked, cache, indent=None)
    return ranked


def frequent_tokens(tokenizer, size: int, cache_dir: Path | None = None) -> list[int]:
    """The draft vocabulary: the `size` most frequent tokens of the reference text and every
    special or added token of `tokenizer` (sorted ids)."""
    keep = set(ranked_tokens(tokenizer, cache_dir)[:size])
    keep |= set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    return sorted(keep)
