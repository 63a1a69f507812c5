"""One string-keyed registry of tree builders, shared by the Python API, the CLI and the benchmark.

Adding a method = writing `builders/<paper>.py` with a `@register` dataclass and
importing it in `builders/__init__.py`. Verifiers live in `verifiers.VERIFIERS`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import ArborError

BUILDERS: dict[str, type] = {}


def register(cls):
    """Class decorator: make a `TreeBuilder` dataclass available under `cls.name`."""
    if cls.name in BUILDERS:
        raise RuntimeError(f"builder {cls.name!r} registered twice")
    BUILDERS[cls.name] = cls
    return cls


def builder_names() -> list[str]:
    _load()
    return sorted(BUILDERS)


def builder_class(name: str) -> type:
    _load()
    if name not in BUILDERS:
        raise ArborError(f"unknown method {name!r}: choose one of {', '.join(sorted(BUILDERS))}")
    return BUILDERS[name]


def make_builder(name: str, budget: int | None = None, **params: Any):
    """Instantiate builder `name`; unknown parameters and bad values give a one-line ArborError."""
    cls = builder_class(name)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ArborError(f"method {name!r} has no parameter {unknown[0]!r}: it takes {', '.join(sorted(known)) or 'none'}")
    if budget is not None and (not isinstance(budget, int) or budget < 1):
        raise ArborError(f"budget (tree size) must be an integer >= 1, got {budget!r}")
    try:
        return cls.from_budget(budget, **params) if budget is not None else cls(**params)
    except TypeError as exc:
        raise ArborError(f"bad parameters for {name!r}: {exc}") from None


def parse_params(items: list[str]) -> dict[str, Any]:
    """`["budget=32", "threshold=0.05", "shape=tree.json"]` -> typed dict (int, float, bool or str)."""
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


def _load() -> None:
    from .. import builders  # noqa: F401  (registers every builder on import)
