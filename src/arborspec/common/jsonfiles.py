"""Reading user-supplied JSON files (shapes, calibrations) with one-line errors that say what to do."""

from __future__ import annotations

import json
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
