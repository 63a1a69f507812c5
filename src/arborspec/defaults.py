"""What a generation runs with when the user does not say: method, tree size, lookup, precision.

The choice depends on where the target runs and which target it is:

* **CPU**: `dyspec` with a context lookup of up to 6 tokens; 1 draft node on the int8 target,
  3 on a float target. Chosen on a validation slice of MT-Bench on a 2-core CPU with the embedded
  pair (docs/evaluation.md (b)): on the int8 target, whose forwards are replayed from traces so
  that a plain token costs little beyond its weights, 1 node ran 1.19x plain decoding in both
  runs at T = 0 (2 nodes 1.18x / 1.17x, 3 nodes 1.13x / 1.14x) and 1.15x at T = 0.6 (1.13x,
  1.11x); in float32 3 nodes ran about 1.08x. Larger trees (the papers' 16-64 nodes) run slower
  than plain decoding (docs/algorithms.md §7, "The size that pays on a 2-core CPU").
* **CPU, a draft model** (a smaller model of the target's family, in int8 on a CPU): `dyspec` with
  `budget=auto` (at most 32 draft nodes) and the same lookup. A draft model's forward costs a
  sizeable share of the target's (the 0.5B Qwen2.5-Coder draft about 0.4 of its int8 1.5B target)
  and it often agrees for many tokens in a row, so the tree's size and depth are chosen each step
  from both models' measured costs and the acceptance seen so far (builders/auto_size.py); on the
  Qwen pair it ran ahead of every fixed size tried (docs/evaluation.md (m)).
* **GPU** (any accelerator): `dyspec` with 16 draft nodes and the same lookup. A GPU verifies
  a few dozen rows for about the price of one, but drafting and building a tree are host work
  that grows with its size: with the embedded pair in float32, 16 nodes ran 1.55x plain decoding
  on an H200 (32: 1.42x, 64: 1.10x) and 1.58x on an H100 (8: 1.63x, 32: 1.42x), every output
  identical (benchmarks/results/gpu-h100/).

Precision `auto`: `int8` (the batch-invariant int8 target, engine/int8.py, the fast path on a
CPU) for the built-in targets shipped as 4-bit GGUF files of instruction-tuned models (the embedded
SmolLM2 and the Qwen2.5-Coder pair, `catalog.INT8_BY_DEFAULT`) on CPU without a device map;
otherwise `float32`. A model the user names stays in the precision asked for (`float32` unless
told) and is never quantised silently; a draft never changes the output, so a draft model or head
runs int8 on a CPU unless `--draft-dtype` says otherwise (models.py).

Explicit values always win: a method given without a budget gets the device's default budget
(unless builder parameters given with it define the tree, `builder_params`); a given budget,
lookup or precision is kept as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import ArborError

AUTO = "auto"
DEFAULT_METHOD = "dyspec"
CPU_BUDGET = 3  # draft nodes per step on a CPU, float targets (measured)
INT8_CPU_BUDGET = 1  # draft nodes per step on the int8 target on a CPU (measured, module doc)
GPU_BUDGET = 16  # draft nodes per step on a GPU (measured, module doc)
DEFAULT_LOOKUP = 6  # context-lookup tokens grafted per step (measured on CPU)
# the placement strategies `models.placement_kwargs` takes, and the devices that are not a GPU
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
HOST_DEVICES = ("cpu", "disk")


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


def default_dtype(kind: str, embedded: bool, placed: bool) -> str:
    """`auto` resolved (module docstring): int8 for a target that runs int8 by default (`embedded`)
    on CPU without a device map, else float32."""
    return "int8" if kind == "cpu" and embedded and not placed else "float32"


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
) -> Defaults:
    """The settings for a target on `device` (placed by `device_map` / `max_memory` if given);
    `embedded`: the target runs int8 by default on a CPU (`catalog.INT8_BY_DEFAULT`); `draft_model`:
    the drafter is a draft model, not a draft head or the n-gram drafter. Given values are kept;
    None (and dtype "auto") take the defaults. `builder_params`: builder parameters were given,
    so a missing budget is left to the builder."""
    kind = device_kind(device, device_map, max_memory)
    placed = device_map is not None or max_memory is not None
    chosen = []
    if method is None:
        method = DEFAULT_METHOD
        chosen.append("method")
    auto_dtype = str(dtype).lower() == AUTO
    if auto_dtype:
        dtype = default_dtype(kind, embedded, placed)
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
) -> str:
    """`dtype` itself unless it is "auto"; then the default for this target and device."""
    if str(dtype).lower() != AUTO:
        return dtype
    return default_dtype(
        device_kind(device, device_map, max_memory),
        embedded,
        device_map is not None or max_memory is not None,
    )
