"""One Hugging Face causal LM or tokenizer, loaded by name (`names.py`): unmodified, in eval mode,
in the precision asked for (int8: quantised with the built-in calibration text, engine/int8.py),
on a device or placed by a device map (`device_map.py`), with an attention implementation that
takes the adapter's masks."""

from __future__ import annotations

import os

import torch

from ..common.chat import encode_prompt
from ..engine.int8 import quantize_int8
from ..errors import ArborError
from .device_map import placement_kwargs
from .names import ASSETS, resolve_model_path
from .precision import check_precision, is_int8, parse_device, parse_dtype


def int8_calibration_samples(tokenizer) -> list[torch.Tensor]:
    """The built-in calibration text (assets/int8/calibration.txt), one
    chat-formatted sample per block."""
    text = (ASSETS / "int8" / "calibration.txt").read_text(encoding="utf-8")
    samples = []
    for block in text.split("\n===\n"):
        user, _, answer = block.strip().partition("\n")
        ids = (
            encode_prompt(tokenizer, user)
            + tokenizer(answer, add_special_tokens=False)["input_ids"]
        )
        samples.append(torch.tensor(ids, dtype=torch.long))
    return samples


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    path = resolve_model_path(name)
    try:
        return AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        raise ArborError(
            f"cannot load a tokenizer for {name!r} ({_first_line(exc)}): check the id or path"
        ) from None


def load_model(
    name: str,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    device_map: str | dict | None = None,
    max_memory: str | dict | None = None,
    offload_folder: str | os.PathLike | None = None,
):
    """Load an unmodified HF causal LM in eval mode.

    `device_map` / `max_memory` / `offload_folder` (see `placement_kwargs`) place it with
    accelerate, possibly offloaded to the CPU or disk; they override `device`.
    """
    from transformers import AutoModelForCausalLM

    placement = placement_kwargs(device_map, max_memory, offload_folder)
    check_precision(dtype, device, placement)
    int8 = is_int8(dtype)
    path = resolve_model_path(name)
    kernel = attention_kernel(path)
    kwargs = {"dtype": parse_dtype(dtype), "attn_implementation": kernel, **placement}
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as exc:
        raise ArborError(
            f"cannot load model {name!r} ({_first_line(exc)}): check the id or path (offline: "
            "use a local directory)"
        ) from None
    except (ValueError, KeyError, AssertionError, RuntimeError) as exc:
        if not placement:
            raise
        raise ArborError(
            f"cannot place model {name!r} by this device map ({_first_line(exc)}): "
            "check --device-map and --max-memory"
        ) from None
    if not placement:
        model = model.to(parse_device(device))
    model.eval()
    if int8:
        if getattr(model.config.get_text_config(decoder=True), "attn_logit_softcapping", None):
            raise ArborError(
                f"--dtype int8 runs its own attention, without {type(model).__name__}'s attention "
                "logit soft-capping: use --dtype float32"
            )
        quantize_int8(model, int8_calibration_samples(load_tokenizer(name)))
    return model


def attention_kernel(path: str) -> str:
    """The attention implementation to load the model at `path` with: `sdpa`, or `eager` for a
    model class that has no sdpa path (Gemma 2: its attention logits are soft-capped). Both take
    the adapter's 4D additive masks (docs/algorithms.md §4). A config that cannot be read here is
    left to `from_pretrained` to report."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(path)
        model_class = AutoModelForCausalLM._model_mapping[type(config)]
    except (OSError, ValueError, KeyError):
        return "sdpa"
    return "sdpa" if getattr(model_class, "_supports_sdpa", True) else "eager"


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
