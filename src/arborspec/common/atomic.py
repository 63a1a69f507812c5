"""Atomic file writes: a reader, or a rerun after Ctrl-C, a kill or a crash, finds a file either as
it was or as it was rewritten, never half written.

Every file the long-running tools keep (JSON records, data shards, checkpoints, exported weights)
goes through `write_atomic`: the writer fills a temporary file beside the target (`<name>.tmp`),
which is flushed to disk and then renamed over the target in one step. A `.tmp` left by a write
that was cut short is overwritten by the next write of the same file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call `write(tmp)` to fill a temporary file beside `path`, then put it in place of `path`.

    The folder is made if it does not exist yet. Returns `path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    with open(tmp, "ab") as fh:  # the writer may have closed its own handle: sync the data here
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def save_tensors_atomic(
    tensors: dict, path: str | Path, metadata: dict[str, str] | None = None
) -> Path:
    """Write `tensors` (name -> tensor) as a safetensors file, atomically."""
    from safetensors.torch import save_file

    tensors = {k: v.contiguous() for k, v in tensors.items()}
    return write_atomic(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
