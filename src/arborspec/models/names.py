"""What a model or drafter name stands for: the built-in targets and `*.gguf` paths (directories
converted once into the cache, `catalog.py`), the shipped draft model and draft heads, local
Hugging Face directories and hub ids; the draft a target gets when none is named.

The embedded draft is the small model distilled for the embedded target (see `arborspec
distill`), shipped inside this package; the shipped draft heads are `embedded-head` and
`gemma3-270m-head`.
"""

from __future__ import annotations

from pathlib import Path

from ..catalog import (
    BUILTIN_DRAFTS,
    BUILTIN_TARGETS,
    EMBEDDED_TARGET,
    GEMMA3_TARGET,
    gguf_file_dir,
    is_gguf_path,
    parted_installed,
)
from ..errors import ArborError

ASSETS = Path(__file__).parent.parent / "assets"  # the files shipped inside this package
EMBEDDED_DRAFT = "embedded-draft"
NGRAM_DRAFT = "ngram"
SHIPPED_DRAFT_DIR = ASSETS / "smollm2-draft"
EMBEDDED_HEAD = "embedded-head"
SHIPPED_HEAD_DIR = ASSETS / "smollm2-head"
GEMMA3_HEAD = "gemma3-270m-head"
SHIPPED_GEMMA3_HEAD_DIR = ASSETS / "gemma3-270m-head"
# draft-head names -> their shipped directories
SHIPPED_HEADS = {EMBEDDED_HEAD: SHIPPED_HEAD_DIR, GEMMA3_HEAD: SHIPPED_GEMMA3_HEAD_DIR}


def is_head_dir(name: str) -> bool:
    """A draft-head directory (head.json + head.safetensors, see `arborspec train-head`), or the
    name of a shipped head (`embedded-head`, `gemma3-270m-head`)."""
    if name in SHIPPED_HEADS:
        return True
    path = Path(name).expanduser()
    return (path / "head.json").is_file()


def resolve_head_dir(name: str) -> Path:
    if name in SHIPPED_HEADS:
        folder = SHIPPED_HEADS[name]
        if not (folder / "head.json").is_file():
            raise ArborError(
                f"the shipped draft head is missing from {folder}: reinstall arborspec "
                f"or use --draft {NGRAM_DRAFT}"
            )
        return folder
    return Path(name).expanduser()


def resolve_model_path(name: str) -> str:
    """Map the built-in model names to directories (`BUILTIN_TARGETS`, converted on first use,
    and the shipped draft); check that a local path exists."""
    if name in BUILTIN_TARGETS:
        return str(BUILTIN_TARGETS[name]())
    if is_gguf_path(name):
        return str(gguf_file_dir(name))
    if name == EMBEDDED_DRAFT:
        if not (SHIPPED_DRAFT_DIR / "config.json").is_file():
            raise ArborError(
                f"the distilled draft model is not in {SHIPPED_DRAFT_DIR}: it ships in a source "
                "checkout of arborspec, not in the wheel; use --draft ngram or a draft model's path"
            )
        return str(SHIPPED_DRAFT_DIR)
    path = Path(name).expanduser()
    looks_local = name.startswith((".", "/", "~")) or path.exists() or name.count("/") > 1
    if looks_local and not path.exists():
        raise ArborError(
            f"model path {name!r} does not exist: give a local HF model directory or a hub id"
        )
    if path.exists() and not (path / "config.json").is_file():
        raise ArborError(f"{name!r} has no config.json: it is not a Hugging Face model directory")
    return str(path) if path.exists() else name


def is_draft_model(draft: str) -> bool:
    """Whether the drafter named `draft` is a draft model (not the n-gram drafter or a head)."""
    return draft != NGRAM_DRAFT and not is_head_dir(draft)


def default_draft(target: str) -> str:
    """For the embedded target its shipped draft head (else its distilled draft), for
    `gemma3-270m` its shipped head, for `qwen2.5-coder-1.5b` the built-in 0.5B model of its family
    when its packages are installed; else the model-free n-gram drafter."""
    if target == EMBEDDED_TARGET and (SHIPPED_HEAD_DIR / "head.json").is_file():
        return EMBEDDED_HEAD
    if target == EMBEDDED_TARGET and (SHIPPED_DRAFT_DIR / "config.json").is_file():
        return EMBEDDED_DRAFT
    if target == GEMMA3_TARGET and (SHIPPED_GEMMA3_HEAD_DIR / "head.json").is_file():
        return GEMMA3_HEAD
    if target in BUILTIN_DRAFTS and parted_installed(BUILTIN_DRAFTS[target]):
        return BUILTIN_DRAFTS[target]
    return NGRAM_DRAFT
