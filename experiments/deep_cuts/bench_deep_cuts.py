"""Deep cuts on OpenVINO int8: the deep-cut targets, measured on the suite's fine-tuned classifiers.

Every run is ``surgery.compress(model, data, CompressConfig(...))`` with the library's defaults (the pick on
a held-out half of dev, the precision pass, the recovery tiers where a budget is given, the default
``--workers``), on a MiniLM-L6 classifier fine-tuned on 2,000 examples of one of the suite's three tasks
(experiments/compress/README.md, first command, builds them under WORK). The winner's **test** accuracy is
read from the very artefact compress judged and timed (``result.artefact``); the peer, NNCF int8 of the
unchanged fine-tuned classifier (SmoothQuant, the same calibration batches), is timed in the same
interleaved rounds as compress's artefact and the fine-tuned model in PyTorch fp32, one thread.

    OMP_NUM_THREADS=1 nice python experiments/deep_cuts/bench_deep_cuts.py --work WORK \
        --targets max-drop-1 --seeds 0 1 2
    python experiments/render.py   # the table in docs/results.md (experiments/deep_cuts/study.toml)

Targets: ``max-drop-1`` (``--max-drop 1``, no budget): test accuracy >= 99% of the fine-tuned
model's in at least 8 of 9 runs, at a mean >= 1.8x the peer's speed; ``12x-20min``: >= 98.5% retained;
``16x-30min``: >= 97%; embeddings (all-MiniLM-L6-v2, 2,000 test texts that chose nothing) ``emb-6x-10min``:
mean cosine >= 0.99 and recall@10 >= 0.88; ``emb-8x-20min``: >= 0.985 and >= 0.85.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
import surgery
from experiments.compress.bench_compress import embedding_split, run_grid, suite_arguments
from experiments.compress_runtimes.bench_compress_runtimes import (
    lock_timing,
    log_progress,
    peer_comparison,
    served_artefact,
)
from experiments.tasks import load_suite_task
from surgery.compress.config import CompressConfig
from surgery.measure.machine import machine_info
from surgery.training import accuracy

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "deep_cuts" / "results" / "deep_cuts.json"


@dataclass(frozen=True)
class Target:
    """One deep-cut target: what compress is asked, and what it must reach on test."""

    runtime: str
    speedup: float | None
    max_drop: float | None
    budget: float | None
    objective: str
    retained: float | None = None  # classifiers: % of the fine-tuned test accuracy
    cosine: float | None = None  # embeddings: mean cosine and recall@10 against the original
    recall: float | None = None

    def flags(self) -> str:
        parts = [f"--runtime {self.runtime}"]
        if self.speedup:
            parts.append(f"--speedup {self.speedup:g}")
        if self.max_drop is not None:
            parts.append(f"--max-drop {self.max_drop:g}")
        if self.budget:
            parts.append(f"--budget {self.budget:g}")
        return " ".join(parts)

    def goal(self) -> str:
        if self.objective == "task":
            return f">= {self.retained:g}% retained" + (" (8 of 9 runs)" if self.max_drop is not None else "")
        return f"cos >= {self.cosine:g}" + (f", recall@10 >= {self.recall:g}" if self.recall is not None else "")


TARGETS: dict[str, Target] = {
    "max-drop-1": Target("openvino-int8", None, 1.0, None, "task", retained=99.0),
    "12x-20min": Target("openvino-int8", 12.0, None, 20.0, "task", retained=98.5),
    "16x-30min": Target("openvino-int8", 16.0, None, 30.0, "task", retained=97.0),
    "emb-6x-10min": Target("openvino-int8", 6.0, None, 10.0, "embedding", cosine=0.99, recall=0.88),
    "emb-8x-20min": Target("openvino-int8", 8.0, None, 20.0, "embedding", cosine=0.985, recall=0.85),
    # The lossless pick: on a CPU with bf16 products, auto should serve the unchanged model in bf16.
    "emb-auto-3.5x": Target("auto", 3.5, None, None, "embedding", cosine=0.9999),
}


def config_for(spec: Target, args: Any, seed: int) -> CompressConfig:
    return CompressConfig(speedup=spec.speedup, max_drop=spec.max_drop, runtime=spec.runtime,
                          budget_minutes=spec.budget, threads=args.threads, seed=seed,
                          workers=getattr(args, "workers", None))


def compact_candidates(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with every candidate but the winner keeping counts of what it removed (``removed``: layers, heads
    and neurons per layer), not the unit lists (``removal``, 96% of a run's bytes); the winner keeps its own.
    Rows already compact are returned as they are."""
    for c in row.get("candidates", []):
        if c["name"] == row.get("winner") or "removal" not in c:
            continue
        removal = c.pop("removal")
        c["removed"] = {"layers": removal.get("layers", []),
                        "heads": {k: len(v) for k, v in removal.get("heads", {}).items()},
                        "neurons": {k: len(v) for k, v in removal.get("neurons", {}).items()}}
    return row


def record(result: Any, seconds: float) -> dict[str, Any]:
    """What every run keeps: the winner, its speed, the pick's interval, the phases against their estimate."""
    from surgery.compress import training_tier

    report = result.report
    winner = report.winner_result()
    return {
        "config": report.config, "runtime": report.runtime, "seconds": round(seconds, 1),
        "winner": report.winner, "why": report.why, "warnings": report.warnings, "notes": report.notes,
        "measured_speedup": winner.measured_speedup if winner else None,
        "speedup_interval": winner.speedup_interval if winner else None,
        "predicted_speedup": winner.predicted_speedup if winner else None,
        "dev_drop": winner.drop if winner else None, "structure": winner.structure if winner else None,
        "int8_float": getattr(winner, "int8_float", None) if winner else None,
        "training": report.training, "phases": report.phases, "estimate": report.estimate,
        "peak_rss_bytes": report.peak_rss_bytes, "unchanged_speedup": report.unchanged_speedup,
        "candidates": [c.model_dump(mode="json") for c in report.candidates],
        "batch_size": report.batch_size, "seq_len": report.seq_len,
        "task_hidden_weight": training_tier.TASK_HIDDEN_WEIGHT,
        "alignment": getattr(report, "alignment", None),
        # how the search spent its builds: the bisection's probes and where each path's search ended
        "judging": {k: report.judging.get(k) for k in ("built", "search_log", "bisection", "split")},
        "workers": report.workers, "worker_threads": report.worker_threads,
    }


def run_task(args: Any, task_name: str, seed: int, spec: Target, tokenizer: Any) -> dict[str, Any]:
    """One compress run on a fine-tuned classifier; test accuracy on the artefact compress judged."""
    from surgery.training.refit import task_calibration_batches

    task = load_suite_task(task_name, tokenizer, seed=seed, max_train=args.max_train, max_dev=args.max_dev,
                           max_test=args.max_test)
    original = surgery.from_pretrained(args.work / task_name / str(seed) / "finetuned",
                                       model_class="AutoModelForSequenceClassification").eval()
    test = task.test_data()
    base_test = accuracy(original, test.loader("eval"))
    torch.manual_seed(seed)
    start = time.perf_counter()
    result = surgery.compress(original, task.data, config_for(spec, args, seed), progress=log_progress)
    seconds = time.perf_counter() - start
    test_acc = accuracy(served_artefact(result, args.threads), test.loader("eval"))
    row = compact_candidates({**record(result, seconds), "finetuned_test": base_test, "test": test_acc,
                              "retained": 100.0 * test_acc / base_test})
    calibration = result.calibration or task_calibration_batches(task.data, 16, batch_size=32)
    row["peer"] = peer_comparison(original, result, calibration, test, args.threads, result.report.seq_len,
                                  result.report.batch_size)
    row["peer"]["peer_retained"] = 100.0 * row["peer"]["peer_test"] / base_test
    return row


def run_embedding(args: Any, seed: int, spec: Target) -> dict[str, Any]:
    """One compress run on all-MiniLM-L6-v2 with unlabelled texts; fidelity of its artefact on test texts."""
    from surgery.compress.candidates import Judge

    split = embedding_split(args.model, seed)
    original = split["original"]
    torch.manual_seed(seed)
    start = time.perf_counter()
    result = surgery.compress(original, split["data"], config_for(spec, args, seed), progress=log_progress)
    seconds = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="bench-embed-") as tmp:
        judge = Judge(original=original, objective="embedding", runtime=result.report.runtime, calibration=[],
                      workdir=Path(tmp), texts=split["test_texts"], tokenizer=split["tokenizer"],
                      sentence=split["sentence"], max_length=64, threads=args.threads)
        figures = judge.judge(served_artefact(result, args.threads))

        def score(peer: Any) -> dict[str, Any]:  # the peer's artefact on the same test texts, by the same judge
            found = judge.judge(peer)
            return {"test_cosine": found["mean_cosine"], "test_recall_at_10": found["recall_at_10"]}

        # The peer: NNCF int8 of the unchanged all-MiniLM-L6-v2 on compress's calibration batches, timed in the same
        # rounds as compress's artefact at the batch compress timed (the user's batch as given, unpadded).
        peer = peer_comparison(original, result, result.calibration, None, args.threads, result.report.seq_len,
                               result.report.batch_size, score=score)
    return compact_candidates({**record(result, seconds), "test_texts": len(split["test_texts"]),
                               "test_cosine": figures["mean_cosine"], "test_recall_at_10": figures["recall_at_10"],
                               "peer": peer})


def reached(row: dict[str, Any], spec: Target) -> bool:
    speed_ok = spec.speedup is None or (row["measured_speedup"] or 0) >= spec.speedup * 0.975
    if spec.objective == "task":
        return row["retained"] >= spec.retained and speed_ok
    recall_ok = spec.recall is None or row["test_recall_at_10"] >= spec.recall
    return row["test_cosine"] >= spec.cosine and recall_ok and speed_ok


def main() -> None:
    parser = suite_arguments(__doc__.splitlines()[0], list(TARGETS), RESULTS)
    parser.add_argument("--task-hidden-weight", type=float, default=None,
                        help="the hidden-state MSE weight of a task model's distillation "
                             "(surgery.compress.training_tier.TASK_HIDDEN_WEIGHT; default: the library's)")
    parser.add_argument("--workers", type=int, default=None,
                        help="compress's worker processes (CompressConfig.workers; default: the library's)")
    args = parser.parse_args()
    if args.task_hidden_weight is not None:
        from surgery.compress import training_tier

        training_tier.TASK_HIDDEN_WEIGHT = args.task_hidden_weight
    results = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
    for rows in (results["runs"], results.get("superseded", {})):
        for row in (rows.values() if isinstance(rows, dict) else rows):
            compact_candidates(row)
    if not args.render_only:
        lock_timing()
        from surgery.persist.assets import resolve_model_path

        results["machine"] = machine_info().model_dump(mode="json")
        results["lscpu"] = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
        results["threads"] = args.threads
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(args.model))
        def run(task: str, seed: int, target: str) -> dict[str, Any]:
            spec = TARGETS[target]
            return run_embedding(args, seed, spec) if spec.objective == "embedding" else \
                run_task(args, task, seed, spec, tokenizer)

        def line(row: dict[str, Any]) -> str:
            return (f"{'reached' if reached(row, TARGETS[row['target']]) else 'MISSED'} at {row['measured_speedup']}x "
                    f"({row['seconds'] / 60:.1f} min)")

        run_grid(args, results, lambda target: TARGETS[target].objective == "embedding", run, line)
    # The table is rendered by the one renderer: python experiments/render.py (docs/results.md).


if __name__ == "__main__":
    main()
