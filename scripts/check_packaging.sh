#!/usr/bin/env bash
# Prove the packaging: an editable install and a built wheel, each in a fresh venv, import
# surgery.strategies and surgery.cli (shipped from the top-level strategies/ and cli/ folders) and run
# `surgery --help`; neither leaves a top-level `strategies` or `cli` package in site-packages.
#
# Usage: bash scripts/check_packaging.sh        (PYTHON=python3.X to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step() { printf '\n== %s\n' "$*"; }

# Checks run from an empty directory, so the repository's own folders are not on sys.path.
check_env() {
    local venv=$1 label=$2
    mkdir -p "$work/cwd"
    (
        cd "$work/cwd"
        "$venv/bin/python" - "$label" <<'EOF'
import importlib.util
import sys

import surgery
import surgery.cli
import surgery.strategies
from surgery.core.registry import methods

label = sys.argv[1]
for name in ("strategies", "cli"):
    spec = importlib.util.find_spec(name)
    if spec is not None:
        sys.exit(f"{label}: a top-level package {name!r} is importable from {spec.origin}")
builtins = {"head-prune", "ffn-prune"} - set(methods())
if builtins:
    sys.exit(f"{label}: built-in strategies {sorted(builtins)} are not registered through entry points")
print(f"{label}: surgery from {surgery.__file__}")
print(f"{label}: surgery.strategies from {surgery.strategies.__file__}")
print(f"{label}: surgery.cli from {surgery.cli.__file__}")
print(f"{label}: no top-level 'strategies' or 'cli'; registered strategies: {', '.join(strategies())}")
EOF
        "$venv/bin/surgery" --help > "$work/help.txt"
        grep -q "apply" "$work/help.txt" || { echo "$label: 'surgery --help' does not list the apply command"; exit 1; }
        echo "$label: 'surgery --help' ran ($(wc -l < "$work/help.txt") lines)"
    )
}

fresh_venv() {
    local venv=$1
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    # Pinned: a local CPU wheel here; an unpinned torch would pull several GB of CUDA packages.
    "$venv/bin/python" -m pip install -q torch==2.13.0
}

step "build the wheel"
"$python" -m venv "$work/build-venv"  # building needs no torch: pip builds in an isolated environment
"$work/build-venv/bin/python" -m pip install -q --upgrade pip
"$work/build-venv/bin/python" -m pip wheel -q --no-deps --wheel-dir "$work/dist" "$root"
wheel=$(ls "$work"/dist/encoder_surgery-*.whl)
echo "built $(basename "$wheel")"

step "wheel contents: top-level names"
"$python" - "$wheel" <<'EOF'
import sys
import zipfile

names = zipfile.ZipFile(sys.argv[1]).namelist()
top = sorted({n.split("/")[0] for n in names})
print("top-level entries:", ", ".join(top))
packages = sorted({n.rsplit("/", 1)[0] for n in names if n.endswith("__init__.py")})
print("packages:", ", ".join(packages))
bad = [t for t in top if t not in ("surgery",) and not t.endswith(".dist-info")]
if bad:
    sys.exit(f"the wheel has top-level entries besides surgery/: {bad}")
for needed in ("surgery/strategies/__init__.py", "surgery/cli/__init__.py", "surgery/cli/app.py"):
    if needed not in names:
        sys.exit(f"the wheel lacks {needed}")
top_level = [n for n in names if n.endswith(".dist-info/top_level.txt")]
if top_level:
    print("top_level.txt:", zipfile.ZipFile(sys.argv[1]).read(top_level[0]).decode().split())
print("wheel layout OK")
EOF

step "fresh venv: install the wheel"
fresh_venv "$work/wheel-venv"
"$work/wheel-venv/bin/python" -m pip install -q "$wheel"
check_env "$work/wheel-venv" "wheel"

step "fresh venv: editable install"
fresh_venv "$work/editable-venv"
"$work/editable-venv/bin/python" -m pip install -q -e "$root"
check_env "$work/editable-venv" "editable"

step "packaging OK: wheel and editable install both import surgery.strategies and surgery.cli and run surgery --help"
