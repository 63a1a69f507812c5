"""The `arborspec` command line (typer + rich): thin shells over the Python API and the tools.

`arborspec` with no arguments generates an answer to a demo prompt with the embedded pair
and this device's defaults, and prints its statistics, offline. One module per family of
commands: `generate` (generate, the demo, methods), `bench` (bench, report), `serve`, `tools`
(the offline tools), `dev` (`arborspec dev ...`: the developers' tools); `options` holds the
option groups several commands share, `base` the app.
"""

from . import bench, dev, generate, serve, tools  # noqa: F401  (each registers its commands)
from .base import app

__all__ = ["app"]
