"""Refit against quantization-aware refit on OpenVINO int8, all-MiniLM-L6-v2 embeddings (no fine-tuning needed).

A uniform cut at the shape compress picked for ``--speedup 8`` on OpenVINO int8 (8 of 12 heads and 1,056 of
1,536 FFN neurons in every layer; experiments/compress_runtimes), units chosen by the norm of their columns
in the output projection (a plain magnitude rule: this compares two refits of one cut, not cut choices).
Then: ``refit`` (least squares against the original, fp32 inputs) and ``qa-refit`` (the same, then solved
against the inputs the int8 IR feeds each projection), each exported with NNCF int8 (compress's recipe,
calibrated on the same training batches); the unchanged model in int8 (``peer``) for scale. Mean cosine of
each int8 artefact's sentence embeddings against the original in PyTorch fp32 on held-out test texts that
chose nothing. Run from the repository root::

    OMP_NUM_THREADS=1 nice python experiments/precision_search/qa_refit_embeddings.py
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments.compress.bench_compress import embedding_split
from surgery.anatomy import adapter_for
from surgery.embedding.evaluate import evaluate_embeddings
from surgery.measure.machine import machine_info
from surgery.runtimes.openvino.openvino_export import OV_XML, OpenVinoModel, export_openvino
from surgery.runtimes.openvino.quantized_refit import quantization_aware_refit
from surgery.training.refit import refit_projections, task_calibration_batches

OUT = Path(__file__).resolve().parent / "results" / "qa_refit_embeddings.json"
KEEP_HEADS, KEEP_NEURONS, HEAD_DIM, BATCHES, TEST_TEXTS = 8, 1056, 32, 8, 500


def cut(model: torch.nn.Module) -> None:
    adapter = adapter_for(model)
    for i in range(adapter.num_layers):
        parts = adapter.layer(i)
        o = parts.attention.output.weight.detach()
        head_norm = o.reshape(o.shape[0], -1, HEAD_DIM).square().sum((0, 2))
        down = parts.ffn.down.weight.detach().square().sum(0)
        adapter.remove_units(i, {"heads": head_norm.argsort()[: len(head_norm) - KEEP_HEADS].tolist(),
                                 "neurons": down.argsort()[: len(down) - KEEP_NEURONS].tolist()})


def main() -> None:
    torch.set_num_threads(1)
    start = time.perf_counter()
    split = embedding_split("minilm-l6", 0)
    original, tokenizer, sentence = split["original"], split["tokenizer"], split["sentence"]
    batches = [{k: v for k, v in b.items() if k != "labels"} for b in
               task_calibration_batches(split["data"], BATCHES, batch_size=32)]
    texts = split["test_texts"][:TEST_TEXTS]
    refit = copy.deepcopy(original)
    cut(refit)
    solved = refit_projections(refit, original, batches)
    aware = copy.deepcopy(refit)
    qa = quantization_aware_refit(aware, original, batches, calibration=batches, threads=1)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in (("peer", original), ("refit", refit), ("qa-refit", aware)):
            out = Path(tmp) / name
            report = export_openvino(model, out, task="base", int8=True, calibration=batches, threads=1, batch=2,
                                     seq=8)
            served = OpenVinoModel(out / OV_XML, config=model.config, output=report.output, threads=1)
            figures = evaluate_embeddings(served, original, tokenizer, texts, sentence, max_length=64)
            rows[name] = {"mean_cosine": figures.mean_cosine, "recall_at_10": figures.recall_at_k}
            print(name, rows[name], flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "model": "all-MiniLM-L6-v2", "cut": {"heads": KEEP_HEADS, "ffn_width": KEEP_NEURONS, "layers": 6},
        "calibration_batches": BATCHES, "test_texts": len(texts), "results": rows,
        "refit_error": solved.error, "qa_refit_error": qa.error, "seconds": round(time.perf_counter() - start, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()], "machine": machine_info(),
        "lscpu": subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
