"""The house's floors: no import circle between the package's parts, and the torch boundary at the bottom."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_compilecache"
#: What the torch boundary may import of the plugin: small data types, nothing that decides.
BELOW_TORCHAPI = {"caught", "environment", "files", "stats", "words"}


def _imports() -> dict[str, set[str]]:
    """``{part: parts it imports}``, a part being a subpackage or a top-level module (every import,
    at module level or inside a function)."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        part = parts[0] if parts[0] != "__init__" else "(package)"
        package = ["pytest_compilecache", *parts[:-1]]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[:len(package) - node.level + 1] + ([node.module] if node.module else [])
                names = [".".join(base[1:2])] if len(base) > 1 else [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pytest_compilecache."):
                names = [node.module.split(".")[1]]  # type: ignore[union-attr]
            else:
                continue
            found.setdefault(part, set()).update(n.split(".")[0] for n in names if n.split(".")[0] != part)
    return found


def test_no_part_of_the_package_imports_one_that_imports_it_back() -> None:
    graph = _imports()

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            part = todo.pop()
            if part == goal:
                return True
            if part not in seen:
                seen.add(part)
                todo.extend(graph.get(part, ()))
        return False

    circles = sorted(f"{a} <-> {b}" for a, targets in graph.items() for b in targets if a < b and reaches(b, a))
    assert circles == []


def test_the_torch_boundary_imports_nothing_of_the_plugin_but_small_data_types() -> None:
    assert _imports().get("_torchapi", set()) <= BELOW_TORCHAPI
