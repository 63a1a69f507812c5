"""JSON files: reading user-supplied ones (shapes, calibrations) with one-line errors that say what
to do, and writing them atomically, so that Ctrl-C or a kill at any moment leaves the old
file or the new one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ArborError
from .atomic import write_atomic


def read_json_file(path: str | Path, what: str, missing_hint: str = "") -> Any:
    """Parse `path`; a missing file or invalid JSON raises an ArborError naming `what`
    (e.g. "shape file")."""
    path = Path(path)
    if not path.is_file():
        raise ArborError(
            f"{what} {str(path)!r} does not exist" + (f": {missing_hint}" if missing_hint else "")
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ArborError(
            f"{what} {str(path)!r} is not valid JSON ({exc.msg} at line {exc.lineno})"
        ) from None


def write_json_atomic(obj: Any, path: str | Path, indent: int | None = 1) -> None:
    """Write `obj` as JSON to `path` atomically (`common/atomic.py`): a reader never sees a
    half-written file. The folder is made if it does not exist yet."""
    text = json.dumps(obj, indent=indent) + "\n"
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def report_json(obj: Any, out: str | Path | None) -> None:
    """A measuring command's result: printed, and written atomically to `out` (its
    folder made) when given."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(obj, out, indent=2)
    print(json.dumps(obj, indent=2))
