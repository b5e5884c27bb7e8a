"""The import graph of surgery, surgery.strategies and surgery.cli: layers, no cycle, no private imports.

Read from the source with ``ast`` (nothing is imported). Every import is an edge, the ones inside a
function included (a function-level import dodges a cycle at import time, not in the design); only
imports under ``if TYPE_CHECKING:`` are left out, since they never run.

The layer order (docs/architecture.md, "Layers") is :data:`LAYERS`: a package may import its own
modules and packages of lower layers, nothing else. Packages that share a layer do not import each
other, so no package cycle can form; :func:`package_cycles` says so independently.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"surgery": ROOT / "surgery", "surgery.strategies": ROOT / "strategies", "surgery.cli": ROOT / "cli"}
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "layered"

#: Lowest first. The base knows no method and no training; the parts build on it; orchestration
#: chains steps from the parts; methods (surgery.strategies) are plugins over orchestration;
#: compress searches over methods; the package facade and the CLI sit on top.
LAYERS: list[set[str]] = [
    {"surgery.core"},
    {"surgery.anatomy", "surgery.scoring"},
    {"surgery.persist"},
    {"surgery.data"},
    {"surgery.training", "surgery.measure", "surgery.testing"},
    {"surgery.embedding"},
    {"surgery.runtimes.shared"},
    {"surgery.runtimes.torch", "surgery.runtimes.onnx", "surgery.runtimes.openvino"},
    {"surgery.runtimes"},
    {"surgery.deploy"},
    {"surgery.orchestration"},
    {"surgery.strategies"},
    {"surgery.compress"},
    {"surgery"},
    {"surgery.cli"},
]


def modules(packages: dict[str, Path] = PACKAGES) -> dict[str, Path]:
    found = {}
    for package, folder in packages.items():
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


def imports(known: dict[str, Path], top: str = "surgery") -> tuple[dict[str, set[str]], list[str]]:
    """Module -> the modules it imports (anywhere but under TYPE_CHECKING); private names imported across."""
    graph: dict[str, set[str]] = {m: set() for m in known}
    private = []
    for module, file in known.items():
        tree = ast.parse(file.read_text())
        skip = type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == top:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    target = owner(full if full in known else node.module, known)
                    if target and target != module:
                        graph[module].add(target)
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        private.append(f"{module} imports {node.module}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    target = owner(alias.name, known) if alias.name.split(".")[0] == top else None
                    if target and target != module:
                        graph[module].add(target)
    return graph, private


def package_of(module: str, layers: list[set[str]]) -> str:
    """The longest layered package that holds ``module`` (``surgery.core.run`` -> ``surgery.core``)."""
    named = {p for layer in layers for p in layer}
    name = module
    while name and name not in named:
        name = name.rpartition(".")[0]
    if not name:
        raise AssertionError(f"{module} is in no layer: add its package to LAYERS (and to docs/architecture.md)")
    return name


def layer_violations(graph: dict[str, set[str]], layers: list[set[str]]) -> list[str]:
    """Every edge from a package to one in the same or a higher layer, as 'a -> b (module -> module)'."""
    level = {p: i for i, layer in enumerate(layers) for p in layer}
    found = []
    for module, targets in sorted(graph.items()):
        here = package_of(module, layers)
        for target in sorted(targets):
            there = package_of(target, layers)
            if there != here and level[there] >= level[here]:
                found.append(f"{here} -> {there} ({module} -> {target})")
    return found


def package_graph(graph: dict[str, set[str]], layers: list[set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        here = package_of(module, layers)
        packages.setdefault(here, set()).update(package_of(t, layers) for t in targets)
        packages[here].discard(here)
    for targets in list(packages.values()):
        for t in targets:
            packages.setdefault(t, set())
    return packages


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
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


def test_every_import_goes_down_the_layers() -> None:
    graph, _ = imports(modules())
    assert graph["surgery.orchestration.api"], "the graph was not read"
    assert layer_violations(graph, LAYERS) == []


def test_no_package_cycle_and_no_module_cycle() -> None:
    graph, _ = imports(modules())
    assert cycles(package_graph(graph, LAYERS)) == []
    assert cycles(graph) == []


def test_no_module_imports_a_private_name_from_another() -> None:
    assert imports(modules())[1] == []


def test_the_layer_check_catches_an_upward_edge_in_a_fixture_tree() -> None:
    # tests/fixtures/layered/fakepkg: base/contract.py imports fakepkg.cli inside a function (an
    # upward edge), parts/a.py and parts/b.py import each other (a cycle), and parts/typed.py
    # imports fakepkg.cli only under TYPE_CHECKING (not an edge).
    layers = [{"fakepkg.base"}, {"fakepkg.parts"}, {"fakepkg.cli"}, {"fakepkg"}]
    graph, _ = imports(modules({"fakepkg": FIXTURE / "fakepkg"}), top="fakepkg")
    assert layer_violations(graph, layers) == [
        "fakepkg.base -> fakepkg.cli (fakepkg.base.contract -> fakepkg.cli.app)"]
    # the upward edge closes a package cycle with cli/app.py's import of the base
    assert cycles(package_graph(graph, layers)) == [["fakepkg.base", "fakepkg.cli"]]
    assert cycles(graph) == [["fakepkg.base.contract", "fakepkg.cli.app"], ["fakepkg.parts.a", "fakepkg.parts.b"]]
    assert graph["fakepkg.parts.typed"] == {"fakepkg.base.contract"}


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The bars of a layout a newcomer can read (docs/architecture.md, "Layers"): each library file name says
# one thing, and each public name is defined in one place (every other module imports it from there).


def repeated_file_names(folder: Path) -> dict[str, list[str]]:
    """Library file names (``__init__.py`` aside) that more than one module under ``folder`` bears."""
    found: dict[str, list[str]] = {}
    for file in sorted(folder.rglob("*.py")):
        if file.name != "__init__.py":
            found.setdefault(file.name, []).append(str(file.relative_to(folder.parent)))
    return {name: files for name, files in found.items() if len(files) > 1}


def public_definitions(known: dict[str, Path]) -> dict[str, set[str]]:
    """Each public top-level name -> the modules that define it (def, class or assignment; imports are no
    definitions, and neither is ``__all__``)."""
    found: dict[str, set[str]] = {}
    for module, file in known.items():
        for node in ast.parse(file.read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                names = []
            for name in names:
                if not name.startswith("_"):
                    found.setdefault(name, set()).add(module)
    return found


def test_no_library_file_name_repeats_across_surgery() -> None:
    assert repeated_file_names(PACKAGES["surgery"]) == {}


def test_no_public_name_is_defined_twice_in_surgery() -> None:
    surgery_only = {m: f for m, f in modules().items() if not m.startswith(("surgery.strategies", "surgery.cli"))}
    twice = {name: where for name, where in public_definitions(surgery_only).items() if len(where) > 1}
    assert twice == {}


def test_the_bars_catch_a_repeat_in_a_fixture_tree() -> None:
    # tests/fixtures/layered/fakepkg: base/contract.py and parts/a.py both define ``describe``; base/app.py
    # repeats cli/app.py's file name
    fake = modules({"fakepkg": FIXTURE / "fakepkg"})
    assert {n: w for n, w in public_definitions(fake).items() if len(w) > 1} == {
        "describe": {"fakepkg.base.contract", "fakepkg.parts.a"}}
    assert repeated_file_names(FIXTURE / "fakepkg") == {"app.py": ["fakepkg/base/app.py", "fakepkg/cli/app.py"]}
