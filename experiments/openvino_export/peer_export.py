"""The peer's artefact: sentence-transformers' own static int8 OpenVINO export of all-MiniLM-L6-v2.

Runs in the stock venv of ``run.sh`` (sentence-transformers, optimum-intel, openvino, nncf; no surgery),
exactly as experiments/st_runtimes/bench_st_runtimes.py makes it: ``SentenceTransformer(dir,
backend="openvino")`` saved, then ``export_static_quantized_openvino_model`` with
``OVQuantizationConfig(num_samples=N)`` calibrated on the same calibration texts surgery gets
(WORK/calibration/train.csv, every text). Writes WORK/peer/openvino/openvino_model_qint8_quantized.xml
and WORK/peer_versions.json.

Usage: python peer_export.py WORK
"""

from __future__ import annotations

import csv
import importlib.metadata as md
import importlib.util
import json
import shutil
import sys
from pathlib import Path

from optimum.intel import OVQuantizationConfig
from sentence_transformers import SentenceTransformer, export_static_quantized_openvino_model

PEER_XML = "openvino/openvino_model_qint8_quantized.xml"


def main() -> None:
    work = Path(sys.argv[1])
    assert importlib.util.find_spec("surgery") is None, "the stock venv must not have surgery"
    target = work / "peer"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(Path((work / "model_path.txt").read_text().strip()), target)
    with (work / "calibration" / "train.csv").open() as f:
        samples = sum(1 for _ in csv.reader(f)) - 1
    model = SentenceTransformer(str(target), backend="openvino", device="cpu")
    model.save_pretrained(str(target))  # writes openvino/openvino_model.xml
    export_static_quantized_openvino_model(
        model, OVQuantizationConfig(num_samples=samples), str(target), dataset_name=str(work / "calibration"),
        dataset_config_name="default", dataset_split="train", column_name="text")
    if not (target / PEER_XML).is_file():
        raise SystemExit(f"sentence-transformers did not write {target / PEER_XML}")
    versions = {p: md.version(p) for p in ("sentence-transformers", "transformers", "optimum", "optimum-intel",
                                           "openvino", "nncf", "torch", "datasets")}
    (work / "peer_versions.json").write_text(json.dumps({"calibration_texts": samples, "versions": versions},
                                                        indent=1) + "\n")
    print("peer IR:", target / PEER_XML, versions)


if __name__ == "__main__":
    main()
