"""The layers of the package: imports only point downwards, and no import cycle.

Layers, lowest first (ARCHITECTURE.md): `errors`; `common/`; `engine/`; `drafters/` and `builders/` (side by side:
neither imports the other); `catalog` (the built-in models and GGUF files); `models/` and `defaults` (side by side);
`offline/` and `bench/` (side by side: neither imports the other); `api`; `custom_generate` and `serve/` (side by
side); `cli` and the package's `__init__`. Every import counts, including those inside functions and under
`TYPE_CHECKING`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "arborspec"

LAYERS = {
    "errors": 0,
    "common": 1,
    "engine": 2,
    "drafters": 3, "builders": 3,
    "catalog": 3.5,  # the built-in models and GGUF files, below what loads them
    "models": 4, "defaults": 4,  # models/: names, precision, device_map, hf, pair, loaded, loading
    "offline": 5, "bench": 5,
    "api": 6,
    "custom_generate": 7, "serve": 7,
    "cli": 8, "": 8,  # "": the package's own __init__
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(p): p for p in FILES}


def part_of(module: str) -> str:
    """The top-level part of `arborspec` a module belongs to ("" for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports_in(source: str, module: str, is_package: bool = False) -> set[str]:
    """The arborspec modules `source` (the text of `module`) imports, relative imports resolved.

    `from X import name` counts as importing `X.name` when that is a module, else `X`.
    """
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "arborspec"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] == "arborspec":
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names}
    return found


def imports_of(module: str) -> set[str]:
    path = MODULES[module]
    return imports_in(path.read_text(), module, path.name == "__init__.py")


def upward_imports(module: str, imported: set[str]) -> list[str]:
    """The imports of `module` that reach a layer not below its own (its own part excepted)."""
    mine = part_of(module)
    return sorted(t for t in imported if part_of(t) != mine and LAYERS[part_of(t)] >= LAYERS[mine])


def test_every_part_has_a_layer():
    assert {part_of(m) for m in MODULES} <= set(LAYERS), "a new top-level module or folder needs a layer here"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_downwards(module):
    assert upward_imports(module, imports_of(module)) == []


def test_the_direction_check_catches_a_violation():
    bad = "from ..builders import make_builder\nfrom .tree import TokenTree\n"
    assert upward_imports("arborspec.engine.bad", imports_in(bad, "arborspec.engine.bad")) == ["arborspec.builders"]
    peer = "def f():\n    from ..bench.prompts import load_prompts\n"
    assert (upward_imports("arborspec.offline.bad", imports_in(peer, "arborspec.offline.bad"))
            == ["arborspec.bench.prompts"])
    fine = "from ..engine.tree import TokenTree\nfrom .base import require_positive\n"
    assert upward_imports("arborspec.builders.ok", imports_in(fine, "arborspec.builders.ok")) == []


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` (as a path that returns to its start), or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                return path[path.index(nxt):] + [nxt]
            if nxt not in done:
                found = visit(nxt, path + [nxt])
                if found:
                    return found
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            found = visit(start, [start])
            if found:
                return found
    return None


def test_no_import_cycles():
    graph = {m: {t for t in imports_of(m) if t in MODULES and t != m} for m in MODULES}
    assert find_cycle(graph) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check has teeth
