"""Recovery tiers that fit a CPU: bf16 against fp32 training steps, and accuracy won back per budget minute.

Two parts, both written to ``results/recovery_tiers.json`` (machine, load average, commit with each):

* ``speed``: HF Trainer steps per second of MiniLM-L6 (``minilm-l6`` with a 2-label head) at batch 32 x 64
  tokens, ``bf16=True`` (the Trainer's autocast) against fp32, at one and two threads, in alternating
  rounds (fp32 then bf16, then bf16 then fp32 ...), each round a fresh Trainer of a few steps timed by a
  callback from step begin to step end (the first step of each round left out). Ratio per round, median.
* ``tiers``: on one suite task (MiniLM-L6 fine-tuned on 2,000 examples, 2 epochs, lr 1e-4, as the suite
  does) per seed: a cut to 1/12 of the encoder's projection multiply-adds (every layer keeps its 2 heads
  and 64 FFN neurons of highest mask Fisher, compress's importance), refitted by least squares (compress's
  free first tier; compress's amounts of calibration). From that same refitted model, in this machine's
  precision (bf16 where the CPU has it, else fp32): block-wise reconstruction; block-wise then one
  distillation epoch; one distillation epoch alone (teacher cached); with ``--live-teacher`` the epoch with
  the teacher run at every step; on a bf16 CPU the epoch in fp32 as well. Per tier:
  its estimate from timed steps (surgery.compress.training_tier), its actual seconds, dev and test accuracy,
  and dev points won back per minute. Distillation loss curves (running mean per step) are recorded.

Run from the repository root (one thread: the CPU is shared)::

    OMP_NUM_THREADS=1 nice python experiments/recovery_tiers/bench_recovery_tiers.py --part speed
    OMP_NUM_THREADS=1 nice python experiments/recovery_tiers/bench_recovery_tiers.py --part tiers --seeds 0 1
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import datasets
import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
import surgery

# The step timer lives in the standalone device script (torch + transformers only, run where this project
# is not installed); importing it keeps one timer for both.
from experiments.recovery_tiers.bf16_trainer_speed import StepTimer
from experiments.tasks import load_suite_task
from surgery.compress import training_tier
from surgery.compress.candidates import apply_removal
from surgery.compress.mask_fisher import mask_fisher
from surgery.compress.plan import FISHER_EXAMPLES, refit_batches
from surgery.compress.removal_path import Removal
from surgery.core.progress import ProgressEvent
from surgery.data.task_data import PaddingCollator, TaskData
from surgery.measure.machine import machine_info
from surgery.training import RecoveryConfig, accuracy, fit, recover, training_arguments
from surgery.training.blockwise import BlockwiseConfig, output_errors, reconstruct_layers
from surgery.training.refit import refit_projections, task_calibration_batches

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "recovery_tiers" / "results" / "recovery_tiers.json"
KEEP_HEADS, KEEP_NEURONS = 2, 64


def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def load_classifier(labels: int = 2) -> torch.nn.Module:
    return surgery.from_pretrained("minilm-l6", model_class="AutoModelForSequenceClassification", num_labels=labels,
                                    allow_new_head=True)


def speed(args: argparse.Namespace) -> dict[str, Any]:
    """Trainer steps/s, bf16 against fp32, one and two threads, alternating rounds."""
    from surgery.training import SurgeryTrainer

    gen = torch.Generator().manual_seed(0)
    steps = args.speed_steps
    rows = datasets.Dataset.from_dict({
        "input_ids": torch.randint(1000, 20000, (32 * steps, 64), generator=gen).tolist(),
        "labels": torch.randint(0, 2, (32 * steps,), generator=gen).tolist()})
    base = load_classifier()
    if args.speed_model == "cut":
        # The tier study's student: every layer keeps KEEP_HEADS heads and KEEP_NEURONS neurons (which ones does not
        # change a step's time). A step of so small a model is mostly fixed costs, which bf16 does not shrink.
        layers = base.config.num_hidden_layers
        apply_removal(base, Removal(heads={i: list(range(KEEP_HEADS, base.config.num_attention_heads))
                                           for i in range(layers)},
                                    neurons={i: list(range(KEEP_NEURONS, base.config.intermediate_size))
                                             for i in range(layers)}))
    out: dict[str, Any] = {"batch": 32, "seq_len": 64, "steps_per_round": steps, "rounds": args.rounds,
                           "model": args.speed_model, "threads": {}}
    for threads in args.speed_threads:
        torch.set_num_threads(threads)
        times: dict[str, list[float]] = {"fp32": [], "bf16": []}
        ratios = []
        for r in range(args.rounds):
            order = ("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32")
            this_round = {}
            for mode in order:
                model = copy.deepcopy(base)
                timer = StepTimer()
                with tempfile.TemporaryDirectory() as tmp:
                    trainer = SurgeryTrainer(model=model, args=training_arguments(tmp, epochs=1, batch_size=32,
                                                                                  bf16=mode == "bf16"),
                                             train_dataset=rows, data_collator=PaddingCollator(None))
                    trainer.add_callback(timer)
                    trainer.train()
                this_round[mode] = statistics.median(timer.seconds[1:])
                times[mode].append(this_round[mode])
            ratios.append(this_round["fp32"] / this_round["bf16"])
            print(f"threads {threads} round {r}: fp32 {this_round['fp32']:.3f}s bf16 {this_round['bf16']:.3f}s "
                  f"ratio {ratios[-1]:.2f} load {os.getloadavg()[0]:.1f}", flush=True)
        out["threads"][str(threads)] = {
            "fp32_step_s": times["fp32"], "bf16_step_s": times["bf16"], "ratio_per_round": ratios,
            "median_ratio": statistics.median(ratios),
            "fp32_steps_per_s": 1 / statistics.median(times["fp32"]),
            "bf16_steps_per_s": 1 / statistics.median(times["bf16"]), "load_average": list(os.getloadavg())}
    return out


def finetuned(task: Any, seed: int, args: argparse.Namespace) -> torch.nn.Module:
    """MiniLM-L6 fine-tuned on the task (2 epochs, lr 1e-4, the suite's ``finetuned``).

    Read from ``--suite-work`` (experiments/suite/bench_suite.py's layout, WORK/task/seed/finetuned) when
    it holds one, else fine-tuned here the same way and cached under ``--work``.
    """
    for where in (args.suite_work / task.name / str(seed) / "finetuned", args.work / task.name / str(seed)):
        if (where / "config.json").exists():
            return surgery.from_pretrained(where, model_class="AutoModelForSequenceClassification").eval()
    model = load_classifier(task.data.num_labels)
    with tempfile.TemporaryDirectory() as tmp:
        fit(model, task.data, training_arguments(tmp, epochs=2, batch_size=32, learning_rate=1e-4, seed=seed))
    from surgery.persist.model_io import save_pretrained

    save_pretrained(model, args.work / task.name / str(seed))
    return model.eval()


def twelve_x_cut(original: torch.nn.Module, data: TaskData) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Every layer keeps its KEEP_HEADS heads and KEEP_NEURONS neurons of highest mask Fisher; then the refit."""
    # compress's own amounts: FISHER_EXAMPLES to score, the first of them the refit reads (refit_batches).
    batches = task_calibration_batches(data, math.ceil(FISHER_EXAMPLES / 32), batch_size=32)
    heads, neurons, _ = mask_fisher(original, batches, objective="task")
    removal = Removal(heads={i: sorted(s.argsort()[:-KEEP_HEADS].tolist()) for i, s in heads.items()},
                      neurons={i: sorted(s.argsort()[:-KEEP_NEURONS].tolist()) for i, s in neurons.items()})
    model = copy.deepcopy(original)
    apply_removal(model, removal)
    started = time.perf_counter()
    refit = refit_projections(model, original, refit_batches(batches))
    cfg = original.config
    per_layer_full = 4 * cfg.hidden_size ** 2 + 2 * cfg.hidden_size * cfg.intermediate_size
    head = cfg.hidden_size // cfg.num_attention_heads
    per_layer_cut = 4 * cfg.hidden_size * KEEP_HEADS * head + 2 * cfg.hidden_size * KEEP_NEURONS
    return model, {"keep_heads": KEEP_HEADS, "keep_neurons": KEEP_NEURONS,
                   "projection_macs_ratio": per_layer_full / per_layer_cut,
                   "refit_seconds": round(time.perf_counter() - started, 2),
                   "refit_projections": len(refit.projections)}


def tiers(args: argparse.Namespace, seed: int, tokenizer: Any, save: Any = None) -> dict[str, Any]:
    """One seed of the tier study; ``save(row)`` is called after each stage (a long run leaves its partial row)."""
    torch.set_num_threads(args.threads)
    task = load_suite_task(args.task, tokenizer, seed=seed, max_train=2000, max_dev=400, max_test=1000)
    data, test = task.data, task.test_data()
    original = finetuned(task, seed, args)
    def dev(model: torch.nn.Module) -> float:
        return accuracy(model, data.loader("eval", batch_size=64))

    def tst(model: torch.nn.Module) -> float:
        return accuracy(model, test.loader("eval", batch_size=64))

    row: dict[str, Any] = {"task": args.task, "seed": seed, "original_dev": dev(original)}
    save = save or (lambda _row: None)
    refitted, row["cut"] = twelve_x_cut(original, data)
    row["refit_dev"], row["refit_test"] = dev(refitted), tst(refitted)
    bf16 = training_tier.bf16_training()
    row["bf16_available"] = bf16
    calibration = task_calibration_batches(data, training_tier.BLOCKWISE_BATCHES, batch_size=32)
    row["layer_error_refit"] = output_errors(refitted, original, calibration[:4])
    row["runs"] = runs = {}
    save(row)
    print(f"[seed {seed}] original dev {row['original_dev']:.4f}; refit dev {row['refit_dev']:.4f} test "
          f"{row['refit_test']:.4f}; load {os.getloadavg()[0]:.1f}", flush=True)

    def blockwise(model: torch.nn.Module) -> dict[str, Any]:
        cfg = BlockwiseConfig(bf16=bf16, seed=seed)
        estimate = training_tier.estimate_blockwise(model, original, calibration, cfg)
        started = time.perf_counter()
        result = reconstruct_layers(model, original, calibration, cfg)
        return {"estimate_s": estimate.seconds, "seconds": time.perf_counter() - started,
                "error": result.error, "kept": result.kept}

    def distil(model: torch.nn.Module, use_bf16: bool, cache: bool = True) -> dict[str, Any]:
        estimate = training_tier.estimate_distil(model, original, data, 32, bf16=use_bf16)
        curve: list[float] = []

        def log(event: ProgressEvent) -> None:
            if event.task.startswith("recovery epoch") and event.info.get("loss") is not None and \
                    "epoch" not in event.info:
                curve.append(round(float(event.info["loss"]), 5))

        started = time.perf_counter()
        result = recover(model, original, data, RecoveryConfig(epochs=1, batch_size=32, seed=seed, bf16=use_bf16,
                                                               cache_teacher=cache), progress=log)
        # The estimate covers the cached teacher's one pass; without the cache the teacher runs at every step.
        return {"estimate_s": estimate.seconds, "seconds": time.perf_counter() - started, "steps": result.steps,
                "bf16": use_bf16, "cache_teacher": cache, "loss_curve": curve}

    # This machine's precision (bf16 only where the CPU has it). Each plan starts from the refitted model, but
    # "blockwise+distil-1ep" continues from "blockwise"'s model (its time is the sum): one reconstruction, not two.
    plans = {"blockwise": (None, "blockwise"), "distil-1ep": (None, "distil"),
             "blockwise+distil-1ep": ("blockwise", "distil")}
    if args.live_teacher:
        plans["distil-1ep-live-teacher"] = (None, "distil-live")
    if bf16:
        plans["distil-1ep-fp32"] = (None, "distil-fp32")
    models: dict[str, torch.nn.Module] = {}
    for name, (start, part) in plans.items():
        model = copy.deepcopy(models[start] if start else refitted)
        got = blockwise(model) if part == "blockwise" else distil(model, bf16 and part != "distil-fp32",
                                                                    cache=part != "distil-live")
        before = runs[start] if start else {"seconds": 0.0, "estimate_s": 0.0, "parts": {}}
        record: dict[str, Any] = {"parts": {**before["parts"], part: got},
                                  "seconds": before["seconds"] + got["seconds"],
                                  "estimate_s": before["estimate_s"] + got["estimate_s"]}
        record["dev"], record["test"] = dev(model), tst(model)
        record["dev_points_per_minute"] = 100 * (record["dev"] - row["refit_dev"]) / (record["seconds"] / 60)
        record["test_points_per_minute"] = 100 * (record["test"] - row["refit_test"]) / (record["seconds"] / 60)
        record["layer_error"] = output_errors(model, original, calibration[:4])
        record["load_average"] = list(os.getloadavg())
        runs[name] = record
        models[name] = model
        save(row)
        print(f"[seed {seed}] {name}: dev {row['refit_dev']:.4f} -> {record['dev']:.4f}, test {row['refit_test']:.4f} "
              f"-> {record['test']:.4f} in {record['seconds']:.0f}s (estimated {record['estimate_s']:.0f}s), "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
    row["runs"] = runs
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["speed", "tiers"], required=True)
    parser.add_argument("--task", default="rt-sentiment")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--speed-steps", type=int, default=6)
    parser.add_argument("--speed-threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--speed-model", choices=["full", "cut"], default="full",
                        help="--part speed: MiniLM-L6 whole, or cut as the tier study cuts it (2 heads and 64 "
                        "neurons a layer), written under speed_cut")
    parser.add_argument("--live-teacher", action="store_true", help="also one epoch with the teacher run at every "
                        "step (the cost the cache saves)")
    parser.add_argument("--work", type=Path, default=ROOT / "logs" / "recovery_work")
    parser.add_argument("--suite-work", type=Path, default=ROOT / "logs" / "suite_work",
                        help="fine-tuned models of experiments/suite/bench_suite.py --methods finetuned, read only")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results["machine"] = machine_info().model_dump(mode="json")
    if args.part == "speed":
        key = "speed" if args.speed_model == "full" else f"speed_{args.speed_model}"
        results[key] = {**speed(args), "commit": commit()}
    else:
        from surgery.persist.assets import resolve_model_path

        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("minilm-l6"))
        results.setdefault("tiers", {})
        for seed in args.seeds:
            def save(row: dict[str, Any], seed: int = seed) -> None:
                row.update(commit=commit(), threads=args.threads, load_average_now=list(os.getloadavg()))
                results["tiers"][f"{args.task}|{seed}"] = row
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(results, indent=1))

            save(tiers(args, seed, tokenizer, save))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
