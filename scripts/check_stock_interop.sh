#!/usr/bin/env bash
# Check that `surgery.compress.stock_export.save_stock` writes a directory that STOCK transformers
# (AutoModel.from_pretrained) and STOCK sentence-transformers (SentenceTransformer(dir), its default
# torch backend) load and compute with, in a virtual environment that does not have surgery (issue 24, --stock).
#
# Steps: (1) with surgery (./.venv): cut MiniLM-L6 to a structure a stock BERT config can state (FFN
# neurons pruned by magnitude to half in every layer, `ffn-prune ratio=0.5 scope=layer`, then 2 of its
# 6 layers dropped, `layer-drop count=2`), write it with save_stock, and write surgery's own token states
# and sentence embeddings of 256 held-out corpus texts; (2) in a venv with only torch, transformers and
# sentence-transformers: load the directory with AutoModel and with SentenceTransformer, compute the same,
# compare. Writes experiments/stock_interop/results/result.json.
#
# Usage: bash scripts/check_stock_interop.sh [WORK_DIR]    (needs ./.venv from scripts/install.sh test)
# The stock venv is WORK_DIR-venv; it is reused when it exists.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-/tmp/stock-interop}"
venv="$work-venv"
rm -rf "$work" && mkdir -p "$work"
out="$PWD/experiments/stock_interop/results/result.json"
mkdir -p "$(dirname "$out")"

.venv/bin/python - "$work" <<'EOF'
import json, random, sys
from pathlib import Path
import numpy as np
import torch
import surgery
from surgery.compress.stock_export import save_stock
from surgery.embedding import embed_texts, read_sentence_config
from experiments.embedding_suite import corpus_texts
from surgery.core.manifest import source_dir_of
from surgery.strategies import FFNPruningStrategy, LayerDropStrategy
from transformers import AutoTokenizer
work = Path(sys.argv[1])
texts = corpus_texts()
random.Random(0).shuffle(texts)
texts = texts[:256]
model = surgery.from_pretrained("minilm-l6")
source = source_dir_of(model)
tokenizer, config = AutoTokenizer.from_pretrained(source), read_sentence_config(source)
surgery.convert(model, FFNPruningStrategy(ratio=0.5, scope="layer"))
surgery.convert(model, LayerDropStrategy(count=2))
save_stock(model, work / "stock")
batch = tokenizer(texts[:32], padding=True, truncation=True, max_length=128, return_tensors="pt")
with torch.no_grad():
    states = model(**batch).last_hidden_state.numpy()
np.savez(work / "reference.npz", embeddings=embed_texts(model, tokenizer, texts, config).numpy(), states=states,
         **{f"input_{k}": v.numpy() for k, v in batch.items()})
(work / "texts.json").write_text(json.dumps(texts))
(work / "structure.json").write_text(json.dumps({
    "original_layers": model.config.num_hidden_layers, "kept_layers": len(surgery.inspect(model).layers),
    "ffn_width": sorted({layer.ffn_width for layer in surgery.inspect(model).layers}),
    "steps": [s["strategy"] for s in surgery.inspect(model).model_dump()["steps"]]}))
print("surgery side written:", sorted(p.name for p in (work / "stock").iterdir()))
EOF

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q torch==2.13.0
    "$venv/bin/python" -m pip install -q transformers sentence-transformers
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
import torch
from sentence_transformers import SentenceTransformer
from transformers import AutoModel

work, out = Path(sys.argv[1]), Path(sys.argv[2])
assert importlib.util.find_spec("surgery") is None, "this venv must not have surgery"
texts = json.loads((work / "texts.json").read_text())
reference = np.load(work / "reference.npz")
model, info = AutoModel.from_pretrained(str(work / "stock"), output_loading_info=True)
batch = {k.removeprefix("input_"): torch.from_numpy(reference[k]) for k in reference.files if k.startswith("input_")}
with torch.no_grad():
    states = model.eval()(**batch).last_hidden_state.numpy()
mask = batch["attention_mask"].numpy().astype(bool)
st = SentenceTransformer(str(work / "stock"), device="cpu")
got = st.encode(texts, batch_size=32, convert_to_numpy=True)
want = reference["embeddings"]
cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
result = {
    "what": "stock AutoModel.from_pretrained(dir) and SentenceTransformer(dir) (torch backend) on the directory "
            "save_stock wrote, in a venv without surgery; MiniLM-L6 with half of every layer's FFN neurons pruned "
            "(magnitude, scope=layer) and 2 of 6 layers dropped (every-other), no training; compared with "
            "surgery's own outputs of the same model (fp32 PyTorch)",
    "structure": json.loads((work / "structure.json").read_text()),
    "files": sorted(p.name for p in (work / "stock").iterdir()),
    "versions": {p: md.version(p) for p in ("transformers", "sentence-transformers", "torch")},
    "surgery_installed": False,
    "automodel": {"class": type(model).__name__, "num_hidden_layers": model.config.num_hidden_layers,
                  "intermediate_size": model.config.intermediate_size,
                  "missing_keys": list(info["missing_keys"]), "unexpected_keys": list(info["unexpected_keys"]),
                  "mismatched_keys": [list(k[:1]) for k in info["mismatched_keys"]],
                  "texts": int(mask.shape[0]),
                  "max_abs_diff_token_states": float(np.abs(states - reference["states"])[mask].max())},
    "sentence_transformers": {"texts": len(texts), "shape": list(got.shape),
                              "max_abs_diff": float(np.abs(got - want).max()),
                              "min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())},
}
print(json.dumps(result, indent=2))
assert not info["missing_keys"] and not info["unexpected_keys"], "the stock load did not match every weight"
assert result["automodel"]["max_abs_diff_token_states"] < 1e-4, "AutoModel's token states differ from surgery's"
assert result["sentence_transformers"]["max_abs_diff"] < 1e-4, "SentenceTransformer's embeddings differ"
out.write_text(json.dumps(result, indent=2) + "\n")
print("wrote", out)
EOF
