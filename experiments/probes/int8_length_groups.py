"""NNCF int8 calibration with texts of one length run together, against one text an item: the same ranges, faster?

compress writes an OpenVINO int8 artefact for every candidate, and NNCF's two statistics passes over the ~320
calibration texts were the largest step of a candidate (experiments/compress_cost). One text an item keeps padding
out of the activation ranges. Texts of the *same* length need no padding either: ``openvino_ir.length_groups`` stacks
them into one item each, and NNCF's ``batchwise_statistics`` keeps each text's statistics its own.

For each fine-tuned MiniLM-L6 classifier of the suite (``--work``: ``bench_suite.py``'s fine-tuned models), the IR of
the unchanged model is quantized both ways on compress's int8 calibration texts (the training split's first batches,
``int8_calibration``), interleaved over ``--rounds``. Reported: each way's ``nncf.quantize`` seconds, the largest
relative difference of any FakeQuantize range, and on the test split (1,000 texts that chose nothing, one at a time,
unpadded) each IR's accuracy, its agreement with PyTorch fp32 (argmax, mean absolute logit error), the two IRs'
argmax agreement and their logits' cosine. One thread.

    python experiments/probes/int8_length_groups.py --work /work/bench --seeds 0 \
        --out experiments/probes/results/int8_length_groups_zen4.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT))

TASKS = ("rt-sentiment", "rt-fresh-rotten-plot", "text-source")


def ranges(ov_model: Any) -> dict[str, list[np.ndarray]]:
    return {op.get_friendly_name(): [np.asarray(op.input_value(i).get_node().get_data(), dtype=np.float64)
                                     for i in range(1, 5)]
            for op in ov_model.get_ordered_ops() if op.get_type_name() == "FakeQuantize"}


def one_task(name: str, seed: int, work: Path, rounds: int) -> dict[str, Any]:
    import nncf
    import openvino as ov
    from transformers import AutoTokenizer

    import surgery
    from experiments.tasks import load_suite_task
    from surgery.compress.candidates import int8_calibration
    from surgery.compress.plan import CALIBRATION_BATCH, FISHER_EXAMPLES
    from surgery.persist.assets import resolve_model_path
    from surgery.runtimes.openvino import openvino_ir
    from surgery.runtimes.shared.graph_export import SingleOutput
    from surgery.training.refit import task_calibration_batches

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("minilm-l6"))
    task = load_suite_task(name, tokenizer, seed=seed, max_train=2000, max_dev=400, max_test=1000)
    model = surgery.from_pretrained(work / name / str(seed) / "finetuned",
                                    model_class="AutoModelForSequenceClassification").eval()
    batches = int8_calibration(task_calibration_batches(task.data, math.ceil(FISHER_EXAMPLES / CALIBRATION_BATCH),
                                                        batch_size=CALIBRATION_BATCH))
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in batches[0]]
    items = openvino_ir.calibration_examples(batches, names)
    with torch.no_grad():
        ir = openvino_ir.convert_to_ir(SingleOutput(model, "logits", names),
                                       {k: torch.as_tensor(v) for k, v in items[0].items()})

    def per_text() -> Any:  # the library's way before: one text an item, NNCF's default statistics
        advanced = nncf.AdvancedQuantizationParameters(
            smooth_quant_alphas=nncf.AdvancedSmoothQuantParameters(matmul=openvino_ir.SMOOTH_QUANT_ALPHA))
        with openvino_ir._quiet():
            return nncf.quantize(ir, nncf.Dataset(items), model_type=nncf.ModelType.TRANSFORMER,
                                 subset_size=len(items), fast_bias_correction=True, advanced_parameters=advanced)

    seconds: dict[str, list[float]] = {"per_text": [], "length_groups": []}
    for _ in range(rounds):
        start = time.perf_counter()
        alone = per_text()
        seconds["per_text"].append(round(time.perf_counter() - start, 2))
        start = time.perf_counter()
        grouped, info = openvino_ir.quantize(ir, items)
        seconds["length_groups"].append(round(time.perf_counter() - start, 2))
    a, b = ranges(alone), ranges(grouped)
    relative = [float(np.abs(x - y).max() / max(float(np.abs(x).max()), 1e-12))
                for key in a for x, y in zip(a[key], b[key], strict=True)]
    config = {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32"}
    core = ov.Core()
    first, second = core.compile_model(alone, "CPU", config), core.compile_model(grouped, "CPU", config)
    la, lb, lf, labels = [], [], [], []
    for row in task.test:  # one test text at a time, unpadded
        n = int(sum(row["attention_mask"]))
        feeds = {k: np.asarray([row[k][:n]], dtype=np.int64) for k in names}
        la.append(first(feeds)[0][0])
        lb.append(second(feeds)[0][0])
        with torch.no_grad():
            lf.append(model(**{k: torch.as_tensor(v) for k, v in feeds.items()}).logits[0].numpy())
        labels.append(row["labels"])
    la, lb, lf, y = np.array(la), np.array(lb), np.array(lf), np.array(labels)
    cosine = (la * lb).sum(1) / (np.linalg.norm(la, axis=1) * np.linalg.norm(lb, axis=1))
    return {"task": name, "seed": seed, "texts": len(items), "items": {"per_text": len(items),
                                                                       "length_groups": info.calibration_items},
            "quantize_seconds": seconds, "fake_quantize_nodes": len(a),
            "range_relative_difference": {"max": max(relative), "median": float(np.median(relative))},
            "test_texts": len(y), "accuracy": {"per_text": float((la.argmax(1) == y).mean()),
                                               "length_groups": float((lb.argmax(1) == y).mean())},
            "argmax_agreement": float((la.argmax(1) == lb.argmax(1)).mean()),
            "against_fp32": {way: {"argmax_agreement": float((logits.argmax(1) == lf.argmax(1)).mean()),
                                   "mean_abs_logit_error": float(np.abs(logits - lf).mean())}
                             for way, logits in (("per_text", la), ("length_groups", lb))},
            "logit_cosine": {"min": float(cosine.min()), "mean": float(cosine.mean())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from surgery.measure.machine import machine_info

    rows = []
    for seed in args.seeds:
        for name in args.tasks:
            rows.append(one_task(name, seed, args.work, args.rounds))
            print(json.dumps(rows[-1]), flush=True)
    import nncf
    import openvino

    args.out.write_text(json.dumps({"machine": machine_info().model_dump(mode="json"), "threads": 1,
                                    "versions": {"nncf": nncf.__version__, "openvino": openvino.__version__},
                                    "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
