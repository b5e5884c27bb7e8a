#!/usr/bin/env bash
# Install surgery with its test dependencies into ./.venv and run the linter and the test suite (CPU only).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test,onnx,openvino
. .venv/bin/activate
ruff check .
# pytest-xdist: one worker per core (at most 4: each imports torch); --dist loadgroup keeps every module on one
# worker (tests/conftest.py groups by module) so module fixtures are built once, and modules that share the
# session's exports name one group. SURGERY_TEST_WORKERS=0 runs in this process.
workers="${SURGERY_TEST_WORKERS:-$(python -c 'import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))')}"
HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}" python -m pytest -n "$workers" --dist loadgroup
