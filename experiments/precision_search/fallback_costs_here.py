"""What each op group costs in float on top of int8, signed, on this machine (OpenVINO, one thread).

For a fine-tuned MiniLM-L6 classifier of the suite (its NNCF int8 IR calibrated on 16 batches of the task's
own training texts, as compress calibrates), :func:`surgery.compress.latency_measure.measure_fallback_costs`
times the IR against the IR with one part (attention, FFN up, FFN down, classifier) back in float in every
layer, in interleaved rounds. A negative extra time means the part runs faster in float than in int8 here,
which the precision pass takes for free. The unchanged model in PyTorch fp32, the OpenVINO f32 IR and the
int8 IR are timed side by side as well. Records the CPU model and flags with the figures.

    OMP_NUM_THREADS=1 python experiments/precision_search/fallback_costs_here.py --work /work/bench \\
        --tasks rt-sentiment text-source --seeds 0
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import surgery  # noqa: E402
from experiments.tasks import load_suite_task  # noqa: E402
from surgery.compress.latency_measure import measure_fallback_costs, timing_batches  # noqa: E402
from surgery.measure.machine import machine_info  # noqa: E402
from surgery.measure.timing import load_average, time_models  # noqa: E402
from surgery.persist.assets import resolve_model_path  # noqa: E402
from surgery.runtimes import get_runtime  # noqa: E402
from surgery.runtimes.openvino.openvino_export import OV_XML, OpenVinoModel, export_openvino  # noqa: E402
from surgery.training.refit import task_calibration_batches  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "fallback_costs_here.json"


def one(work: Path, task_name: str, seed: int, tokenizer, repeats: int) -> dict:
    task = load_suite_task(task_name, tokenizer, seed=seed, max_train=2000, max_dev=400, max_test=1000)
    model = surgery.from_pretrained(work / task_name / str(seed) / "finetuned",
                                    model_class="AutoModelForSequenceClassification").eval()
    calibration = task_calibration_batches(task.data, 16, batch_size=32)
    seq_len = max(int(b["input_ids"].shape[1]) for b in calibration)
    with tempfile.TemporaryDirectory(prefix="fallback-costs-") as tmp:
        export_openvino(model, Path(tmp) / "int8", int8=True, calibration=calibration, threads=1,
                        save_tokenizer=False)
        export_openvino(model, Path(tmp) / "f32", threads=1, save_tokenizer=False)
        costs = measure_fallback_costs(Path(tmp) / "int8", model, runtime=get_runtime("openvino-int8"), batch_size=32,
                                       seq_len=seq_len, threads=1, repeats=repeats)
        served = {"torch fp32": model,
                  "openvino f32": OpenVinoModel(Path(tmp) / "f32" / OV_XML, config=model.config, threads=1),
                  "openvino int8": OpenVinoModel(Path(tmp) / "int8" / OV_XML, config=model.config, threads=1)}
        inputs = timing_batches(int(model.config.vocab_size), batch_size=32, seq_len=seq_len)
        timing = time_models(served, inputs, repeats=repeats, warmup=2, device=torch.device("cpu"), least=0.5)
        seconds, round_load = timing.steady()
    int8_ms = costs.measured["int8_ms"]
    return {"task": task_name, "seed": seed, "batch_size": 32, "seq_len": seq_len, "repeats": repeats,
            "int8_ms": int8_ms,
            "float_part_extra": {part: round(ms / int8_ms - 1.0, 4)
                                 for part, ms in costs.measured["float_part_ms"].items()},
            "per_unit_ms": costs.per_unit_ms, "fallback_round_load": costs.measured["round_load"],
            "speed_vs_torch_fp32": {name: round(seconds["torch fp32"] / s, 4) for name, s in seconds.items()},
            "runtime_round_load": round_load, "load_average": load_average()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="where the suite's fine-tuned models are")
    parser.add_argument("--tasks", nargs="+", default=["rt-sentiment", "rt-fresh-rotten-plot", "text-source"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("minilm-l6"))
    rows = [one(args.work, task, seed, tokenizer, args.repeats) for task in args.tasks for seed in args.seeds]
    out = {"machine": machine_info().model_dump(mode="json"), "threads": 1, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    for row in rows:
        print(row["task"], row["seed"], row["float_part_extra"], row["speed_vs_torch_fp32"])


if __name__ == "__main__":
    main()
