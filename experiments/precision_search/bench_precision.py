"""Precision in the search and the quantization-aware refit, on OpenVINO int8.

For each (task, seed, speedup), from the suite's fine-tuned MiniLM-L6 (2,000 training examples, as
experiments/compress_runtimes):

1. the removal path (``plan_compress``: mask Fisher on the training batches, greedy loss per ms) under a
   latency table whose shape follows the multiply-adds of each part, scaled to the measured times of the
   unchanged model in PyTorch fp32 and OpenVINO int8 (a measured OpenVINO int8 table takes ~15 minutes of
   this shared 2-core machine per run; every speed reported below is measured, not predicted);
2. ``refit``: the first path point predicted to reach the speedup, cut, refitted (least squares against the
   original, fp32 inputs), NNCF int8 (compress's recipe, calibrated on the same training batches);
3. ``qa-refit``: the same cut with the quantization-aware refit (``surgery.runtimes.openvino.quantized_refit``: the
   projections solved against the inputs the int8 IR feeds them), then NNCF int8;
4. ``qa-refit+fallbacks``: the precision pass: each op group's measured gain (calibration loss of the
   qa-refit int8 artefact minus that with the group alone in float) and measured cost (ms per head or
   neuron, probes on that artefact), traded against further cuts along the path
   (``removal_path.buy_fallbacks``); the cut it lands on is qa-refitted and exported with the map;
5. ``peer``: NNCF int8 of the unchanged fine-tuned model.

Every variant's dev and test accuracy is measured on its own OpenVINO artefact; speeds are timed side by
side in one process (interleaved rounds, one thread, median polish), against the fine-tuned model in
PyTorch fp32.

    OMP_NUM_THREADS=1 nice python experiments/precision_search/bench_precision.py --work WORK \
        --tasks rt-sentiment --seeds 0 --speedups 8 12
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import surgery
from experiments.tasks import load_suite_task
from surgery.compress.candidates import apply_removal
from surgery.compress.compress_report import SpeedupTarget
from surgery.compress.latency_measure import measure_fallback_costs
from surgery.compress.latency_source import TableLatency
from surgery.compress.latency_table import LatencyTable
from surgery.compress.plan import plan_compress
from surgery.compress.precision import describe_choice, fallback_gains, task_loss
from surgery.compress.removal_path import buy_fallbacks, start_indexed
from surgery.compress.structure import Structure
from surgery.core.manifest import set_int8_float
from surgery.measure.machine import machine_info
from surgery.measure.timing import make_inputs, time_models
from surgery.runtimes import get_runtime
from surgery.runtimes.openvino.openvino_export import OV_XML, OpenVinoModel, export_openvino
from surgery.runtimes.openvino.quantized_refit import quantization_aware_refit
from surgery.training import accuracy
from surgery.training.refit import refit_projections

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "precision_search" / "results" / "precision_search.json"
#: Share of an int8 layer's time outside the products (LayerNorm, bias, GELU, softmax; ALGORITHMS.md: ~40%).
OUTSIDE_PRODUCTS = 0.4


def flop_table(model: torch.nn.Module, runtime: str, total_ms: float, seq_len: int, *,
               reference_ms: float | None = None) -> LatencyTable:
    """A table whose parts follow their multiply-adds, scaled so the full model predicts ``total_ms``."""
    config = model.config
    d, heads, width, layers = config.hidden_size, config.num_attention_heads, config.intermediate_size, \
        config.num_hidden_layers
    head_dim = d // heads
    per_head = 4 * d * head_dim + 2 * seq_len * head_dim
    per_neuron = 2 * d
    products = heads * per_head + width * per_neuron
    layer_ms = total_ms * 0.95 / layers  # 5% outside the layers (embeddings, head)
    unit = layer_ms * (1 - OUTSIDE_PRODUCTS) / products
    return LatencyTable(runtime=runtime, batch_size=32, seq_len=seq_len, model_key="flop-minilm",
                        base_ms=total_ms * 0.05, overhead_ms=layer_ms * OUTSIDE_PRODUCTS,
                        attention_ms={h: unit * per_head * h for h in range(1, heads + 1)},
                        ffn_ms={w: unit * per_neuron * w for w in range(1, width + 1)},
                        reference_runtime="torch" if reference_ms is not None else None, reference_ms=reference_ms)


def paired_ms(models: dict[str, torch.nn.Module], inputs: dict[str, torch.Tensor], repeats: int) -> dict[str, float]:
    """Each model's ms per batch on a typical round, all timed in the same interleaved rounds."""
    timing = time_models(models, [inputs], repeats=repeats, warmup=1)
    return {name: 1000 * t for name, t in timing.steady()[0].items()}


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def int8(model: torch.nn.Module, out: Path, calibration: list[Any]) -> tuple[OpenVinoModel, dict[str, Any]]:
    report = export_openvino(model, out, int8=True, calibration=calibration, save_tokenizer=False, threads=1,
                             overwrite=True, batch=2, seq=8)
    served = OpenVinoModel(out / OV_XML, config=model.config, output=report.output, threads=1, task=report.task)
    return served, {"int8_float": report.int8_float, "int8_float_nodes": report.int8_float_nodes,
                    "quantize_seconds": round(report.quantize_seconds or 0.0, 1)}


def cut(original: torch.nn.Module, path: Any, k: int, refit_batches: list[Any]) -> torch.nn.Module:
    model = copy.deepcopy(original)
    apply_removal(model, path.removal_at(k))
    refit_projections(model, original, refit_batches)
    return model


def run(args: argparse.Namespace, task_name: str, seed: int, speedups: list[float]) -> list[dict[str, Any]]:
    tokenizer = AutoTokenizer.from_pretrained(args.work / task_name / str(seed) / "finetuned")
    task = load_suite_task(task_name, tokenizer, seed=seed, max_train=2000, max_dev=400, max_test=1000)
    original = surgery.from_pretrained(args.work / task_name / str(seed) / "finetuned",
                                       model_class="AutoModelForSequenceClassification").eval()
    dev, test = list(task.data.loader("eval")), list(task.test_data().loader("eval"))
    base = {"dev": accuracy(original, dev), "test": accuracy(original, test)}
    work = args.work / "precision" / f"{task_name}-{seed}"
    seq_len = 64
    inputs = make_inputs(int(original.config.vocab_size), batch_size=32, seq_len=seq_len)
    # Calibration as compress's: the plan's batches (training split); NNCF reads the same ones.
    probe_table = flop_table(original, "openvino-int8", 1.0, seq_len)
    plan0 = plan_compress(original, task.data, target=SpeedupTarget(speedup=max(speedups)), runtime="openvino-int8",
                          latency=TableLatency({"openvino-int8": probe_table, "torch": probe_table}), threads=1)
    calibration, refit_batches = plan0.smoothing, plan0.calibration
    peer, _ = int8(original, work / "peer", calibration)
    ms = paired_ms({"torch": original, "peer": peer}, inputs, args.repeats)
    tables = TableLatency({"openvino-int8": flop_table(original, "openvino-int8", ms["peer"], seq_len),
                           "torch": flop_table(original, "torch", ms["torch"], seq_len)})
    peer_figures = {"dev": accuracy(peer, dev), "test": accuracy(peer, test)}
    rows = []
    for speedup in speedups:
        started = time.perf_counter()
        plan = plan_compress(original, task.data, target=SpeedupTarget(speedup=speedup), runtime="openvino-int8",
                             latency=tables, threads=1, costs=plan0.costs)
        path = plan.path
        k0 = path.first_reaching(speedup)
        assert k0 is not None, f"the path does not reach {speedup}x"
        variants: dict[str, tuple[torch.nn.Module, OpenVinoModel, dict[str, Any]]] = {}
        plain = cut(original, path, k0, refit_batches)
        variants["refit"] = (plain, *int8(plain, work / f"{speedup}-refit", calibration))
        aware = copy.deepcopy(plain)
        qa = quantization_aware_refit(aware, original, refit_batches, calibration=calibration, threads=1)
        variants["qa-refit"] = (aware, *int8(aware, work / f"{speedup}-qa", calibration))
        # The precision pass on the qa-refit artefact: measured gains and costs, traded along the path.
        openvino_int8 = get_runtime("openvino-int8")
        gains = fallback_gains(work / f"{speedup}-qa", aware, task_loss(refit_batches), runtime=openvino_int8,
                               threads=1)
        costs = measure_fallback_costs(work / f"{speedup}-qa", aware, runtime=openvino_int8, batch_size=32,
                                       seq_len=seq_len, threads=1, repeats=args.repeats)
        removal0 = path.removal_at(k0)
        choice = buy_fallbacks(path, k0, start_indexed(gains, removal0), costs, target_speedup=speedup)
        chosen = cut(original, path, choice.step, refit_batches)
        set_int8_float(chosen, choice.int8_float)
        quantization_aware_refit(chosen, original, refit_batches, calibration=calibration, threads=1)
        variants["qa-refit+fallbacks"] = (chosen, *int8(chosen, work / f"{speedup}-fallbacks", calibration))
        timed = paired_ms({"torch": original, "peer": peer, **{n: v[1] for n, v in variants.items()}}, inputs,
                          args.repeats)
        row = {"task": task_name, "seed": seed, "speedup_target": speedup, "finetuned": base, "peer": {
            **peer_figures, "retained_test": 100 * peer_figures["test"] / base["test"],
            "speedup": ms["torch"] / ms["peer"]},
            "path_step": k0, "precision_step": choice.step, "precision_choice": choice.model_dump(),
            "gains": describe_choice(start_indexed(gains, removal0), costs, path.structure_at(k0)),
            "fallback_costs": costs.model_dump(), "qa_refit": qa.model_dump(), "variants": {}}
        for name, (model, served, info) in variants.items():
            figures = {"dev": accuracy(served, dev), "test": accuracy(served, test)}
            row["variants"][name] = {
                **figures, **info, "retained_test": 100 * figures["test"] / base["test"],
                "retained_dev": 100 * figures["dev"] / base["dev"],
                "speedup": timed["torch"] / timed[name], "vs_peer": timed["peer"] / timed[name],
                "structure": Structure.from_model(model).to_json(),
                "predicted_speedup": path.speedup_at(choice.step if name.endswith("fallbacks") else k0)}
        row["timed_ms"] = timed
        row["seconds"] = round(time.perf_counter() - started, 1)
        row["load_average"] = load()
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("task", "seed", "speedup_target", "path_step", "precision_step")}),
              {n: (round(v["retained_test"], 2), round(v["speedup"], 2)) for n, v in row["variants"].items()},
              flush=True)
        save(args, rows)
    return rows


def save(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    out: Path = args.out
    results = json.loads(out.read_text()) if out.exists() else {"runs": {}}
    for row in rows:
        results["runs"][f"{row['task']}|{row['seed']}|{row['speedup_target']}"] = row
    results["machine"] = machine_info()
    results["lscpu"] = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    results["threads"] = 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="where the suite's fine-tuned models are")
    parser.add_argument("--tasks", nargs="+", default=["rt-sentiment"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--speedups", nargs="+", type=float, default=[8.0, 12.0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for task in args.tasks:
        for seed in args.seeds:
            run(args, task, seed, args.speedups)


if __name__ == "__main__":
    main()
