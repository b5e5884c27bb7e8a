"""`surgery compress --max-drop 1 --runtime openvino-int8` on MiniLM-L6 with --workers 1 and --workers 2.

The targets for the candidate phase: ``--workers 2`` at least 1.6x faster than ``--workers 1``
with the chosen model unchanged, and the whole job within 8 minutes. The held-out pick: the
winner's **test** accuracy (a split that chose nothing) against the fine-tuned model's, beside the
held-out interval compress reported.

The fine-tuned model comes from the suite (experiments/compress/README.md's first command, for one
task and seed). The runs go one after another in this process, the latency table cached by the first
(the second reads it: compare the ``candidates`` phase, and the whole job of the second). The machine
is shared: the 1-minute load average is recorded before and after each run, with the CPU.

Run from the repository root::

    nice python experiments/suite/bench_suite.py --steps train --methods finetuned --tasks rt-sentiment \\
        --max-train 2000 --max-dev 400 --max-test 1000 --seeds 0 --baseline-epochs 2 --threads 1 \\
        --work WORK --out WORK/finetuned.json
    nice python experiments/compress_cost/pick_workers.py --work WORK --workers 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
import surgery
from experiments.compress.bench_compress import _commit, embedding_split
from experiments.compress_runtimes.bench_compress_runtimes import log_progress, served_artefact
from experiments.tasks import load_suite_task
from surgery.compress.config import CompressConfig
from surgery.measure.machine import machine_info
from surgery.persist.assets import resolve_model_path
from surgery.training import accuracy

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "compress_cost" / "pick_workers.json"


def one_run(args: argparse.Namespace, workers: int, data: Any, original: Any,
            test: Callable[[Any], dict[str, float]]) -> dict[str, Any]:
    """One compress run with ``workers``: its phases, winner, judging counts and the winner's test figures."""
    torch.manual_seed(args.seed)
    config = CompressConfig(max_drop=args.max_drop, runtime=args.runtime, threads=args.threads, workers=workers,
                            seed=args.seed, train=False)
    load_before = list(os.getloadavg())
    start = time.perf_counter()
    result = surgery.compress(original, data, config, progress=log_progress)
    seconds = time.perf_counter() - start
    load_after = list(os.getloadavg())
    report = result.report
    winner = report.winner_result()
    return {"workers": workers, "worker_threads": report.worker_threads, "seconds": round(seconds, 1),
            "phases": report.phases, "winner": report.winner,
            "winner_measured_speedup": winner.measured_speedup if winner else None,
            "winner_search": winner.search.model_dump() if winner and winner.search else None,
            "winner_held_out": winner.held_out.model_dump() if winner and winner.held_out else None,
            "test": test(result), "candidates": len(report.candidates),
            # where each build's seconds went, and whether a worker built it or this process alone
            "builds": [{"name": c.name, "worker": c.worker, "seconds": c.seconds, "steps": c.steps}
                       for c in report.candidates if c.seconds],
            "judging": {k: v for k, v in report.judging.items() if k != "search_log"},
            "probes": report.judging.get("search_log"), "timing": report.timing,
            "load_average_before": load_before, "load_average_after": load_after, "warnings": report.warnings}


def task_inputs(args: argparse.Namespace) -> tuple[Any, Any, Callable[[Any], dict[str, float]]]:
    """The suite classifier and its task; test: accuracy of the winner's artefact, retained against the original."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("minilm-l6"))
    task = load_suite_task(args.task, tokenizer, seed=args.seed, max_train=args.max_train, max_dev=args.max_dev,
                           max_test=args.max_test)
    original = surgery.from_pretrained(args.work / args.task / str(args.seed) / "finetuned",
                                       model_class="AutoModelForSequenceClassification").eval()
    base = accuracy(original, task.test_data().loader("eval"))

    def test(result: Any) -> dict[str, float]:
        acc = accuracy(served_artefact(result, args.threads or 1), task.test_data().loader("eval"))
        return {"finetuned_test": base, "test": acc, "retained_test": 100.0 * acc / base}

    return task.data, original, test


def embedding_inputs(args: argparse.Namespace) -> tuple[Any, Any, Callable[[Any], dict[str, float]]]:
    """all-MiniLM-L6-v2 on the embedding study's split; test: the winner's artefact on texts that chose nothing."""
    from surgery.compress.candidates import Judge

    split = embedding_split("minilm-l6", args.seed)
    texts = split["test_texts"][: args.max_test]

    def test(result: Any) -> dict[str, float]:
        with tempfile.TemporaryDirectory(prefix="pick-test-") as tmp:
            judge = Judge(original=split["original"], objective="embedding", runtime=result.report.runtime,
                          calibration=[], workdir=Path(tmp), texts=texts, tokenizer=split["tokenizer"],
                          sentence=split["sentence"], max_length=64, threads=args.threads)
            figures = judge.judge(served_artefact(result, args.threads or 1))
        return {"test_texts": len(texts), "mean_cosine": figures["mean_cosine"],
                "recall_at_10": figures["recall_at_10"], "drop": figures["drop"]}

    return split["data"], split["original"], test


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets read from ``runs``: the candidate phase with 1 worker over 2, whether the winner is the same
    cut with the same held-out and test figures, and each whole job in minutes.

    A winner's name ends in its predicted speed (``path-6@5.40x``), which moves with the unchanged model's speed
    measured in that run, so the cut is compared by the name before ``@`` and by its figures.

    Example:
        >>> run = {"phases": {"candidates": 100.0}, "winner": "path-6@5.40x", "winner_held_out": {"drop": 0.75},
        ...        "test": {"drop": 0.79}, "seconds": 300.0}
        >>> s = summarize([{**run, "workers": 1}, {**run, "workers": 2, "winner": "path-6@5.46x",
        ...                 "phases": {"candidates": 50.0}}])
        >>> s["candidate_phase_speedup"], s["same_winner"]
        (2.0, True)
    """
    by = {r["workers"]: r for r in runs}
    if not (1 in by and 2 in by):
        return {}
    one, two = by[1], by[2]
    same = (one["winner"].split("@")[0] == two["winner"].split("@")[0]
            and one["winner_held_out"] == two["winner_held_out"] and one["test"] == two["test"])
    return {"candidate_phase_speedup": round(one["phases"]["candidates"] / two["phases"]["candidates"], 3),
            "candidate_phase_target": ">= 1.6x", "same_winner": same,
            "whole_job_minutes": {w: round(r["seconds"] / 60, 2) for w, r in by.items()},
            "whole_job_target": "<= 8 minutes"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objective", choices=["task", "embedding"], default="embedding")
    parser.add_argument("--work", type=Path, help="the suite's WORK (TASK/SEED/finetuned), for --objective task")
    parser.add_argument("--task", default="rt-sentiment")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--max-drop", type=float, default=1.0)
    parser.add_argument("--runtime", default="openvino-int8")
    parser.add_argument("--threads", type=int, default=None, help="timing threads (default: every core)")
    parser.add_argument("--max-train", type=int, default=2000)
    parser.add_argument("--max-dev", type=int, default=400)
    parser.add_argument("--max-test", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--summarize", action="store_true",
                        help="recompute the summary of the runs already in --out, running nothing")
    args = parser.parse_args()
    if args.summarize:
        out = json.loads(args.out.read_text())
        out["summary"] = summarize(out["runs"])
        args.out.write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps(out["summary"], indent=2))
        return
    data, original, test = task_inputs(args) if args.objective == "task" else embedding_inputs(args)
    runs = [one_run(args, w, data, original, test) for w in args.workers]
    summary = summarize(runs)
    what = f"task {args.task}" if args.objective == "task" else "all-MiniLM-L6-v2 embeddings"
    out = {"command": f"compress --max-drop {args.max_drop:g} --runtime {args.runtime} --no-train ({what}, seed "
                      f"{args.seed})",
           "commit": _commit(), "machine": machine_info().model_dump(mode="json"), "cores": os.cpu_count(),
           "summary": summary, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
