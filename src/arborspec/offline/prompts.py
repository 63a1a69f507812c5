"""Prompts for the offline tools (calibration, C2T training): never the evaluation sets.

A small built-in list of everyday and technical instructions, or a user file
(one prompt per line, or a JSON list of strings). The benchmark's prompt sets
(MT-Bench, HumanEval) are in `bench/prompts.py`; the training prompts of the
draft model and the draft head are built in `offline/corpus.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ArborError

# Everyday and technical instructions for calibration and classifier training. Not
# taken from MT-Bench or HumanEval (the evaluation sets).
CALIBRATION_PROMPTS: tuple[str, ...] = (
    "Explain how a refrigerator keeps food cold.",
    "Write a short poem about autumn leaves.",
    "Give three tips for learning a new language as an adult.",
    "What is the difference between weather and climate?",
    "Write a polite email asking a colleague to review a document.",
    "Describe the water cycle in simple terms.",
    "List some healthy breakfast ideas for busy mornings.",
    "How does a bicycle stay upright when it moves?",
    "Summarise the plot of a typical detective story.",
    "Write a Python function that reverses the words in a sentence.",
    "What are the pros and cons of working from home?",
    "Explain what a hash table is and why it is fast.",
    "Suggest a plan for a relaxing weekend in the countryside.",
    "Why is the sky blue?",
    "Write a short story about a robot who learns to paint.",
    "How do vaccines train the immune system?",
    "Give advice for someone preparing for their first job interview.",
    "Explain the rules of chess in a few sentences.",
    "What should I consider when adopting a dog?",
    "Describe how bread rises when it is baked.",
    "Compare trains and planes for travelling 500 kilometres.",
    "Explain recursion to a beginner programmer.",
    "Write a thank-you note to a teacher.",
    "How can a small team keep its meetings short and useful?",
)


def read_prompts(path: str | Path | None, limit: int) -> tuple[list[str], str]:
    """Prompts from a file (one per line, or a JSON list of strings), else the built-in list."""
    if path is None:
        return list(CALIBRATION_PROMPTS[:limit]), "arborspec.offline.prompts.CALIBRATION_PROMPTS"
    path = Path(path)
    if not path.is_file():
        raise ArborError(f"prompts file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        items = json.loads(text)
    except json.JSONDecodeError:
        items = [line.strip() for line in text.splitlines() if line.strip()]
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items) or not items:
        raise ArborError(
            f"prompts file {str(path)!r}: give one prompt per line or a JSON list of strings"
        )
    return items[:limit], str(path)
