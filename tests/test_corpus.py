"""The training prompt corpora (`offline/corpus.py`) are pinned: a seed gives the same prompts.

The shipped draft model and draft head were trained on these corpora, so a change to them changes
what retraining produces. The topic and arithmetic prompts depend on the seed alone and are pinned
exactly everywhere; the prompts harvested from the standard library's docstrings depend on the
Python version, so their exact values are pinned for the Python minor version they were taken with,
and are read in a fresh interpreter: a library another test imported may have replaced a standard-library
function (gRPC, which Ray imports, replaces `inspect.isgenerator` with an undocumented wrapper).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
from arborspec.offline.corpus import task_prompts, topic_prompts

PINNED_PYTHON = (3, 11)
same_python = pytest.mark.skipif(sys.version_info[:2] != PINNED_PYTHON,
                                 reason="standard-library docstrings differ between versions")


def fresh(call: str) -> tuple[list[str], str]:
    """`call` (a function of offline/corpus.py with its arguments) in a fresh interpreter: (its prompts, what it
    printed on stderr)."""
    code = f"import json; from arborspec.offline import corpus; print(json.dumps(corpus.{call}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout), done.stderr


def digest(prompts: list[str]) -> str:
    return hashlib.sha256("\n".join(prompts).encode()).hexdigest()[:16]


def test_topic_prompts_are_pinned():
    prompts = topic_prompts(0)
    assert len(prompts) == 3136 and digest(prompts) == "7e420a9812762925"
    assert prompts[:2] == ["Explain photosynthesis in simple terms.",
                           "Give me five practical tips about photosynthesis."]
    compare = "Compare {} and {}: how are they similar and how are they different?"
    assert prompts[12] == compare.format("photosynthesis", "nuclear power")
    assert prompts[28] == compare.format("black holes", "vaccines")
    other = topic_prompts(5)  # the seed picks the second topic of each comparison
    assert other[12] == compare.format("photosynthesis", "prime numbers")
    assert digest(other) == "109166bf45a72c78"


def test_arithmetic_prompts_are_pinned():
    arithmetic = task_prompts(0)[-600:]
    assert arithmetic[0] == ("A train travels 245 km in 7 hours. "
                             "At the same speed, how far does it travel in 15 hours?")
    assert arithmetic[-1] == ("Sofia saves $3 every week. How many weeks does it take to save $69, "
                              "and what if the weekly amount doubles?")
    assert digest(arithmetic) == "4ae2840cb06f6259"


@same_python
def test_stdlib_and_task_prompts_are_pinned():
    code = fresh("stdlib_prompts()")[0]
    assert len(code) == 1948 and digest(code) == "981acf343d86ed6b"
    assert code[:3] == [
        "Implement from scratch (without using `os.WCOREDUMP`) a Python function that does this: "
        "Return True if the process returning status was dumped to a core file.",
        "I found `os.WCOREDUMP` in some code. What is it for, and when should I use it?",
        "Explain what `os.WEXITSTATUS` does in Python and show a short example.",
    ]
    tasks = fresh("task_prompts(0)")[0]
    assert len(tasks) == 901 and digest(tasks) == "1bbc0a89e0e8189c"
    assert tasks[1] == ("Translate the following sentence into German:\n\nIt is derived from a "
                        "version of the externally maintained simplejson library.")


@same_python
def test_distillation_pool_is_pinned():
    prompts = fresh("distill_prompts(2000, seed=0)")[0]
    assert len(prompts) == 2000 and digest(prompts) == "be7ffb04a52f22f8"
    assert prompts[:5] == [
        "Compare recycling and hiking: how are they similar and how are they different?",
        "Write a Python function for the following task, with a short docstring: "
        "Codec used when reading a file in universal newlines mode.",
        "Implement from scratch (without using `decimal.DivisionImpossible`) a Python function "
        "that does this: Base class for arithmetic errors.",
        "What are common misconceptions about meditation?",
        "I found `re.error` in some code. What is it for, and when should I use it?",
    ]


@same_python
def test_head_pool_is_pinned():
    prompts, err = fresh("head_prompts(6000, seed=0)")
    assert len(prompts) == 5957 and digest(prompts) == "e99c380b83fc2dff"
    assert "only 5957 distinct prompts available (asked for 6000)" in err
    assert prompts[2:5] == [
        "Write three quiz questions with answers about sleep.",
        'Translate the following sentence into Spanish:\n\nRFC 2368: "The mailto URL scheme", '
        "by P.Hoffman , L Masinter, J.",
        "A class has 40 students. 24 of them are absent and the rest sit in groups of 6. "
        "How many full groups are there, and how many students are left over?",
    ]
    assert fresh("head_prompts(10, seed=0)")[0] == prompts[:10]
