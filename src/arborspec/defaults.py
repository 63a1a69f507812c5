"""What a generation runs with when the user does not say: method, tree size, lookup, precision.

The choice depends on where the target runs and which target it is:

* **CPU**: `dyspec` with a context lookup of up to 6 tokens; 1 draft node on the int8 target,
  2 on a float target: the sizes that ran fastest on a validation slice of MT-Bench on a 2-core
  CPU, the int8 size with the embedded pair, the float size with both the embedded pair and Gemma 3
  270M in float32 (docs/evaluation.md (b)); the papers' 16-64 nodes run slower than plain decoding
  there (docs/algorithms.md §7).
* **CPU, a draft model** (a smaller model of the target's family, in int8 on a CPU): `dyspec` with
  `budget=auto` (at most 32 draft nodes) and the same lookup. A draft model's forward costs a
  sizeable share of the target's and it often agrees for many tokens in a row, so the tree's size
  and depth are chosen each step from both models' measured costs and the acceptance seen so far
  (builders/auto_size.py; docs/evaluation.md (m)).
* **GPU** (any accelerator): `dyspec` with 16 draft nodes and the same lookup. A GPU verifies
  a few dozen rows for about the price of one, but drafting and building a tree are host work
  that grows with its size: 16 nodes is the size that ran near the fastest on both GPUs measured
  (benchmarks/README.md, "GPU").

Precision `auto`: on a CPU, `int8` (the batch-invariant int8 target, engine/int8.py, the fast
path there) for the built-in targets shipped as 4-bit GGUF files of instruction-tuned models (the
embedded SmolLM2 and the Qwen2.5-Coder pair, `catalog.INT8_BY_DEFAULT`) without a device map,
otherwise `float32`; on a GPU, what `transformers` means by `dtype="auto"`: the dtype the
checkpoint was saved in (its config's `dtype`, `saved_dtype`; float32 for the built-in targets),
`float32` if it names none. A model the user names is never quantised silently; a draft never
changes the output, so a draft model or head runs int8 on a CPU unless `--draft-dtype` says
otherwise (models/precision.py).

Explicit values always win: a method given without a budget gets the device's default budget
(unless builder parameters given with it define the tree, `builder_params`); a given budget,
lookup or precision is kept as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .engine.placement import DEVICE_MAP_STRATEGIES
from .errors import ArborError

AUTO = "auto"
DEFAULT_METHOD = "dyspec"
CPU_BUDGET = 2  # draft nodes per step on a CPU, float targets (measured, module doc)
INT8_CPU_BUDGET = 1  # draft nodes per step on the int8 target on a CPU (measured, module doc)
GPU_BUDGET = 16  # draft nodes per step on a GPU (measured, module doc)
DEFAULT_LOOKUP = 6  # context-lookup tokens grafted per step (measured on CPU)
FLOAT_DTYPES = ("float32", "float16", "bfloat16")  # what `auto` may resolve to on a GPU
HOST_DEVICES = ("cpu", "disk")  # the devices of a device map that are not a GPU


@dataclass(frozen=True)
class Defaults:
    """The settings a generation runs with: the user's where given, else the device's defaults.

    `device`: "cpu" or "gpu", the kind of device the target runs on (the choice depends on it);
    `budget`: draft nodes per step, "auto", or None (builder parameters define the tree);
    `chosen`: which of method, budget, lookup, dtype came from the defaults, not the user."""

    method: str
    budget: int | str | None
    lookup: int
    dtype: str
    device: str
    chosen: tuple[str, ...] = ()


def device_kind(
    device: str | torch.device = "cpu",
    device_map: str | dict | None = None,
    max_memory: str | dict | None = None,
) -> str:
    """ "cpu" or "gpu": where the target runs. Without a device map, `device`; with one (or
    `max_memory`, which implies `device_map="auto"`), "gpu" if the map names a device other than
    cpu and disk, or is a placement strategy and torch sees a GPU."""
    if device_map is None and max_memory is None:
        try:
            return "cpu" if torch.device(device).type == "cpu" else "gpu"
        except RuntimeError:
            message = f"--device {device!r} is not a device: use cpu, cuda, cuda:N, ..."
            raise ArborError(message) from None
    if device_map is None or (
        isinstance(device_map, str) and device_map.strip() in DEVICE_MAP_STRATEGIES
    ):
        return "gpu" if torch.cuda.is_available() else "cpu"
    if isinstance(device_map, dict):
        places = [str(v) for v in device_map.values()]
    else:
        places = [item.partition("=")[2] or item for item in device_map.split(",") if item.strip()]
    return "gpu" if any(p.strip().lower() not in HOST_DEVICES for p in places) else "cpu"


def saved_dtype(path: str) -> str:
    """The dtype `transformers` loads the model at `path` (a directory or hub id) in with
    `dtype="auto"`: the one its config names (`config_dtype`); float32 where the config cannot be
    read (loading the model then says why)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        return "float32"
    return config_dtype(config)


def config_dtype(config) -> str:
    """The floating dtype a model config was saved with (`dtype`, `torch_dtype` in older
    configs): float32, float16 or bfloat16; float32 where it names none or another."""
    named = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = str(named).removeprefix("torch.") if named is not None else ""
    return name if name in FLOAT_DTYPES else "float32"


def default_dtype(
    kind: str, embedded: bool, placed: bool, checkpoint: Callable[[], str] | None = None
) -> str:
    """`auto` resolved (module docstring): on a CPU, int8 for a target that runs int8 by default
    (`embedded`) without a device map, else float32; on a GPU, `checkpoint()` (the dtype the
    target was saved in, `saved_dtype`; read only there), float32 without it."""
    if kind == "cpu":
        return "int8" if embedded and not placed else "float32"
    return checkpoint() if checkpoint is not None else "float32"


def choose(
    device: str | torch.device = "cpu",
    embedded: bool = True,
    device_map: str | dict | None = None,
    max_memory: str | dict | None = None,
    *,
    draft_model: bool = False,
    method: str | None = None,
    budget: int | str | None = None,
    lookup: int | None = None,
    dtype: str = AUTO,
    builder_params: bool = False,
    checkpoint: Callable[[], str] | None = None,
) -> Defaults:
    """The settings for a target on `device` (placed by `device_map` / `max_memory` if given);
    `embedded`: the target runs int8 by default on a CPU (`catalog.INT8_BY_DEFAULT`); `draft_model`:
    the drafter is a draft model, not a draft head or the n-gram drafter. Given values are kept;
    None (and dtype "auto") take the defaults. `builder_params`: builder parameters were given,
    so a missing budget is left to the builder. `checkpoint`: the dtype the target was saved in,
    asked only for dtype "auto" on a GPU (`default_dtype`)."""
    kind = device_kind(device, device_map, max_memory)
    placed = device_map is not None or max_memory is not None
    chosen = []
    if method is None:
        method = DEFAULT_METHOD
        chosen.append("method")
    auto_dtype = str(dtype).lower() == AUTO
    if auto_dtype:
        dtype = default_dtype(kind, embedded, placed, checkpoint)
    if budget is None and not builder_params:
        if kind != "cpu":
            budget = GPU_BUDGET
        elif draft_model:
            budget = AUTO
        else:
            budget = INT8_CPU_BUDGET if str(dtype).lower() == "int8" else CPU_BUDGET
        chosen.append("budget")
    if lookup is None:
        lookup = DEFAULT_LOOKUP
        chosen.append("lookup")
    if auto_dtype:
        chosen.append("dtype")
    return Defaults(method, budget, lookup, dtype, kind, tuple(chosen))


def resolve_dtype(
    dtype: str,
    device: str | torch.device = "cpu",
    embedded: bool = True,
    device_map: str | dict | None = None,
    max_memory: str | dict | None = None,
    checkpoint: Callable[[], str] | None = None,
) -> str:
    """`dtype` itself unless it is "auto"; then the default for this target and device
    (`checkpoint` as in `choose`)."""
    if str(dtype).lower() != AUTO:
        return dtype
    return default_dtype(
        device_kind(device, device_map, max_memory),
        embedded,
        device_map is not None or max_memory is not None,
        checkpoint,
    )
