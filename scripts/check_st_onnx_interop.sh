#!/usr/bin/env bash
# Check that `surgery export --format sentence-transformers` writes a directory that STOCK
# sentence-transformers loads with its ONNX backend and encodes with, in a virtual environment that
# does not have surgery (issue 11).
#
# sentence-transformers' ONNX backend loads through Optimum (`optimum-onnx`), whose newest release
# (0.1.0) needs transformers < 4.58, while surgery needs transformers 5; so the stock side runs in its
# own venv: sentence-transformers 5.x, transformers 4.57, optimum-onnx, onnxruntime, torch (CPU).
#
# Steps: (1) with surgery (./.venv): prune MiniLM-L6's heads and FFN neurons (a structure stock
# transformers cannot rebuild), export it as a sentence-transformers directory in fp32 and in int8,
# and write surgery's own embeddings of held-out texts; (2) in the stock venv: load both directories
# with SentenceTransformer(dir, backend="onnx"), encode the same texts, compare.
# Writes experiments/embeddings/results/st_onnx_interop.json.
#
# Usage: bash scripts/check_st_onnx_interop.sh [WORK_DIR]    (needs ./.venv from scripts/install.sh test,onnx)
# The stock venv is WORK_DIR-venv; it is reused when it exists.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-/tmp/st-onnx-interop}"
venv="$work-venv"
rm -rf "$work" && mkdir -p "$work"
out="$PWD/experiments/embeddings/results/st_onnx_interop.json"

.venv/bin/surgery apply --strategy head-prune minilm-l6 --set ratio=0.5 --out "$work/heads" >/dev/null
.venv/bin/surgery apply --strategy ffn-prune "$work/heads" --set ratio=0.5 --out "$work/pruned" >/dev/null
.venv/bin/surgery export "$work/pruned" --out "$work/st-fp32" --format sentence-transformers
.venv/bin/surgery export "$work/pruned" --out "$work/st-int8" --format sentence-transformers --runtime onnxruntime-int8
.venv/bin/python - "$work" <<'EOF'
import json, random, sys
from pathlib import Path
import numpy as np
import surgery
from surgery.embedding import embed_texts, read_sentence_config
from experiments.embedding_suite import corpus_texts
from transformers import AutoTokenizer
work = Path(sys.argv[1])
texts = corpus_texts()
random.Random(0).shuffle(texts)
texts = texts[:256]
model = surgery.from_pretrained(work / "pruned")
config = read_sentence_config(work / "pruned")
reference = embed_texts(model, AutoTokenizer.from_pretrained(work / "pruned"), texts, config).numpy()
np.save(work / "reference.npy", reference)
(work / "texts.json").write_text(json.dumps(texts))
print("surgery embeddings:", reference.shape)
EOF

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q torch==2.13.0
    "$venv/bin/python" -m pip install -q "sentence-transformers>=5,<6" "transformers>=4.56,<4.58" \
        "optimum-onnx[onnxruntime]==0.1.0"
fi
# Run from the work directory: from the repository root, Python would import ./surgery.
cd "$work"
"$venv/bin/python" - "$work" "$out" <<'EOF'
import importlib.metadata as md
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
from sentence_transformers import SentenceTransformer

work, out = Path(sys.argv[1]), Path(sys.argv[2])
assert importlib.util.find_spec("surgery") is None, "this venv must not have surgery"
texts = json.loads((work / "texts.json").read_text())
reference = np.load(work / "reference.npy")
result = {"what": "stock SentenceTransformer(dir, backend='onnx') on directories written by "
                  "`surgery export --format sentence-transformers`, in a venv without surgery; MiniLM-L6 with "
                  "half its heads and half its FFN neurons pruned (magnitude, no training), 256 corpus texts; "
                  "compared with surgery's own embeddings of the same texts (fp32 PyTorch)",
          "versions": {p: md.version(p) for p in ("sentence-transformers", "transformers", "optimum-onnx",
                                                   "onnxruntime", "torch")},
          "surgery_installed": False}
for name in ("st-fp32", "st-int8"):
    model = SentenceTransformer(str(work / name), backend="onnx", device="cpu")
    got = model.encode(texts, batch_size=32, convert_to_numpy=True)
    cos = (got * reference).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1))
    result[name] = {"shape": list(got.shape), "max_abs_diff": float(np.abs(got - reference).max()),
                    "min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())}
    print(name, result[name])
assert result["st-fp32"]["max_abs_diff"] < 1e-4, "fp32 ONNX embeddings differ from surgery's"
out.write_text(json.dumps(result, indent=2) + "\n")
print("wrote", out)
EOF
