"""One string-keyed registry of tree builders, shared by the Python API, the CLI and the benchmark.

Adding a method = writing `builders/<paper>.py` with a `@register` dataclass and
importing it in `builders/__init__.py` (importing any module of this package
registers them all). Verifiers live in `engine/verifiers.VERIFIERS`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..engine.contracts import TreeBuilder
from ..errors import ArborError

BUILDERS: dict[str, type[TreeBuilder]] = {}


def register(cls: type[TreeBuilder]) -> type[TreeBuilder]:
    """Class decorator: make a `TreeBuilder` dataclass available under `cls.name`."""
    if cls.name in BUILDERS:
        raise RuntimeError(f"builder {cls.name!r} registered twice")
    BUILDERS[cls.name] = cls
    return cls


def builder_names() -> list[str]:
    return sorted(BUILDERS)


def builder_class(name: str) -> type[TreeBuilder]:
    if name not in BUILDERS:
        raise ArborError(f"unknown method {name!r}: choose one of {', '.join(sorted(BUILDERS))}")
    return BUILDERS[name]


def parameter_names(cls: type[TreeBuilder]) -> list[str]:
    """What a builder accepts: its fields (the shared `budget`, `max_depth`, `topk` first)."""
    return [f.name for f in dataclasses.fields(cls) if f.init]


def make_builder(name: str, budget: int | None = None, **params: Any) -> TreeBuilder:
    """Instantiate builder `name`; unknown parameters and bad values give a one-line ArborError."""
    cls = builder_class(name)
    unknown = sorted(set(params) - set(parameter_names(cls)))
    if unknown:
        raise ArborError(
            f"method {name!r} has no parameter {unknown[0]!r}: it takes "
            f"{', '.join(parameter_names(cls))}"
        )
    if isinstance(budget, str) and budget.strip().lower() == "auto":
        if "auto" not in parameter_names(cls):
            raise ArborError(
                f"method {name!r} has no budget=auto (it is offered by dyspec, dyspec-threshold "
                "and opt-tree): give an integer budget"
            )
        budget, params = None, {**params, "auto": True}
    if budget is not None:
        if not isinstance(budget, int) or budget < 1:
            raise ArborError(f"budget (tree size) must be an integer >= 1, got {budget!r}")
        params = {**params, "budget": budget}
    try:
        return cls.from_params(**params)
    except TypeError as exc:
        raise ArborError(f"bad parameters for {name!r}: {exc}") from None


def parse_budget(raw: str | int | None) -> int | str | None:
    """A budget as typed by a user: an integer, or `auto`."""
    if raw is None or isinstance(raw, int):
        return raw
    value = _coerce(str(raw).strip())
    if isinstance(value, int) or value == "auto":
        return value
    raise ArborError(f"budget must be an integer >= 1 or auto, got {raw!r}")


def parse_params(items: list[str]) -> dict[str, Any]:
    """`["budget=32", "threshold=0.05", "shape=tree.json"]` -> typed dict (int,
    float, bool or str)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ArborError(f"parameter {item!r} must look like name=value")
        key, raw = item.split("=", 1)
        out[key.strip().replace("-", "_")] = _coerce(raw.strip())
    return out


def _coerce(raw: str) -> Any:
    for conv in (int, float):
        try:
            return conv(raw)
        except ValueError:
            pass
    if raw.lower() in {"true", "false"}:
        return raw.lower() == "true"
    return raw
