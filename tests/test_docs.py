"""What the documents say holds: README.md stays short (README_MAX_LINES); README.md, ARCHITECTURE.md,
docs/*.md, benchmarks/README.md and every module docstring under src/arborspec describe the software as it
is, with no dates, no commit hashes and no history ("previously", "the code before", ...); and every
benchmark result that README.md or benchmarks/README.md quotes exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250

DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
# a commit hash, whole or abbreviated: 7 to 40 hex digits as a word, a digit and a letter among them
HASH = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", re.I)
# how the software changed rather than what it does ("is used to", "would no longer" describe it)
HISTORY = re.compile(r"\b(the code before|previously|formerly|(?<!\bis )(?<!\bare )(?<!\bbe )used to"
                     r"|(?<!\bwould )no longer)\b", re.I)
PATTERNS = {"a date": DATE, "a commit hash": HASH, "history": HISTORY}


def documents() -> dict[str, str]:
    """README.md, ARCHITECTURE.md, docs/*.md, benchmarks/README.md and the module docstrings under
    src/arborspec, by name, with their whitespace runs as single spaces (a phrase may wrap)."""
    paths = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md")),
             ROOT / "benchmarks" / "README.md"]
    texts = {str(path.relative_to(ROOT)): path.read_text() for path in paths}
    for path in sorted((ROOT / "src" / "arborspec").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        if doc:
            texts[f"{path.relative_to(ROOT)} (module docstring)"] = doc
    return {name: " ".join(text.split()) for name, text in texts.items()}


def findings(pattern: re.Pattern, texts: dict[str, str]) -> list[str]:
    return [f"{name}: {m.group()!r} in ...{text[max(0, m.start() - 60):m.end() + 40]}..."
            for name, text in texts.items() for m in pattern.finditer(text)]


def test_readme_is_short():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, more than {README_MAX_LINES}: move detail to docs/"


@pytest.mark.parametrize("what", PATTERNS)
def test_documents_describe_the_software_as_it_is(what):
    found = findings(PATTERNS[what], documents())
    assert not found, f"{what} in the documents (describe the software as it is):\n" + "\n".join(found)


@pytest.mark.parametrize("text,what", [
    ("measured 2026-11-22 on the VM", "a date"),
    ("fixed in 3f2a9c1", "a commit hash"),
    ("see commit 0123456789abcdef0123456789abcdef01234567", "a commit hash"),
    ("takes 0.57x the time of the code before", "history"),
    ("it previously kept", "history"),
    ("the engine used to copy rows", "history"),
    ("uneven trees no longer add padded rows", "history"),
])
def test_the_checks_find_dates_hashes_and_history(text, what):
    assert [name for name, pattern in PATTERNS.items() if pattern.search(text)] == [what], text


def test_the_checks_leave_descriptions_alone():
    text = ("SmolLM2-135M-Instruct, 3.11-3.23 ms, the SHA-256 of each part, deadbeef, 1234567, a mask is used to "
            "select rows, rows would no longer sit at their positions, bfloat16, Qwen2.5-0.5B")
    assert not [m.group() for pattern in PATTERNS.values() for m in pattern.finditer(text)]


# a quoted path: benchmarks/results/... anywhere; results/... in benchmarks/README.md (relative to benchmarks/)
QUOTED = {"README.md": (re.compile(r"benchmarks/results/[\w.*/-]*"), ROOT),
          "benchmarks/README.md": (re.compile(r"(?<![\w/])(?:benchmarks/)?results/[\w.*/-]*"), ROOT / "benchmarks")}


@pytest.mark.parametrize("doc", QUOTED)
def test_quoted_benchmark_results_exist(doc):
    pattern, base = QUOTED[doc]
    missing = set()
    for quoted in pattern.findall((ROOT / doc).read_text()):
        path = quoted.rstrip(".")
        where = ROOT if path.startswith("benchmarks/") else base
        if not any(where.glob(path.rstrip("/"))):
            missing.add(path)
    assert not missing, f"{doc} quotes results that do not exist: {sorted(missing)}"
