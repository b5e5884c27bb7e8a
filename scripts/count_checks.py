"""Count what each test module checks: assert statements, ``pytest.raises``/``pytest.warns`` blocks and tests.

Usage: python scripts/count_checks.py [--json] [REV]

Reads tests/*.py of the working tree, or of git revision REV (``git show REV:tests/...``), so that the
count before and after a change to the suite comes from one script. Parametrised cases count once: this
counts the checks written, not the cases run. Example:

    python scripts/count_checks.py main > before.txt && python scripts/count_checks.py > after.txt
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def checks(source: str) -> dict[str, int]:
    """The asserts, ``pytest.raises``/``warns`` calls and test functions of one module's source."""
    tree = ast.parse(source)
    asserts = sum(isinstance(node, ast.Assert) for node in ast.walk(tree))
    raises = sum(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                 and node.func.attr in ("raises", "warns") and isinstance(node.func.value, ast.Name)
                 and node.func.value.id == "pytest" for node in ast.walk(tree))
    tests = sum(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
                for node in ast.walk(tree))
    return {"asserts": asserts, "raises": raises, "tests": tests}


def modules(rev: str | None) -> dict[str, str]:
    """tests/*.py (not the plugin package's or fixture trees') by name: their source at ``rev`` or on disk."""
    if rev is None:
        return {p.name: p.read_text() for p in sorted((ROOT / "tests").glob("*.py"))}
    names = subprocess.run(["git", "ls-tree", "--name-only", rev, "tests/"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    return {Path(n).name: subprocess.run(["git", "show", f"{rev}:{n}"], cwd=ROOT, check=True, capture_output=True,
                                         text=True).stdout for n in names if n.endswith(".py")}


def main(argv: list[str]) -> None:
    as_json = "--json" in argv
    rest = [a for a in argv if a != "--json"]
    counts = {name: checks(source) for name, source in modules(rest[0] if rest else None).items()}
    total = {key: sum(c[key] for c in counts.values()) for key in ("asserts", "raises", "tests")}
    if as_json:
        print(json.dumps({"modules": counts, "total": total}, indent=1))
        return
    print(f"{'module':<32} {'asserts':>7} {'raises':>6} {'tests':>5}")
    for name, c in counts.items():
        print(f"{name:<32} {c['asserts']:>7} {c['raises']:>6} {c['tests']:>5}")
    print(f"{'total':<32} {total['asserts']:>7} {total['raises']:>6} {total['tests']:>5}")


if __name__ == "__main__":
    main(sys.argv[1:])
