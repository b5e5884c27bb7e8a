"""Every ``surgery`` name that a study script under ``experiments/`` imports still exists.

The benchmark scripts are not run by the suite (they train for minutes), so a moved module would
only show when someone runs one; this test resolves their imports instead (read with ``ast``).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parent.parent / "experiments").rglob("*.py"))


def surgery_imports(path: Path) -> list[tuple[str, str | None]]:
    """``(module, name)`` for every ``from surgery... import name`` and ``(module, None)`` for ``import surgery...``."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "surgery":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names if alias.name.split(".")[0] == "surgery"]
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=[f"{p.parent.name}/{p.name}" for p in SCRIPTS])
def test_script_imports_resolve(script: Path) -> None:
    missing = []
    for module_name, name in surgery_imports(script):
        module = importlib.import_module(module_name)
        if name is None or hasattr(module, name):
            continue
        try:  # `from package import submodule`
            importlib.import_module(f"{module_name}.{name}")
        except ModuleNotFoundError:
            missing.append(f"{module_name}.{name}")
    assert not missing, f"{script.name} imports names that no longer exist: {missing}"


def test_some_scripts_are_checked() -> None:
    assert len(SCRIPTS) >= 10 and any(surgery_imports(p) for p in SCRIPTS)
