#!/usr/bin/env bash
# Check that surgery's OpenVINO artefacts load in STOCK libraries, in a virtual environment without surgery
# (issue 30): `surgery export --runtime openvino[-int8] --format sentence-transformers` with
# SentenceTransformer(dir, backend="openvino"), and the plain IR directory (`--runtime openvino`) with
# optimum-intel's OVModelForFeatureExtraction (and a classifier with OVModelForSequenceClassification).
#
# sentence-transformers' OpenVINO backend loads through optimum-intel, which needs transformers < 4.58 while
# surgery needs transformers 5; so the stock side runs in its own venv (the one experiments/st_runtimes/run.sh
# builds: sentence-transformers 5.7, transformers 4.57, optimum-intel 1.27, openvino, nncf, torch CPU).
#
# Steps: (1) with surgery (./.venv): prune MiniLM-L6's heads and FFN neurons (a structure stock transformers
# cannot rebuild), export it as a sentence-transformers directory in fp32 and in NNCF int8 (calibrated on 256
# corpus texts), and as a plain IR directory; write surgery's own embeddings and hidden states of held-out texts;
# (2) in the stock venv: load each with the stock class, encode the same texts, compare.
# Writes experiments/openvino_export/results/st_openvino_interop.json. Not part of CI (it builds a venv).
#
# Usage: bash scripts/check_st_openvino_interop.sh [WORK_DIR]   (./.venv from scripts/install.sh test,onnx,openvino)
# The stock venv is $VENV (default: /tmp/st-runtimes-venv when it exists, else WORK_DIR-venv, made here).
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(realpath -m "${1:-/tmp/st-openvino-interop}")"
venv="${VENV:-}"
if [ -z "$venv" ]; then
    if [ -x /tmp/st-runtimes-venv/bin/python ]; then venv=/tmp/st-runtimes-venv; else venv="$work-venv"; fi
fi
rm -rf "$work" && mkdir -p "$work"
out="$PWD/experiments/openvino_export/results/st_openvino_interop.json"

.venv/bin/python - "$work" <<'EOF_TEXTS'
import random, sys
from pathlib import Path
from experiments.embedding_suite import corpus_texts
work = Path(sys.argv[1])
texts = corpus_texts()
random.Random(0).shuffle(texts)
(work / "calibration.txt").write_text("\n".join(" ".join(t.split()) for t in texts[256:512]) + "\n")
EOF_TEXTS
nice .venv/bin/surgery apply --strategy head-prune minilm-l6 --set ratio=0.5 --out "$work/heads" >/dev/null
nice .venv/bin/surgery apply --strategy ffn-prune "$work/heads" --set ratio=0.5 --out "$work/pruned" >/dev/null
nice .venv/bin/surgery export "$work/pruned" --out "$work/st-ov-fp32" --format sentence-transformers --runtime openvino
nice .venv/bin/surgery export "$work/pruned" --out "$work/st-ov-int8" --format sentence-transformers \
    --runtime openvino-int8 --calibration "$work/calibration.txt" --calibration-texts 256
nice .venv/bin/surgery export "$work/pruned" --out "$work/ir-fp32" --runtime openvino
# A classifier too (a tiny random BERT with uneven heads and FFN widths: the head is what is checked).
.venv/bin/python - "$work" <<'EOF_CLS'
import sys
from pathlib import Path
import numpy as np
import torch
import surgery
from surgery.strategies import FFNPruningStrategy, HeadPruningStrategy
from surgery.testing import TinySpec, tiny_inputs, tiny_model
work = Path(sys.argv[1])
spec = TinySpec("bert", task="seq-cls")
model = tiny_model(spec).eval()
surgery.convert(model, HeadPruningStrategy(heads={0: [1, 2]}))
surgery.convert(model, FFNPruningStrategy(neurons={0: list(range(20)), 1: list(range(5))}))
surgery.save_pretrained(model, work / "cls")
inputs = tiny_inputs(spec, batch=5, seq=11)
np.savez(work / "cls_inputs.npz", **{k: v.numpy() for k, v in inputs.items()})
with torch.no_grad():
    np.save(work / "cls_logits.npy", model(**inputs).logits.numpy())
EOF_CLS
nice .venv/bin/surgery export "$work/cls" --out "$work/ir-cls" --runtime openvino
.venv/bin/python - "$work" <<'EOF_SURGERY'
import json, random, sys
from pathlib import Path
import numpy as np
import torch
import surgery
from surgery.embedding import embed_texts, read_sentence_config
from experiments.embedding_suite import corpus_texts
from transformers import AutoTokenizer
work = Path(sys.argv[1])
texts = corpus_texts()
random.Random(0).shuffle(texts)
texts = texts[:256]
model = surgery.from_pretrained(work / "pruned").eval()
tokenizer = AutoTokenizer.from_pretrained(work / "pruned")
np.save(work / "reference.npy", embed_texts(model, tokenizer, texts, read_sentence_config(work / "pruned")).numpy())
batch = tokenizer(texts[:8], padding=True, return_tensors="pt")
with torch.no_grad():
    hidden = model(**batch).last_hidden_state
np.save(work / "hidden.npy", (hidden * batch["attention_mask"][..., None]).numpy())
(work / "texts.json").write_text(json.dumps(texts))
print("surgery embeddings and hidden states written")
EOF_SURGERY

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q torch==2.13.0
    "$venv/bin/python" -m pip install -q sentence-transformers==5.7.0 transformers==4.57.6 optimum==2.1.0 \
        optimum-intel==1.27.0 openvino==2026.4.1 nncf==3.4.0 "huggingface-hub<1"
fi
# Run from the work directory: from the repository root, Python would import ./surgery.
cd "$work"
"$venv/bin/python" - "$work" "$out" <<'EOF_STOCK'
import importlib.metadata as md
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch
from optimum.intel import OVModelForFeatureExtraction, OVModelForSequenceClassification
from sentence_transformers import SentenceTransformer
from transformers import AutoTokenizer

work, out = Path(sys.argv[1]), Path(sys.argv[2])
assert importlib.util.find_spec("surgery") is None, "this venv must not have surgery"
texts = json.loads((work / "texts.json").read_text())
reference = np.load(work / "reference.npy")
f32 = {"INFERENCE_PRECISION_HINT": "f32", "CACHE_DIR": ""}
result = {"what": "stock SentenceTransformer(dir, backend='openvino') and optimum-intel OVModelForFeatureExtraction "
                  "on directories written by `surgery export --runtime openvino[-int8]`, in a venv without surgery; "
                  "MiniLM-L6 with half its heads and half its FFN neurons pruned (magnitude, no training), 256 "
                  "corpus texts; compared with surgery's own fp32 PyTorch outputs",
          "versions": {p: md.version(p) for p in ("sentence-transformers", "transformers", "optimum-intel", "openvino",
                                                   "torch")},
          "surgery_installed": False}
for name in ("st-ov-fp32", "st-ov-int8"):
    model = SentenceTransformer(str(work / name), backend="openvino", device="cpu", model_kwargs={"ov_config": f32})
    got = model.encode(texts, batch_size=32, convert_to_numpy=True)
    cos = (got * reference).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1))
    result[name] = {"loader": "SentenceTransformer(dir, backend='openvino')", "shape": list(got.shape),
                    "max_abs_diff": float(np.abs(got - reference).max()), "min_cosine": float(cos.min()),
                    "mean_cosine": float(cos.mean())}
    print(name, result[name])
ov = OVModelForFeatureExtraction.from_pretrained(str(work / "ir-fp32"), ov_config=f32, compile=True)
tokenizer = AutoTokenizer.from_pretrained(str(work / "ir-fp32"))
batch = tokenizer(texts[:8], padding=True, return_tensors="pt")
hidden = ov(**batch).last_hidden_state.numpy() * batch["attention_mask"].numpy()[..., None]
result["ir-fp32"] = {"loader": "optimum.intel.OVModelForFeatureExtraction.from_pretrained(dir)",
                     "max_abs_diff": float(np.abs(hidden - np.load(work / "hidden.npy")).max())}
print("ir-fp32", result["ir-fp32"])
classifier = OVModelForSequenceClassification.from_pretrained(str(work / "ir-cls"), ov_config=f32, compile=True)
inputs = {k: torch.from_numpy(v) for k, v in np.load(work / "cls_inputs.npz").items()}
logits = classifier(**inputs).logits.numpy()
result["ir-cls"] = {"loader": "optimum.intel.OVModelForSequenceClassification.from_pretrained(dir)",
                    "what": "tiny random BERT classifier, layer 0 at 2 of 4 heads, FFN widths 17 and 32",
                    "max_abs_diff": float(np.abs(logits - np.load(work / "cls_logits.npy")).max())}
print("ir-cls", result["ir-cls"])
assert result["ir-cls"]["max_abs_diff"] < 1e-4, "optimum-intel's logits differ from surgery's"
assert result["st-ov-fp32"]["max_abs_diff"] < 1e-4, "fp32 OpenVINO embeddings differ from surgery's"
assert result["ir-fp32"]["max_abs_diff"] < 1e-3, "optimum-intel's hidden states differ from surgery's"
assert result["st-ov-int8"]["mean_cosine"] > 0.99, "int8 embeddings drifted"
out.write_text(json.dumps(result, indent=2) + "\n")
print("wrote", out)
EOF_STOCK
