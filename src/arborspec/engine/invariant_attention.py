"""Attention whose result for one query does not depend on the other queries of its forward.

Why (docs/algorithms.md §8): speculative verification is exact only if a tree node's
logits are the ones the model gives that token alone after its path. The BLAS and
SDPA kernels pick their blocking from the number of query rows, so in float32 the
same query row can come out a few units of 1e-6 apart in a forward of one token and
in a forward of sixteen. Float32 models shrug that off; an int8 model does not:
every linear re-quantises its input, a 1e-6 change that crosses a rounding step
moves an activation by a whole quantisation step, and thirty layers later a logit
moves by whole units.

This attention runs PyTorch's fused attention kernel in float64 (scores, softmax
and weighted sum) and rounds the result to the model's dtype once. The kernels still sum in their
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

import warnings

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from .packed_rows import from_grid, packed, to_grid

NAME = "arborspec_float64"


def float64_attention(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    group_queries: bool = True,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query `[B, H, Q, D]`, key/value `[B, Hkv, L, D]` -> output `[B, Q, H, D]`
    (transformers' layout).

    PyTorch's fused attention kernel in float64 (`attend_float64`; `group_queries` as there).
    In a packed batched forward (engine/packed_rows.py) the queries `[1, H, S, D]` are laid out
    over the batch `[B, H, N, D]` first, and the output is packed back to `[1, S, H, D]`; where
    the packing splits the attention, in two calls (`_split_attention`).
    """
    rows = packed(query.shape[2]) if query.shape[0] == 1 and key.shape[0] > 1 else None
    if rows is not None and rows.split is not None:
        return _split_attention(
            module, query, key, value, attention_mask, scaling, rows, group_queries
        )
    if rows is not None:
        out, _ = float64_attention(
            module, to_grid(query, rows.grid), key, value, attention_mask, scaling, dropout,
            group_queries,
        )
        return from_grid(out, rows.index), None
    q_len, length = query.shape[2], key.shape[2]
    mask = None
    if attention_mask is not None:
        mask = attention_mask[..., :length]
        mask = mask if mask.dtype == torch.bool else mask.double()
    # a prefill from an empty cache: the kernel's own causal masking, which skips the blocks
    # above the diagonal (the same float64 values up to summation order: module doc)
    elif q_len > 1 and q_len == length:
        return attend_float64(query, key, value, None, scaling, causal=True), None
    # plain causal chunk after the cache: query i sees keys up to position length - q_len + i
    elif q_len > 1:
        mask = (
            torch.arange(length, device=query.device)[None, :]
            <= torch.arange(length - q_len, length, device=query.device)[:, None]
        )
    return attend_float64(query, key, value, mask, scaling, group_queries), None


def _one_request(states: torch.Tensor, request: torch.Tensor) -> torch.Tensor:
    """Request `request`'s rows of `[B, ...]` states, a view (a TorchScript function: the request
    stays a value of a traced forward, engine/traced.py)."""
    b = int(request[0])
    return states[b : b + 1]


with warnings.catch_warnings():  # PyTorch's deprecation of TorchScript
    warnings.simplefilter("ignore")
    _one_request = torch.jit.script(_one_request)


def _split_attention(module, query, key, value, attention_mask, scaling, rows, group_queries):
    """A packed forward's attention in two calls (engine/packed_rows.py, `AttentionSplit`): every
    request's first M query slots over the whole batch, then the long tree's slots past M over its
    request's cache alone; the outputs packed back to `[1, S, H, D]`. Each query row attends over
    the same keys, values and mask row as in the grid (its float64 values the same up to
    summation order: module doc)."""
    split, mask = rows.split, attention_mask
    m = split.head.shape[1]
    head, _ = float64_attention(
        module, to_grid(query, split.head), key, value,
        None if mask is None else mask[:, :, :m], scaling, 0.0, group_queries,
    )
    tail, _ = float64_attention(
        module, to_grid(query, _one_request(rows.grid, split.request)[:, m:]),
        _one_request(key, split.request), _one_request(value, split.request),
        None if mask is None else _one_request(mask, split.request)[:, :, m:],
        scaling, 0.0, group_queries,
    )
    flat = torch.cat([head.flatten(0, 1), tail.flatten(0, 1)])
    return flat.index_select(0, split.index).unsqueeze(0), None


def attend_float64(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None,
    group_queries: bool = True,
    causal: bool = False,
) -> torch.Tensor:
    """The fused kernel in float64, rounded to the query's dtype once: `[B, Q, H, D]`.

    `causal` (no mask): query i sees keys 0..i, through the kernel's causal flag (a prefill).

    With several query rows and grouped-query heads (`group_queries`), the query heads that share
    a key/value head become rows of one attention over it (`[B, Hkv, H / Hkv * Q, D]`): the
    kernel then reads each key/value head once instead of once per query head, which is what a
    batch of trees pays for. Every query row's result
    is the same float64 computation either way up to the kernel's summation order, so it rounds
    to the same float32 value (module doc). One row (plain decoding) keeps the per-head call.
    """
    batch, heads, q_len, dim = query.shape
    groups, length = key.shape[1], key.shape[2]
    per_head_mask = mask is not None and mask.dim() == 4 and mask.shape[1] != 1
    grouped = group_queries and q_len > 1 and heads != groups and not per_head_mask and not causal
    q = query.double()
    if grouped:
        per = heads // groups
        q = q.reshape(batch, groups, per * q_len, dim)
        if mask is not None:
            mask = mask.expand(batch, per, q_len, length).reshape(batch, 1, per * q_len, length)
    out = F.scaled_dot_product_attention(
        q,
        key.double(),
        value.double(),
        attn_mask=mask,
        scale=scaling,
        is_causal=causal,
        enable_gqa=bool(not grouped and heads != groups),
    )
    return out.reshape(batch, heads, q_len, dim).to(query.dtype).transpose(1, 2).contiguous()


def use_float64_attention(model) -> None:
    """Register the attention (registering again is harmless) and switch `model` to it."""
    AttentionInterface.register(NAME, float64_attention)
    model.set_attn_implementation(NAME)
