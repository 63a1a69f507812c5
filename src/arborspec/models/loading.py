"""A target/draft pair loaded by name (`load_pair`): the one entry point of the API, the CLI, the
offline tools and the benchmark; `check_pair`, what it refuses before anything loads."""

from __future__ import annotations

import os

from ..catalog import EMBEDDED_TARGET
from ..engine.adapter import ModelAdapter
from .device_map import placement_kwargs
from .hf import load_model, load_tokenizer
from .loaded import pair_from_models
from .names import default_draft, is_draft_model, resolve_model_path
from .pair import ModelPair, named_drafter
from .precision import check_precision, head_int8


def check_pair(
    target: str = EMBEDDED_TARGET,
    draft: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    device_map: str | dict | None = None,
    max_memory: str | dict | None = None,
    offload_folder: str | os.PathLike | None = None,
    draft_logits: str = "auto",
) -> tuple[dict, bool]:
    """What `load_pair` refuses before loading anything (one-line ArborErrors): a bad placement, a
    precision the device cannot run, a bad `draft_logits`, a local target or draft path that does
    not exist. Returns what loading then uses: the placement keywords and whether a draft head
    runs in int8."""
    draft = draft or default_draft(target)
    placement = placement_kwargs(device_map, max_memory, offload_folder)
    check_precision(dtype, device, placement)
    int8_head = head_int8(draft_logits, device, bool(placement))
    if is_draft_model(draft):
        resolve_model_path(draft)
    if target != EMBEDDED_TARGET:  # the embedded target is converted on first use: not here
        resolve_model_path(target)
    return placement, int8_head


def load_pair(
    target: str = EMBEDDED_TARGET,
    draft: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    device_map: str | dict | None = None,
    max_memory: str | dict | None = None,
    offload_folder: str | os.PathLike | None = None,
    draft_logits: str = "auto",
    compile: bool = False,
    tokenizer=None,
) -> ModelPair:
    """Load the target and the drafter.

    `target` may also be a loaded model (then `draft` may be a loaded draft model or `DraftHead`
    too, `tokenizer` is the target's, and device, dtype and placement are the model's own:
    `pair_from_models`).

    `draft`: a draft-head directory or "embedded-head" (EAGLE-style head on the target's features),
    a draft model id/dir or "embedded-draft", or "ngram".
    `device_map`, `max_memory`, `offload_folder`: place the target with accelerate (larger than
    memory: offloaded to the CPU or disk; see `placement_kwargs`); a draft model goes to the
    target's execution device.
    `draft_logits`: the precision a draft head computes in, its layer and its logits: "auto" (int8
    on CPU), "float" or "int8" (draft-side precision: never changes the output).
    `compile`: run the target's decoder through `torch.compile` (`ModelAdapter.compile`).
    """
    if not isinstance(target, str):
        pair = pair_from_models(target, tokenizer, draft, draft_logits=draft_logits)
        if compile:
            pair.target.compile()
        return pair
    draft = draft or default_draft(target)
    _, int8_head = check_pair(
        target, draft, device, dtype, device_map, max_memory, offload_folder, draft_logits
    )
    tokenizer = load_tokenizer(target)
    target_model = load_model(target, device, dtype, device_map, max_memory, offload_folder)
    adapter = ModelAdapter(target_model)
    if compile:
        adapter.compile()
    drafter = named_drafter(draft, adapter, tokenizer, dtype, int8_head)
    return ModelPair(target, draft, adapter, drafter, tokenizer)
