#!/usr/bin/env bash
# surgery's int8 exports against sentence-transformers' own ONNX and OpenVINO exports (issue 25), side by
# side in one process, in a venv without surgery (as scripts/check_st_onnx_interop.sh does: surgery needs
# transformers 5, optimum-onnx needs transformers < 4.58).
#
# Steps: (1) with surgery (./.venv): held-out and calibration texts (split_texts.py), then all-MiniLM-L6-v2
# exported as `--format sentence-transformers --runtime onnxruntime-int8`, with and without `--calibration`; (2) the stock venv
# WORK-venv, made once and reused; (3) in it, sentence-transformers' own exports (bench_st_runtimes.py export),
# then every backend's embeddings of the held-out texts (embed) and the interleaved timing (time), the timing
# alone under the lock when LOCK names one (flock: timed runs on a shared machine take turns); (4) with
# surgery's venv, intervals and fidelity (report_st_runtimes.py) into experiments/st_runtimes/results/.
#
# Usage: bash experiments/st_runtimes/run.sh [WORK_DIR]     (needs ./.venv from scripts/install.sh test,onnx)
# Environment: THREADS (default "1 2"), ROUNDS (default 15), LOCK (a flock file for the timed steps; default
# none), NAME (results file stem, default st_runtimes), TORCH_INDEX (see step 2).
# Writes only inside WORK_DIR (default /tmp/st-runtimes), WORK_DIR-venv and experiments/st_runtimes/results.
set -euo pipefail
cd "$(dirname "$0")/../.."
work="$(realpath -m "${1:-/tmp/st-runtimes}")"
venv="$work-venv"
study=experiments/st_runtimes
threads="${THREADS:-1 2}"
rounds="${ROUNDS:-15}"
locked=()
if [ -n "${LOCK:-}" ]; then locked=(flock "$LOCK"); fi
mkdir -p "$work"

# (1) surgery's side. `surgery export` refuses to write over a folder, so only its own two outputs are cleared.
# The untimed steps run under nice: other people's benchmarks may share the machine.
.venv/bin/python "$study/split_texts.py" "$work"
rm -rf "$work/surgery-int8" "$work/surgery-int8-smooth"
nice .venv/bin/surgery export minilm-l6 --out "$work/surgery-int8-smooth" --format sentence-transformers \
    --runtime onnxruntime-int8 \
    --calibration "$work/calibration.txt"
nice .venv/bin/surgery export minilm-l6 --out "$work/surgery-int8" --format sentence-transformers \
    --runtime onnxruntime-int8

# (2) the stock venv: the version set of /work/shared/design/ASSETS.md that installs together, torch from the
# CPU wheel index (plain PyPI's torch pulls the CUDA libraries; TORCH_INDEX= empty keeps pip's own configuration,
# e.g. where a local wheel house already holds the CPU build). huggingface-hub < 1: transformers 4.57 refuses 1.x.
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    torch_index="${TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
    "$venv/bin/python" -m pip install -q torch==2.13.0 ${torch_index:+--extra-index-url "$torch_index"}
    "$venv/bin/python" -m pip install -q sentence-transformers==5.7.0 transformers==4.57.6 optimum==2.1.0 \
        optimum-onnx==0.1.0 onnxruntime==1.32.0 optimum-intel==1.27.0 openvino==2026.4.1 nncf==3.4.0 \
        datasets==5.0.1 "huggingface-hub<1" torch==2.13.0
fi

# (3) the stock side, run from the work folder (from the repository root, Python would find ./surgery).
bench="$PWD/$study/bench_st_runtimes.py"
(cd "$work" && nice "$venv/bin/python" "$bench" export "$work")
(cd "$work" && nice "$venv/bin/python" "$bench" embed "$work")
# shellcheck disable=SC2086  # THREADS is a list of numbers
(cd "$work" && "${locked[@]}" "$venv/bin/python" "$bench" time "$work" --threads $threads --rounds "$rounds")

# (4) intervals and fidelity with surgery's own code.
.venv/bin/python "$study/report_st_runtimes.py" "$work" --name "${NAME:-st_runtimes}"
