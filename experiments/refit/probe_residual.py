"""The refit's target: the projection's own output, or the residual sum it is added into.

On the suite's fine-tuned MiniLM-L6 classifiers (``bench_suite.py --steps train``, in ``--work``), the mask Fisher of
``compress`` ranks heads and neurons (its 512 calibration examples) and the search walks a path on a latency table
that follows the model's shape (:func:`surgery.compress.shape_table.shape_latency_table`: no timing, so the points
do not depend on this machine). At each ``--fractions`` of the full model's predicted time a cut is made as compress
makes it (:func:`surgery.compress.candidates.apply_removal`), then refitted on compress's refit batches (its first
256 training examples) twice: the plain target (``refit_projections``) and the residual one
(``refit_projections(residual=True)``). Each is scored in PyTorch fp32 on the dev split (400) and the test split
(1000): accuracy, agreement with the fine-tuned model's predictions, and the mean KL from its output distribution.
Nothing here chooses a setting: the same cuts are scored both ways on splits neither refit read.

    python experiments/refit/probe_residual.py --work /work/bench --seeds 0 1 \
        --out experiments/refit/results/residual_probe.json
    python experiments/refit/probe_residual.py --out experiments/refit/results/residual_probe.json --summary
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

import surgery

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
from experiments.tasks import load_suite_task

TASKS = ("rt-sentiment", "rt-fresh-rotten-plot", "text-source")


def scores(model: torch.nn.Module, reference: torch.Tensor, loader: Any) -> dict[str, float]:
    """Accuracy, agreement with the reference's predictions and mean KL(reference || model), fp32."""
    logits, labels = [], []
    with torch.no_grad():
        for batch in loader:
            labels.append(batch["labels"])
            logits.append(model(**{k: v for k, v in batch.items() if k != "labels"}).logits.float())
    out, gold = torch.cat(logits), torch.cat(labels)
    kl = torch.nn.functional.kl_div(out.log_softmax(-1), reference.log_softmax(-1), log_target=True,
                                    reduction="batchmean")
    return {"accuracy": float((out.argmax(-1) == gold).float().mean()),
            "agreement": float((out.argmax(-1) == reference.argmax(-1)).float().mean()), "kl": float(kl)}


def reference_logits(model: torch.nn.Module, loader: Any) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(**{k: v for k, v in b.items() if k != "labels"}).logits.float() for b in loader])


def machine() -> dict[str, Any]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    return {"model": fields.get("Model name", "").strip(), "flags": fields.get("Flags", "").strip(),
            "python": platform.python_version(), "torch": torch.__version__}


def run(args: argparse.Namespace, task_name: str, seed: int, tokenizer: Any) -> dict[str, Any]:
    from surgery.compress.candidates import apply_removal
    from surgery.compress.mask_fisher import unit_costs
    from surgery.compress.plan import CALIBRATION_BATCH, FISHER_EXAMPLES, refit_batches
    from surgery.compress.removal_path import search_path
    from surgery.compress.shape_table import shape_latency_table
    from surgery.compress.structure import Structure
    from surgery.training.refit import refit_projections, task_calibration_batches

    task = load_suite_task(task_name, tokenizer, seed=seed, max_train=2000, max_dev=400, max_test=1000)
    original = surgery.from_pretrained(args.work / task_name / str(seed) / "finetuned",
                                       model_class="AutoModelForSequenceClassification").eval()
    calibration = task_calibration_batches(task.data, math.ceil(FISHER_EXAMPLES / CALIBRATION_BATCH),
                                           batch_size=CALIBRATION_BATCH)
    costs = unit_costs(original, calibration, objective="task")
    table = shape_latency_table(original)
    path = search_path(costs, table, Structure.from_model(original), layers=False)
    loaders = {"dev": task.data.loader("eval", batch_size=64), "test": task.test_data().loader("eval", batch_size=64)}
    reference = {part: reference_logits(original, loader) for part, loader in loaders.items()}
    row: dict[str, Any] = {"original": {p: scores(original, reference[p], loaders[p]) for p in loaders}, "points": []}
    full = table.predict_ms(Structure.from_model(original))
    for fraction in args.fractions:
        k = next((k for k in range(len(path.steps) + 1)
                  if table.predict_ms(path.structure_at(k)) <= fraction * full), len(path.steps))
        cut = copy.deepcopy(original)
        apply_removal(cut, path.removal_at(k))
        point: dict[str, Any] = {"fraction": fraction, "step": k, "params": sum(p.numel() for p in cut.parameters()),
                                 "cut": {p: scores(cut, reference[p], loaders[p]) for p in loaders}}
        for name, residual in (("plain", False), ("residual", True)):
            model = copy.deepcopy(cut)
            start = time.perf_counter()
            fit = refit_projections(model, original, refit_batches(calibration), residual=residual)
            point[name] = {"seconds": round(time.perf_counter() - start, 2), "solved": len(fit.projections),
                           **{p: scores(model, reference[p], loaders[p]) for p in loaders}}
        print(task_name, seed, fraction, k, {n: point[n]["test"] for n in ("cut", "plain", "residual")}, flush=True)
        row["points"].append(point)
    return row


def summary(out: dict[str, Any]) -> str:
    """The README's table (test split) and, per depth, the residual target's mean difference from the plain one."""
    import statistics

    lines = ["| task (fine-tuned test %) | seed | share of predicted time | step | test accuracy: cut / plain / "
             "residual | agreement: cut / plain / residual | KL: plain / residual |", "|---|---|---|---|---|---|---|"]
    runs = sorted(out["runs"].items(), key=lambda kv: (kv[0].split("|")[1], kv[0]))
    for key, row in runs:
        task, seed = key.split("|")
        for p in row["points"]:
            c, pl, rs = p["cut"]["test"], p["plain"]["test"], p["residual"]["test"]
            lines.append(f"| {task} ({100 * row['original']['test']['accuracy']:.1f}) | {seed} | {p['fraction']} | "
                         f"{p['step']} | {100 * c['accuracy']:.1f} / {100 * pl['accuracy']:.1f} / "
                         f"{100 * rs['accuracy']:.1f} | {c['agreement']:.3f} / {pl['agreement']:.3f} / "
                         f"{rs['agreement']:.3f} | {pl['kl']:.4f} / {rs['kl']:.4f} |")
    lines.append("")
    for fraction in sorted({p["fraction"] for _, row in runs for p in row["points"]}, reverse=True):
        pairs = [(p["plain"]["test"], p["residual"]["test"]) for _, row in runs for p in row["points"]
                 if p["fraction"] == fraction]
        accuracy = [100 * (r["accuracy"] - q["accuracy"]) for q, r in pairs]
        agreement = [r["agreement"] - q["agreement"] for q, r in pairs]
        kl = [100 * (r["kl"] - q["kl"]) / q["kl"] for q, r in pairs]

        def mean_std(values: list[float], fmt: str) -> str:
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            return f"{fmt.format(statistics.mean(values))} ± {fmt.replace('+', '').format(spread)}"

        lines.append(f"- {fraction:g} of the predicted time, {len(pairs)} cuts, residual less plain: accuracy "
                     f"{mean_std(accuracy, '{:+.2f}')} points, agreement {mean_std(agreement, '{:+.3f}')}, KL "
                     f"{mean_std(kl, '{:+.1f}')}% (lower in {sum(k < 0 for k in kl)} of {len(kl)})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.6, 0.45, 0.35, 0.25])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--summary", action="store_true", help="print the table and summary of --out; run nothing")
    args = parser.parse_args()
    if args.summary:
        print(summary(json.loads(args.out.read_text())))
        return
    torch.set_num_threads(args.threads)
    from surgery.persist.assets import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("minilm-l6"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"commands": [], "commit": commit, "machine": machine(), "threads": args.threads, "runs": {}}
    if args.out.exists():  # runs of earlier invocations stay, each command listed
        earlier = json.loads(args.out.read_text())
        out["runs"] = earlier.get("runs", {})
        out["commands"] = earlier.get("commands") or [earlier["command"]] * ("command" in earlier)
    out["commands"].append(" ".join(sys.argv))
    for seed in args.seeds:
        for task_name in args.tasks:
            out["runs"][f"{task_name}|{seed}"] = run(args, task_name, seed, tokenizer)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
