"""Attention whose result for one query does not depend on the other queries of its forward.

Why (docs/algorithms.md §8): speculative verification is exact only if a tree node's
logits are the ones the model gives that token alone after its path. The BLAS and
SDPA kernels pick their blocking from the number of query rows, so in float32 the
same query row can come out a few units of 1e-6 apart in a forward of one token and
in a forward of sixteen. Float32 models shrug that off; an int8 model does not:
every linear re-quantises its input, a 1e-6 change that crosses a rounding step
moves an activation by a whole quantisation step, and thirty layers later a logit
moves by whole units.

This attention computes the scores, the softmax and the weighted sum in float64
and rounds the result to the model's dtype once. The kernels still sum in their
own order, but the float64 results differ in the 16th digit, and rounding to
float32 maps them to the same value unless one lies within about 1e-16 (relative)
of a float32 rounding boundary. With the int8 linears of `engine/int8.py`, which
are exact per row, a tree forward's hidden states then equal plain decoding's
bit for bit (tests/test_int8.py checks 0.0 difference).

It is registered with transformers' `AttentionInterface` under `NAME` and chosen
with `model.set_attn_implementation(NAME)`: the modelling code stays unmodified.
Masks: the 4D additive mask the adapter passes (tree attention), a boolean mask,
or none (plain causal: query i sees every key up to its own position).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface

NAME = "arborspec_float64"


def float64_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None,
                      dropout: float = 0.0, **kwargs) -> tuple[torch.Tensor, None]:
    """query `[B, H, Q, D]`, key/value `[B, Hkv, L, D]` -> output `[B, Q, H, D]` (transformers' layout)."""
    b, heads, q_len, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    group = heads // kv_heads  # query head h reads kv head h // group (grouped-query attention)
    q = query.reshape(b, kv_heads, group * q_len, dim).double()
    scores = torch.matmul(q, key.double().transpose(-1, -2)).view(b, kv_heads, group, q_len, length)
    scores = scores * (scaling if scaling is not None else dim ** -0.5)
    if attention_mask is not None:
        mask = attention_mask[..., :length].unsqueeze(2)  # [B, 1, 1, Q, L]
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.double()
    elif q_len > 1:  # plain causal chunk after the cache
        visible = torch.arange(length, device=query.device)[None, :] <= torch.arange(
            length - q_len, length, device=query.device)[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).view(b, kv_heads, group * q_len, length)
    out = torch.matmul(probs, value.double()).view(b, heads, q_len, dim)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def use_float64_attention(model) -> None:
    """Register the attention (registering again is harmless) and switch `model` to it."""
    AttentionInterface.register(NAME, float64_attention)
    model.set_attn_implementation(NAME)
