#!/usr/bin/env bash
# The README's main job: install into ./.venv, prune half the attention heads of the real MiniLM-L6
# (embedded as `minilm-l6`), save it, and benchmark it side by side against the original.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
surgery apply --strategy head-prune minilm-l6 --set ratio=0.5 --out out/minilm-hp --overwrite
surgery inspect out/minilm-hp
surgery bench out/minilm-hp --against minilm-l6 --repeats 10 --json out/minilm-hp-bench.json
