"""Chat-like prompts written by the target itself (self-instruct from the chat
template's user turn).

An instruct model has learned what users ask: given its chat template up to the
opening of a user turn (`<|im_start|>user\\n` after the default system turn, for
SmolLM2) and nothing else, sampling it writes a user's message and closes the
turn with its end-of-turn token. This is the idea of Magpie (Xu et al., 2024);
the project uses it because the draft head's training prompts must be chat-like
(the benchmarks are chat) and must never be benchmark data: no prompt set is
read at all, the target writes its own.

Only queries the model closes within `max_tokens` are kept (an unclosed one is
usually rambling); each kept query is then answered through the normal chat
template (`common/chat.py`), exactly as a user's prompt is, by `head_data.py`.

**Openings** (`openings=True`): left alone, the model mostly writes short
questions. Each message can instead be started with one of `OPENINGS`, generic
first words of requests of many kinds (writing, role-play, explanation,
advice, reasoning, coding, editing; written for this project, not taken from
any prompt set), chosen per message by the seed; the model writes the rest.
"""

from __future__ import annotations

import random

import torch

from ..errors import ArborError
from .generation import left_padded, pad_token_id, sampling_kwargs

_MARK = "\x00arborspec-user-message\x00"

OPENINGS = (
    "Write",
    "Write a short",
    "Compose",
    "Draft",
    "Imagine you are",
    "Pretend to be",
    "Act as",
    "You are",
    "Describe",
    "Explain",
    "Summarize",
    "Rewrite",
    "Give me",
    "Help me",
    "Can you",
    "Could you",
    "What",
    "Why",
    "How",
    "Which",
    "Suppose",
    "Create",
    "List",
    "Compare",
    "Tell me",
    "Plan",
    "Solve",
    "Edit",
    "Brainstorm",
    "I am",
    "I need",
    "Please",
)


def user_turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template rendered up to where a user's message starts."""
    if not getattr(tokenizer, "chat_template", None):
        raise ArborError(
            "self-instructed prompts need a tokenizer with a chat template: "
            "use --self-instruct 0 for this target"
        )
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _MARK}], tokenize=False, add_generation_prompt=False
    )
    if _MARK not in text:
        raise ArborError(
            "the chat template does not show the user's message verbatim: use --self-instruct 0"
        )
    ids = tokenizer(text[: text.index(_MARK)], add_special_tokens=False)["input_ids"]
    if not ids:
        raise ArborError(
            "the chat template opens a user turn with no tokens: use --self-instruct 0"
        )
    return ids


@torch.inference_mode()
def write_queries(
    model,
    tokenizer,
    n: int,
    seed: int,
    end_ids: set[int],
    max_tokens: int = 64,
    temperature: float = 1.0,
    openings: bool = False,
) -> list[str]:
    """Up to `n` user messages sampled from `model` after the user-turn prefix (and, with
    `openings`, a first word or two from `OPENINGS` per message); the unclosed and
    empty ones are dropped."""
    prefix = user_turn_prefix(tokenizer)
    starts = [""] * n
    if openings:
        rng = random.Random(seed)
        starts = [rng.choice(OPENINGS) for _ in range(n)]
    rows = [
        prefix + (tokenizer(s, add_special_tokens=False)["input_ids"] if s else []) for s in starts
    ]
    pad = pad_token_id(tokenizer)
    ids, mask = left_padded(rows, pad)
    torch.manual_seed(seed)
    out = model.generate(
        input_ids=ids.to(model.device),
        attention_mask=mask.to(model.device),
        max_new_tokens=max_tokens,
        pad_token_id=pad,
        **sampling_kwargs(temperature),
    )
    queries = []
    for start, row in zip(starts, out[:, ids.shape[1] :].tolist()):
        end = next((j for j, t in enumerate(row) if t in end_ids), None)
        if end is None:
            continue
        text = (start + tokenizer.decode(row[:end], skip_special_tokens=True)).strip()
        if text and text != start:
            queries.append(text)
    return queries


def user_message(tokenizer, prompt_ids: list[int]) -> str:
    """The user's message inside a prompt that `common/chat.py` rendered through the chat
    template (its inverse)."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _MARK}], tokenize=False, add_generation_prompt=True
    )
    before, after = text.split(_MARK)
    rendered = tokenizer.decode(prompt_ids)
    if not (rendered.startswith(before) and rendered.endswith(after)):
        raise ArborError(
            "this prompt was not rendered through the tokenizer's chat template with one user turn"
        )
    return rendered[len(before) : len(rendered) - len(after)]
