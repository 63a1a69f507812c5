"""Prompt text -> token ids, the one way every tool does it, and the ids that end a generation.

Instruct models get their chat template (rendered to text, then tokenised
without adding special tokens again); with `chat=False`, or for a tokenizer
without a template, the text is tokenised as it is (turns joined by blank lines).
"""

from __future__ import annotations

from ..errors import ArborError


def encode_messages(tokenizer, messages: list[dict], chat: bool = True) -> list[int]:
    """Token ids for a conversation `[{"role": ..., "content": ...}, ...]`
    ending with a user turn."""
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer("\n\n".join(m["content"] for m in messages))["input_ids"]


def encode_prompt(tokenizer, prompt: str | list[int], chat: bool = True) -> list[int]:
    """Token ids for one user prompt (or the ids themselves); an empty prompt is an ArborError."""
    if isinstance(prompt, list):
        ids = [int(t) for t in prompt]
    else:
        if not prompt or not prompt.strip():
            raise ArborError("the prompt is empty: give some text to continue")
        ids = encode_messages(tokenizer, [{"role": "user", "content": prompt}], chat)
    if not ids:
        raise ArborError("the prompt is empty: give some text to continue")
    return ids


def eos_ids(tokenizer, model=None) -> tuple[int, ...]:
    """The tokenizer's EOS id and the model's generation-config EOS ids, sorted."""
    ids = set()
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if gen_eos is not None:
        ids.update([gen_eos] if isinstance(gen_eos, int) else gen_eos)
    return tuple(sorted(ids))
