"""Loading target and draft models: Hugging Face ids, local directories, the built-in models and
their shipped drafts, and the pair itself.

`names` (what a model or drafter name stands for; the default draft of a target), `precision`
(dtype names, int8, the precision a draft runs in), `device_map` (placement by a device map),
`hf` (one model or tokenizer through transformers), `pair` (`ModelPair`, the drafter a name
stands for beside a target), `loaded` (pairs around models the caller loaded,
`pair_from_models`) and `loading` (`load_pair`: a target, a drafter and the tokenizer loaded by
name, the one entry point of the API, the CLI, the offline tools and the benchmark).
"""

from .device_map import parse_device_map, parse_max_memory, placement_kwargs
from .hf import attention_kernel, load_model, load_tokenizer
from .loaded import HEAD_BESIDE_MODEL, default_draft_for, pair_from_models
from .loading import check_pair, load_pair
from .names import (
    EMBEDDED_DRAFT,
    NGRAM_DRAFT,
    SHIPPED_DRAFT_DIR,
    default_draft,
    is_draft_model,
    is_head_dir,
    resolve_head_dir,
    resolve_model_path,
)
from .pair import ModelPair, check_same_vocabulary
from .precision import draft_precision, head_int8, parse_dtype, planned_draft_precision

__all__ = [
    "EMBEDDED_DRAFT",
    "HEAD_BESIDE_MODEL",
    "NGRAM_DRAFT",
    "SHIPPED_DRAFT_DIR",
    "ModelPair",
    "attention_kernel",
    "check_pair",
    "check_same_vocabulary",
    "default_draft",
    "default_draft_for",
    "draft_precision",
    "head_int8",
    "is_draft_model",
    "is_head_dir",
    "load_model",
    "load_pair",
    "load_tokenizer",
    "pair_from_models",
    "parse_device_map",
    "parse_dtype",
    "parse_max_memory",
    "placement_kwargs",
    "planned_draft_precision",
    "resolve_head_dir",
    "resolve_model_path",
]
