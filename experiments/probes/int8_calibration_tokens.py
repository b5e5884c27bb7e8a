"""Does int8 calibration need 300 texts at 512 tokens, or do 75 (the same token positions as 300 at 128) do?

all-MiniLM-L6-v2 (real weights) on real texts joined to about 512 tokens (Rotten Tomatoes snippets, 18 a text:
``experiments/compress_cost/run_cost.py``'s corpus), exported to OpenVINO and quantized by NNCF through the library
(``write_openvino(int8=True)``, SmoothQuant on) on the first N calibration texts, N = 300 (NNCF's subset_size
default, compress's count before) and 75 (compress's ``int8_calibration`` token cap at 512 tokens). Each IR's
embeddings (mean pooled) against PyTorch fp32's on 160 other texts: mean and lowest cosine; and the seconds of each
quantization. One thread.

    OMP_NUM_THREADS=1 python experiments/probes/int8_calibration_tokens.py --corpus WORK/corpus-join18.txt \
        --out experiments/probes/results/int8_calibration_tokens.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

import surgery
from surgery.measure.machine import machine_info
from surgery.persist.assets import resolve_model_path
from surgery.runtimes.openvino.openvino_ir import OpenVinoModel, write_openvino


def batches(tokenizer, texts: list[str], size: int = 32) -> list[dict[str, torch.Tensor]]:
    return [dict(tokenizer(texts[i:i + size], truncation=True, max_length=512, padding=True, return_tensors="pt"))
            for i in range(0, len(texts), size)]


def pooled(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--counts", type=int, nargs="+", default=[300, 75])
    parser.add_argument("--held-out", type=int, default=160)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = resolve_model_path("minilm-l6")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = surgery.from_pretrained(path).eval()
    texts = [t for t in args.corpus.read_text().splitlines() if t.strip()]
    held, pool = texts[:args.held_out], texts[args.held_out:]
    judge = batches(tokenizer, held)
    with torch.no_grad():
        reference = [pooled(model(**b).last_hidden_state, b["attention_mask"]) for b in judge]
    rows = []
    for count in args.counts:
        calibration = batches(tokenizer, pool[:count])
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            write_openvino(model, Path(tmp) / "ir", int8=True, calibration=calibration, threads=1)
            seconds = time.perf_counter() - started
            served = OpenVinoModel(next((Path(tmp) / "ir").glob("*.xml")), config=model.config, threads=1)
            cos = torch.cat([torch.nn.functional.cosine_similarity(pooled(served(**b).last_hidden_state,
                                                                          b["attention_mask"]), r)
                             for b, r in zip(judge, reference, strict=True)])
        tokens = sum(int(b["attention_mask"].sum()) for b in calibration)
        rows.append({"texts": count, "token_positions": tokens, "seconds": round(seconds, 1),
                     "mean_cosine": float(cos.mean()), "min_cosine": float(cos.min())})
        print(rows[-1], flush=True)
    args.out.write_text(json.dumps({"machine": machine_info().model_dump(mode="json"), "model": "all-MiniLM-L6-v2",
                                    "held_out_texts": len(held), "load_average": list(os.getloadavg()),
                                    "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
