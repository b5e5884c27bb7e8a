#!/usr/bin/env bash
# Install surgery with its test dependencies into ./.venv and run the linter and the test suite (CPU only).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test,onnx,openvino
. .venv/bin/activate
ruff check .
# pytest-xdist: one worker per core (at most 4: each imports torch); --dist loadfile keeps every module on one
# worker so module fixtures are built once (tests/conftest.py makes modules that share the session's exports
# one unit). SURGERY_TEST_WORKERS=0 runs in this process.
workers="${SURGERY_TEST_WORKERS:-$(python -c 'import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))')}"
HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}" python -m pytest -n "$workers" --dist loadfile
