"""Batched generation with the target for the offline tools: left-padded batches for `model.generate`."""

from __future__ import annotations

import torch


def pad_token_id(tokenizer) -> int:
    """The tokenizer's padding id, else its EOS id (many causal LMs have no pad token)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`[B, W]` input ids padded on the left (so every row ends at its last prompt token) and the attention mask."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask


def cut_at_eos(tokens: list[int], eos: set[int]) -> list[int]:
    """`tokens` up to and including the first EOS."""
    for j, t in enumerate(tokens):
        if t in eos:
            return tokens[: j + 1]
    return tokens
