"""Batched generation with the target for the offline tools: prompts encoded and left-padded for
`model.generate`, greedy or sampled batches chosen by a seeded coin, answers cut at EOS."""

from __future__ import annotations

import random

import torch

from ..common.chat import encode_prompt


def pad_token_id(tokenizer) -> int:
    """The tokenizer's padding id, else its EOS id (many causal LMs have no pad token)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def encode_prompts(tokenizer, prompts: list[str], max_tokens: int) -> list[list[int]]:
    """Each prompt through the chat template (`common/chat.py`), its last `max_tokens` tokens."""
    return [encode_prompt(tokenizer, p)[-max_tokens:] for p in prompts]


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`[B, W]` input ids padded on the left (so every row ends at its last prompt token) and the
    attention mask."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


def sampling_kwargs(temperature: float) -> dict:
    """`model.generate` keywords: plain sampling at `temperature` (no top-k or top-p cut), greedy
    at 0."""
    if temperature > 0:
        return dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    return dict(do_sample=False)


def batch_is_sampled(seed: int, batch: int, sample_fraction: float) -> bool:
    """Whether data batch `batch` is sampled (else greedy): a coin seeded by the run's seed and the
    batch index alone, so a rerun that continues a data folder decides each remaining batch as the
    first run would have."""
    return random.Random(seed * 1_000_003 + batch).random() < sample_fraction


def batch_torch_seed(seed: int, batch: int) -> int:
    """The torch seed set before generating data batch `batch` (its sampled tokens, likewise)."""
    return seed * 7919 + batch


def cut_at_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """`tokens` up to and including the first EOS."""
    for j, t in enumerate(tokens):
        if t in eos:
            return tokens[: j + 1]
    return tokens
