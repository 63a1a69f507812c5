"""Precisions: the dtype names (`float32`, `float16`, `bfloat16`, `int8`, the batch-invariant int8
target for CPU, engine/int8.py), the device a name stands for, the precision a draft runs in beside
its target, and the precision a loaded model or drafter runs in."""

from __future__ import annotations

import torch

from ..drafters import Drafter, HeadDrafter, ModelDrafter
from ..engine.int8 import Int8GroupMember, Int8Linear
from ..errors import ArborError
from .names import NGRAM_DRAFT

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


INT8 = "int8"  # the batch-invariant int8 target for CPU (engine/int8.py)


def is_int8(name: str | torch.dtype) -> bool:
    return isinstance(name, str) and name.lower() == INT8


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """The floating dtype of a precision name; `int8` -> float32 (its activations, norms,
    caches and drafts)."""
    if isinstance(name, torch.dtype):
        return name
    if is_int8(name):
        return torch.float32
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise ArborError(
            f"unknown dtype {name!r}: use one of float32, float16, bfloat16, int8 (CPU)"
        ) from None


def check_precision(
    dtype: str | torch.dtype, device: str | torch.device, placement: dict | None = None
) -> None:
    """A known precision that this device can run (one-line ArborError otherwise)."""
    parse_dtype(dtype)
    if is_int8(dtype) and (placement or torch.device(device).type != "cpu"):
        raise ArborError(
            "--dtype int8 runs on CPU only (fbgemm kernels), without a device map: "
            "use --device cpu, or float16/bfloat16 on a GPU"
        )


def draft_precision(name: str | torch.dtype) -> str | torch.dtype:
    """The precision a draft model runs in next to a target of precision `name`
    (int8 targets: float32 drafts)."""
    return "float32" if is_int8(name) else name


def parse_device(name: str | torch.device) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ArborError("--device cuda was asked for but no CUDA GPU is visible: use --device cpu")
    return device


DRAFT_LOGITS = ("auto", "float", "int8")


def head_int8(draft_logits: str, device: str | torch.device, placed: bool) -> bool:
    """Whether the draft runs in int8 (a draft head: its layer and its logits, drafters/head.py; a
    draft model: every linear, engine/int8.py): `auto` = on a CPU target that no device map places
    (`placed`). `draft_logits` is `--draft-dtype`: auto, float (the target's floating dtype) or
    int8; the draft's precision never changes the output."""
    if draft_logits not in DRAFT_LOGITS:
        raise ArborError(
            f"unknown --draft-dtype {draft_logits!r}: use one of {', '.join(DRAFT_LOGITS)}"
        )
    cpu = torch.device(device).type == "cpu" and not placed
    if draft_logits == "int8" and not cpu:
        raise ArborError(
            "--draft-dtype int8 runs on CPU only (fbgemm kernels), without a device map: "
            "use --draft-dtype float or auto"
        )
    return draft_logits == "int8" or (draft_logits == "auto" and cpu)


def model_precision(model) -> str:
    """The precision a loaded model runs in: int8 (engine/int8.py), else its weights' dtype."""
    if any(isinstance(m, (Int8Linear, Int8GroupMember)) for m in model.modules()):
        return INT8
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def planned_draft_precision(draft: str, precision: str, int8_draft: bool) -> str | None:
    """The precision the drafter named `draft` will run in beside a target of `precision`, as
    `drafter_precision` reports it once loaded (said before anything loads)."""
    if draft == NGRAM_DRAFT:
        return None
    if int8_draft:
        return INT8
    return str(parse_dtype(draft_precision(precision))).removeprefix("torch.")


def drafter_precision(drafter: Drafter) -> str | None:
    """The precision `ModelPair.draft_precision` reports for `drafter`."""
    if isinstance(drafter, ModelDrafter):
        return model_precision(drafter.lm.model)
    if isinstance(drafter, HeadDrafter):
        head = drafter.head
        return INT8 if head.int8_logits else str(drafter.dtype).removeprefix("torch.")
    return None
