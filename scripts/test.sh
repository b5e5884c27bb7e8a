#!/usr/bin/env bash
# Install surgery with its test dependencies into ./.venv and run the linter and the test suite (CPU only).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test,onnx,openvino
. .venv/bin/activate
ruff check .
HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}" python -m pytest
