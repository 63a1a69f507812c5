"""Optional dependencies: the packages an extra of pyproject.toml installs, imported where a feature
needs them, and one line naming the extra when they are missing.

`generate` and the Python API need none of them; the server needs the `serve` extra (FastAPI,
uvicorn, sse-starlette, prometheus-client) and the benchmark's plots the `plots` extra
(matplotlib).
"""

from __future__ import annotations

import importlib

from ..errors import ArborError

SERVE = ("fastapi", "uvicorn", "sse_starlette", "prometheus_client")
PLOTS = ("matplotlib",)


def require(extra: str, modules: tuple[str, ...], needed_for: str) -> None:
    """Import `modules`; the first one that cannot be imported raises the `pip install` line of
    `extra`."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            raise ArborError(
                f'{needed_for} needs the {name!r} package: pip install "arborspec[{extra}]"'
            ) from None


def require_serve() -> None:
    require("serve", SERVE, "the server")


def require_plots() -> None:
    require("plots", PLOTS, "the benchmark's plots")
