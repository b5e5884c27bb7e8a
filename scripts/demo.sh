#!/usr/bin/env bash
# The README's main job: install into ./.venv, then run SHRP on the real MiniLM-L6 (`minilm-l6`) and
# Rotten Tomatoes (`rotten-tomatoes`): fine-tune one epoch, convert the top 3 of 6 layers to Expert
# Attention one per epoch, train 2 more, prune each to its most used head, save, and benchmark the
# result side by side against the original. About 9 minutes on an otherwise idle 2-core machine, install
# included (the README's figure); up to about 20 with other jobs on the same cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
surgery apply --strategy shrp minilm-l6 --data rotten-tomatoes --max-train 2400 \
    --set objective=task --set num_layers=3 --set finetune_epochs=1 --set learning_rate=1e-4 \
    --out out/minilm-shrp --overwrite --report out/minilm-shrp-report.json
surgery inspect out/minilm-shrp
surgery bench out/minilm-shrp --against minilm-l6 --repeats 10 --json out/minilm-shrp-bench.json --overwrite
