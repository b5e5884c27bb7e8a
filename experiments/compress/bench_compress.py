"""Issue 24's benchmark: `surgery.compress` on fine-tuned MiniLM-L6 classifiers, tasks x seeds x targets.

For every (task, seed) the fine-tuned classifier comes from the suite's ``finetuned`` method
(``experiments/suite/bench_suite.py --steps train --methods finetuned``, saved under ``--work``), on
the same seeded split: ``compress`` reads the train split (calibration, Fisher, refit, training) and
the dev split (judging candidates); the test split chose nothing and reports. For each target the
winner's test accuracy is measured on the runtime it was chosen for (the smoothed int8 ONNX graph
for ``onnxruntime-int8``), and retained = winner test / fine-tuned test. Speedups are the ones
``compress`` measured side by side against the fine-tuned model in PyTorch fp32.

    nice python experiments/suite/bench_suite.py --steps train --methods finetuned --max-train 2000 \\
        --max-dev 400 --max-test 1000 --seeds 0 1 2 --baseline-epochs 2 --work WORK --out WORK/finetuned.json
    nice python experiments/compress/bench_compress.py --work WORK --targets torch-2x int8-4x
    python experiments/compress/bench_compress.py --render-only
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

import surgery
from surgery.compress import SpeedupTarget
from surgery.data.assets import resolve_model_path
from surgery.data.tasks import load_task
from surgery.measure.machine import machine_info
from surgery.measure.stats import mean_std
from surgery.training import accuracy

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "compress" / "results" / "compress.json"
#: name -> (speedup, runtime, budget minutes or None for the no-training tier), as issue 24 lists them.
TARGETS: dict[str, tuple[float, str, float | None]] = {
    "torch-1.6x-notrain": (1.6, "torch", 5.0),
    "torch-2x": (2.0, "torch", None),
    "int8-4x": (4.0, "onnxruntime-int8", None),
    "int8-6x": (6.0, "onnxruntime-int8", None),
}
ISSUE_TARGETS = {"torch-1.6x-notrain": 99.0, "torch-2x": 99.5, "int8-4x": 98.5, "int8-6x": 97.0}


def runtime_accuracy(result: Any, runtime: str, test: Any, workdir: Path) -> float:
    """Test accuracy of the winner on the runtime it was chosen for."""
    if runtime == "torch":
        return accuracy(result.model, test.loader("eval"))
    from surgery.deploy.export import export_onnx
    from surgery.deploy.runtime import OnnxRuntimeModel

    out = workdir / "onnx"
    int8 = runtime.endswith("int8")
    # As compress judged it: smoothed on the run's own calibration batches, then dynamic int8.
    report = export_onnx(result.model, out, int8=int8, calibration=(result.calibration or None) if int8 else None,
                         save_tokenizer=False, batch=2, seq=8, threads=1)
    ort = OnnxRuntimeModel(out / "model.onnx", config=result.model.config, output=report.output, threads=1,
                           task=report.task)
    return accuracy(ort, test.loader("eval"))


def run_one(args: argparse.Namespace, task_name: str, seed: int, target_name: str, tokenizer: Any) -> dict[str, Any]:
    speedup, runtime, budget = TARGETS[target_name]
    task = load_task(task_name, tokenizer, seed=seed, max_train=args.max_train, max_dev=args.max_dev,
                     max_test=args.max_test)
    model_dir = args.work / task_name / str(seed) / "finetuned"
    original = surgery.from_pretrained(model_dir, model_class="AutoModelForSequenceClassification").eval()
    test = task.test_data()
    base_test = accuracy(original, test.loader("eval"))
    torch.manual_seed(seed)
    start = time.perf_counter()
    result = surgery.compress(original, task.data, target=SpeedupTarget(speedup=speedup), runtime=runtime,
                              budget_minutes=budget, threads=args.threads, seed=seed)
    seconds = time.perf_counter() - start
    report = result.report
    winner = report.winner_result()
    tmp = args.work / "compress_tmp" / f"{task_name}-{seed}-{target_name}"
    tmp.mkdir(parents=True, exist_ok=True)
    test_acc = runtime_accuracy(result, runtime, test, tmp)
    return {
        "task": task_name, "seed": seed, "target": target_name, "speedup_target": speedup, "runtime": runtime,
        "budget_minutes": budget, "finetuned_test": base_test, "test": test_acc,
        "retained": 100.0 * test_acc / base_test, "seconds": seconds,
        "winner": report.winner, "why": report.why, "warnings": report.warnings,
        "measured_speedup": winner.measured_speedup if winner else None,
        "speedup_interval": winner.speedup_interval if winner else None,
        "predicted_speedup": winner.predicted_speedup if winner else None,
        "dev_drop": winner.drop if winner else None, "structure": winner.structure if winner else None,
        "training": report.training, "candidates": [c.model_dump(mode="json") for c in report.candidates],
        "phases": report.phases,
    }


def render(results: dict[str, Any]) -> str:
    runs = results["runs"]
    lines = ["| target | issue's target | retained % (test, mean ± std) | measured speedup | predicted | "
             "job minutes | runs |", "|---|---|---|---|---|---|---|"]
    for name in TARGETS:
        rows = [r for r in runs.values() if r["target"] == name]
        if not rows:
            continue
        ret = mean_std([r["retained"] for r in rows])
        sp = mean_std([r["measured_speedup"] or 0.0 for r in rows])
        pr = mean_std([r["predicted_speedup"] or 0.0 for r in rows])
        mins = mean_std([r["seconds"] / 60 for r in rows])
        speed, runtime, _ = TARGETS[name]
        lines.append(f"| {name} ({runtime}, {speed:g}x) | >= {ISSUE_TARGETS[name]:g}% at >= {speed:g}x | "
                     f"{ret[0]:.1f} ± {ret[1]:.1f} | {sp[0]:.2f} ± {sp[1]:.2f}x | {pr[0]:.2f}x | "
                     f"{mins[0]:.1f} | {len(rows)} |")
    lines += ["", "| task | seed | target | fine-tuned test | winner test | retained % | winner | measured x |",
              "|---|---|---|---|---|---|---|---|"]
    for r in sorted(runs.values(), key=lambda r: (r["target"], r["task"], r["seed"])):
        lines.append(f"| {r['task']} | {r['seed']} | {r['target']} | {r['finetuned_test']:.3f} | {r['test']:.3f} | "
                     f"{r['retained']:.1f} | {r['winner']} | {r['measured_speedup'] or 0:.2f} |")
    lines += ["", "Single-method cuts that `compress` tried as candidates in the same run (dev accuracy drop in "
              "points, measured speedup; every cut refitted, none trained): the search's winner, every layer cut "
              "alike (uniform heads and FFN neurons), every-other-style uniform layer-drop.", "",
              "| task | seed | target | winner | uniform heads+FFN | uniform layer-drop |", "|---|---|---|---|---|---|"]
    for r in sorted(runs.values(), key=lambda r: (r["target"], r["task"], r["seed"])):
        by_origin = {c["origin"]: c for c in r["candidates"]}
        win = next((c for c in r["candidates"] if c["name"] == r["winner"]), None)

        def cell(c: dict[str, Any] | None) -> str:
            return "-" if c is None else f"{c['drop']:+.2f} at {c['measured_speedup'] or 0:.2f}x"
        lines.append(f"| {r['task']} | {r['seed']} | {r['target']} | {cell(win)} | "
                     f"{cell(by_origin.get('uniform-path'))} | {cell(by_origin.get('uniform-layer-drop'))} |")
    machine = results.get("machine", {})
    lines += ["", f"Machine: {machine.get('cpu_model', '?')}; flags {', '.join(machine.get('flags', []) or [])}; "
              f"1-minute load average after each run in the JSON."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / "logs" / "suite_work")
    parser.add_argument("--tasks", nargs="+", default=["rt-sentiment", "rt-fresh-rotten-plot", "text-source"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--max-train", type=int, default=2000)
    parser.add_argument("--max-dev", type=int, default=400)
    parser.add_argument("--max-test", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args()
    results = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
    if not args.render_only:
        results["machine"] = machine_info().model_dump(mode="json")
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(args.model))
        for target in args.targets:
            for seed in args.seeds:
                for task in args.tasks:
                    key = f"{task}|{seed}|{target}"
                    if key in results["runs"]:
                        continue
                    row = run_one(args, task, seed, target, tokenizer)
                    row["load_average"] = list(os.getloadavg())
                    results["runs"][key] = row
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    args.out.write_text(json.dumps(results, indent=1))
                    print(f"[{key}] retained {row['retained']:.1f}% at {row['measured_speedup']}x "
                          f"({row['seconds']:.0f}s) winner {row['winner']}", flush=True)
    args.out.with_suffix(".md").write_text(render(results))


if __name__ == "__main__":
    main()
