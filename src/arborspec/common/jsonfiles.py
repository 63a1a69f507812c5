"""JSON files: reading user-supplied ones (shapes, calibrations) with one-line errors that say what to do,
and writing them atomically, so that Ctrl-C or a kill at any moment leaves the old file or the new one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import ArborError


def read_json_file(path: str | Path, what: str, missing_hint: str = "") -> Any:
    """Parse `path`; a missing file or invalid JSON raises an ArborError naming `what` (e.g. "shape file")."""
    path = Path(path)
    if not path.is_file():
        raise ArborError(f"{what} {str(path)!r} does not exist" + (f": {missing_hint}" if missing_hint else ""))
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ArborError(f"{what} {str(path)!r} is not valid JSON ({exc.msg} at line {exc.lineno})") from None


def write_json_atomic(obj: Any, path: str | Path, indent: int | None = 1) -> None:
    """Write `obj` as JSON to `path` through a temporary file beside it (flushed to disk, then renamed over
    `path`): a reader never sees a half-written file. The folder is made if it does not exist yet."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(obj, indent=indent) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def report_json(obj: Any, out: str | Path | None) -> None:
    """A measuring command's result: printed, and written atomically to `out` (its folder made) when given."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(obj, out, indent=2)
    print(json.dumps(obj, indent=2))
