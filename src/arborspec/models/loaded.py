"""Pairs around models the caller loaded (`pair_from_models`, behind
`SpeculativeGenerator.from_models` and `load_pair` given a model object): the target used as it
is, in any precision or placement, its draft chosen or checked as `load_pair` checks a draft it
loads."""

from __future__ import annotations

from pathlib import Path

import torch

from ..catalog import BUILTIN_DIRS, cache_root
from ..common.vocab import check_same_tokenizer, check_vocab_size
from ..drafters import Drafter, DraftHead, HeadDrafter, ModelDrafter
from ..engine.adapter import ModelAdapter
from ..errors import ArborError
from .names import NGRAM_DRAFT, default_draft
from .pair import ModelPair, named_drafter
from .precision import head_int8, model_precision

HEAD_BESIDE_MODEL = "arborspec-head"  # a head directory looked for inside a model's own directory


def model_name(model) -> str:
    """What a loaded model is called: the id or directory it was loaded from, else its class."""
    return str(getattr(model, "name_or_path", "") or type(model).__name__)


def builtin_target_of(model) -> str | None:
    """The built-in target (`embedded`, `gemma3-270m`) whose converted directory `model` was
    loaded from, if any."""
    path = Path(str(getattr(model, "name_or_path", "") or "")).expanduser()
    if not path.is_dir():
        return None
    for name, folder in BUILTIN_DIRS.items():
        converted = cache_root() / folder
        if converted.is_dir() and path.resolve() == converted.resolve():
            return name
    return None


def default_draft_for(model) -> str:
    """The draft for a loaded target when none is named: the shipped head for a built-in target,
    a head directory `arborspec-head` inside the model's own directory, else the n-gram drafter."""
    builtin = builtin_target_of(model)
    if builtin is not None:
        return default_draft(builtin)
    beside = Path(str(getattr(model, "name_or_path", "") or "")).expanduser() / HEAD_BESIDE_MODEL
    if (beside / "head.json").is_file():
        return str(beside)
    return NGRAM_DRAFT


def _is_model(obj) -> bool:
    return isinstance(obj, torch.nn.Module) and hasattr(obj, "get_output_embeddings")


def pair_from_models(
    model,
    tokenizer=None,
    draft=None,
    draft_tokenizer=None,
    draft_logits: str = "auto",
) -> ModelPair:
    """A pair around a target the caller already loaded (any precision or placement; it is used as
    it is and never changed: no layer swapped, no precision or attention changed, no hook left
    after a generation).

    `draft`: None (`default_draft_for`), "ngram", a draft-head directory or "embedded-head", a
    draft model's id or directory, a loaded draft model, or a loaded `DraftHead`. The checks are
    those of `load_pair`: the draft's vocabulary (and tokenizer, where both are known) must be the
    target's, a head must have been trained for this target. `tokenizer`: the target's (needed for
    text prompts and the tokenizer check; token ids work without one)."""
    if not _is_model(model):
        raise ArborError(
            f"expected a loaded Hugging Face causal LM as the target, got {type(model).__name__}: "
            "pass the model object (or a model name to SpeculativeGenerator(target=...))"
        )
    adapter = ModelAdapter(model)
    precision = model_precision(model)
    placed = bool(getattr(model, "hf_device_map", None))
    int8_head = head_int8(draft_logits, adapter.device, placed)
    if draft is None:
        draft = default_draft_for(model)
    if isinstance(draft, str):
        drafter: Drafter = named_drafter(draft, adapter, tokenizer, precision, int8_head)
        draft_name = draft
    elif isinstance(draft, DraftHead):
        check_vocab_size(draft.vocab_size, adapter.vocab_size, what="the draft head")
        drafter, draft_name = HeadDrafter(draft), "draft head"
    elif _is_model(draft):
        rows = draft.get_output_embeddings().weight.shape[0]
        check_vocab_size(rows, adapter.vocab_size, what=f"draft {model_name(draft)!r}")
        if tokenizer is not None and draft_tokenizer is not None:
            check_same_tokenizer(tokenizer, draft_tokenizer, what=f"draft {model_name(draft)!r}")
        drafter, draft_name = ModelDrafter(draft), model_name(draft)
    else:
        raise ArborError(
            f"unknown draft {type(draft).__name__}: give 'ngram', a draft-head directory, a draft "
            "model (loaded, or its id or directory) or a DraftHead"
        )
    return ModelPair(model_name(model), draft_name, adapter, drafter, tokenizer)
