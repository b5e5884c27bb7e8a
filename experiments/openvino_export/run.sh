#!/usr/bin/env bash
# surgery's OpenVINO int8 export of all-MiniLM-L6-v2 against sentence-transformers' own (issue 30), paired
# in one process. Steps: (1) with surgery (./.venv): the held-out and calibration texts of
# experiments/st_runtimes (split_texts.py: 2,000 held-out, 512 calibration snippets, disjoint), then
# `surgery export minilm-l6 --runtime openvino-int8 --calibration`; (2) the stock venv WORK-venv (the one
# experiments/st_runtimes/run.sh builds; run that first when it is missing) runs peer_export.py:
# sentence-transformers' export_static_quantized_openvino_model on the same 512 texts; (3) with surgery:
# fidelity (no lock), then the timed rounds under `flock LOCK`, then the report.
#
# Usage: bash experiments/openvino_export/run.sh [WORK_DIR]   (./.venv from scripts/install.sh test,onnx,openvino)
# Environment: THREADS (default "1"), ROUNDS (default 40), LOCK (a flock file the timed step takes; default none).
# Writes only inside WORK_DIR (default /tmp/st-runtimes), WORK_DIR-venv and experiments/openvino_export/results.
set -euo pipefail
cd "$(dirname "$0")/../.."
work="$(realpath -m "${1:-/tmp/st-runtimes}")"
venv="$work-venv"
study=experiments/openvino_export
threads="${THREADS:-1}"
rounds="${ROUNDS:-40}"
locked=()
if [ -n "${LOCK:-}" ]; then locked=(flock "$LOCK"); fi
mkdir -p "$work"

# (1) surgery's side (untimed steps under nice: other benchmarks may share the machine).
.venv/bin/python experiments/st_runtimes/split_texts.py "$work"
rm -rf "$work/surgery"
nice .venv/bin/surgery export minilm-l6 --out "$work/surgery" --runtime openvino-int8 \
    --calibration "$work/calibration.txt" --calibration-texts 512 --max-length 256

# (2) the peer, in the stock venv (no surgery), as experiments/st_runtimes/run.sh builds it.
if [ ! -x "$venv/bin/python" ]; then
    echo "no stock venv at $venv: experiments/st_runtimes/run.sh $work builds it (its step 2)" >&2
    exit 2
fi
(cd "$work" && nice "$venv/bin/python" "$OLDPWD/$study/peer_export.py" "$work")

# (3) fidelity, timing under the lock, report.
nice .venv/bin/python "$study/bench_openvino_export.py" fidelity "$work"
# shellcheck disable=SC2086  # THREADS is a list of numbers
"${locked[@]}" .venv/bin/python "$study/bench_openvino_export.py" time "$work" --threads $threads --rounds "$rounds"
# shellcheck disable=SC2086
.venv/bin/python "$study/bench_openvino_export.py" report "$work" --threads $threads
