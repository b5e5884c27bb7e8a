#!/usr/bin/env bash
# The suite twice on a machine with a CUDA GPU: with the GPU visible, then hidden. A test that fails only in the
# first run is a CUDA-path bug (a model or batch left on the wrong device), not an environment difference.
# CI has no GPU, so this is run by hand where one is lent; pytest, pytest-xdist and the package must be installed.
#   bash scripts/suite_gpu_paths.sh [OUTDIR] [WORKERS]
set -u
cd "$(dirname "$0")/.."
out="${1:-gpu-paths}"; workers="${2:-8}"
mkdir -p "$out"
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'torch sees no CUDA GPU: nothing to compare')" || exit 2
run() {  # NAME: the suite's failures, worker and temp-dir numbers taken out so the two runs compare line by line
    HYPOTHESIS_PROFILE=ci python -m pytest -p no:cacheprovider -q -n "$workers" --dist loadfile tests > "$out/$1.log" 2>&1
    grep -E "^(FAILED|ERROR)" "$out/$1.log" | sed 's/popen-gw[0-9]*/popen-gwN/g; s/pytest-[0-9]*/pytest-N/g' | sort > "$out/$1_failures.txt"
    echo "$1: $(tail -1 "$out/$1.log")"
}
run gpu
CUDA_VISIBLE_DEVICES="" run cpu
echo "== failing only with the GPU visible:"
comm -23 "$out/gpu_failures.txt" "$out/cpu_failures.txt"
