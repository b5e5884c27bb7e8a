"""The import graph of surgery, surgery.strategies and surgery.cli: no cycle, no private imports.

Read from the source with ``ast`` (nothing is imported). An import made at module level (outside
``if TYPE_CHECKING:``) is an edge; so is one inside a function, which the library uses only to keep
heavy optional packages off the import path, never to dodge a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"surgery": ROOT / "surgery", "surgery.strategies": ROOT / "strategies", "surgery.cli": ROOT / "cli"}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for file in folder.rglob("*.py"):
            parts = [p for p in file.relative_to(folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = file
    return found


def owner(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def type_checking_nodes(tree: ast.Module) -> set[int]:
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}


def imports(known: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    graph: dict[str, set[str]] = {m: set() for m in known}
    private = []
    for module, file in known.items():
        tree = ast.parse(file.read_text())
        skip = type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("surgery"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    target = owner(full if full in known else node.module, known)
                    if target and target != module:
                        graph[module].add(target)
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        private.append(f"{module} imports {node.module}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    target = owner(alias.name, known) if alias.name.startswith("surgery") else None
                    if target and target != module:
                        graph[module].add(target)
    return graph, private


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycle() -> None:
    graph, _ = imports(modules())
    assert "surgery.core.strategy" in graph and graph["surgery.orchestration.api"], "the graph was not read"
    assert cycles(graph) == []


def test_no_module_imports_a_private_name_from_another() -> None:
    assert imports(modules())[1] == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
