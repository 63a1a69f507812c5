"""Tree shapes as lists of index paths — the format Medusa, EAGLE and vLLM use.

`[[0], [1], [0, 0]]` = the root's first and second child, and the first child
of the first child. A valid shape lists each node once, contains every prefix
of every path, and numbers siblings 0..k-1 without gaps. Shapes are saved as
JSON (never pickles): either a bare list of paths, or an object with a
`"shape"` key and metadata (pair, acceptance vector, size, depth).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..common.jsonfiles import read_json_file
from ..errors import ArborError

Shape = list[list[int]]


def validate_shape(shape: Any, source: str = "shape") -> Shape:
    if not isinstance(shape, list) or not shape:
        raise ArborError(
            f"{source}: a shape must be a non-empty list of index paths like [[0], [1], [0, 0]]"
        )
    paths = []
    for p in shape:
        if not isinstance(p, list) or not p or not all(isinstance(i, int) and i >= 0 for i in p):
            raise ArborError(
                f"{source}: {p!r} is not an index path (a non-empty list of integers >= 0)"
            )
        paths.append(tuple(p))
    seen = set(paths)
    if len(seen) != len(paths):
        raise ArborError(f"{source}: some index paths are listed twice")
    for p in paths:
        if len(p) > 1 and p[:-1] not in seen:
            raise ArborError(f"{source}: path {list(p)} has no parent {list(p[:-1])} in the shape")
        if p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in seen:
            raise ArborError(
                f"{source}: path {list(p)} skips sibling {p[-1] - 1}: number siblings 0..k-1"
            )
    return [list(p) for p in sorted(paths, key=lambda q: (len(q), q))]


def parse_shape_literal(text: str) -> Shape:
    """A shape written inline, e.g. on the command line: `'[[0], [1], [0, 0]]'`."""
    try:
        return validate_shape(json.loads(text), "shape")
    except json.JSONDecodeError as exc:
        raise ArborError(
            f"shape {text!r} is not valid JSON ({exc.msg}): write it like [[0], [1], [0, 0]]"
        ) from None


def load_shape(path: str | Path) -> tuple[Shape, dict]:
    """Read a shape file; return (shape, metadata)."""
    data = read_json_file(path, "shape file")
    meta: dict = {}
    if isinstance(data, dict):
        if "shape" not in data:
            raise ArborError(f"shape file {str(path)!r} has no 'shape' key")
        meta = {k: v for k, v in data.items() if k != "shape"}
        data = data["shape"]
    return validate_shape(data, str(path)), meta


def save_shape(path: str | Path, shape: Shape, **meta: Any) -> None:
    Path(path).write_text(json.dumps({"shape": validate_shape(shape), **meta}, indent=1))


def children_counts(shape: Shape) -> dict[tuple[int, ...], int]:
    """Number of children of each node of the shape, keyed by index path (root = ())."""
    counts: dict[tuple[int, ...], int] = {}
    for p in shape:
        parent = tuple(p[:-1])
        counts[parent] = max(counts.get(parent, 0), p[-1] + 1)
    return counts


def shape_depth(shape: Shape) -> int:
    return max(len(p) for p in shape)
