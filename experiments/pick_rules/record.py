"""Every candidate of a ``--max-drop 1`` run scored example by example on dev and on test, for replaying pick rules.

The deep-cut benchmark (experiments/deep_cuts) reads the test accuracy of the winner only, so a rule that would
have picked another candidate cannot be judged on the same runs. Here each run is the benchmark's own
(``surgery.compress`` with the library's defaults on a MiniLM-L6 classifier fine-tuned at 2,000 examples,
``--runtime openvino-int8 --max-drop 1``), and when compress has picked, every candidate it built is loaded
from the artefact compress judged (the runtime's own files, not a fresh export) and scored on every dev example
and every test example: 1 where it labels the example right. The original (PyTorch fp32) is scored alike. The
dev split compress made (search part, its screen, the held-out pick part) is recorded as indices, so
``replay.py`` recomputes each candidate's search and held-out figures exactly (and checks them against the ones
compress reported) and can apply any rule to them.

    OMP_NUM_THREADS=1 nice python experiments/pick_rules/record.py --work WORK --seeds 0 1 2 \
        --out experiments/pick_rules/results/record_zen4.json
    python experiments/pick_rules/replay.py experiments/pick_rules/results/record_zen4.json

WORK holds the fine-tuned classifiers (experiments/compress/README.md, first command).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
import surgery
from experiments.compress.bench_compress import run_grid, suite_arguments
from experiments.compress_runtimes.bench_compress_runtimes import lock_timing, log_progress, served_artefact
from experiments.deep_cuts.bench_deep_cuts import TARGETS, compact_candidates, config_for, record
from experiments.tasks import load_suite_task
from surgery.compress.candidate_run import CandidateRun
from surgery.measure.machine import machine_info
from surgery.training.task_accuracy import example_correct

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "pick_rules" / "results" / "record.json"


def bits(correct: torch.Tensor) -> str:
    """Per-example correctness as a string of 0s and 1s (compact in JSON, one character an example)."""
    return "".join("1" if c else "0" for c in correct.tolist())


@contextmanager
def scoring_every_candidate(sink: dict[str, Any], loaders: dict[str, Any], runtime_name: str,
                            threads: int) -> Iterator[None]:
    """While active, a compress run's pick is followed by every built candidate's per-example scores on
    ``loaders`` (split name -> loader, in the examples' order), written into ``sink`` with the dev split."""
    from surgery.runtimes import get_runtime

    chosen = CandidateRun.choose

    def choose(run: CandidateRun) -> Any:
        answer = chosen(run)  # the pick itself is untouched: what follows only reads the artefacts it judged
        runtime = get_runtime(runtime_name)
        config = run.judge.original.config
        split = run.split
        sink["split"] = {"search": list(split.search), "pick": list(split.pick), "screen": list(split.screen)}
        sink["scores"] = {}
        seen: dict[int, str] = {}
        for result in run.results:
            built = run.built.get(result.name)
            if built is None or result.tier == "distil":
                continue
            if built.index in seen:  # a twin: the same files as a candidate scored already
                sink["scores"][result.name] = {"twin_of": seen[built.index]}
                continue
            seen[built.index] = result.name
            directory = built.directory
            if directory is None and run.judge.unchanged is not None:
                directory = run.judge.unchanged.directory
            if directory is None:
                continue
            served = runtime.load(Path(directory), config=config, threads=threads)
            sink["scores"][result.name] = {name: bits(example_correct(served, loader))
                                           for name, loader in loaders.items()}
        return answer

    CandidateRun.choose = choose
    try:
        yield
    finally:
        CandidateRun.choose = chosen


def run_task(args: Any, task_name: str, seed: int, tokenizer: Any) -> dict[str, Any]:
    """One ``--max-drop 1`` compress run with every candidate scored on dev and test."""
    spec = TARGETS["max-drop-1"]
    task = load_suite_task(task_name, tokenizer, seed=seed, max_train=args.max_train, max_dev=args.max_dev,
                           max_test=args.max_test)
    original = surgery.from_pretrained(args.work / task_name / str(seed) / "finetuned",
                                       model_class="AutoModelForSequenceClassification").eval()
    loaders = {"dev": list(task.data.loader("eval")), "test": list(task.test_data().loader("eval"))}
    sink: dict[str, Any] = {"original": {name: bits(example_correct(original, loader))
                                         for name, loader in loaders.items()}}
    torch.manual_seed(seed)
    start = time.perf_counter()
    with scoring_every_candidate(sink, loaders, spec.runtime, args.threads):
        result = surgery.compress(original, task.data, config_for(spec, args, seed), progress=log_progress)
    seconds = time.perf_counter() - start
    winner_test = example_correct(served_artefact(result, args.threads), loaders["test"])
    row = compact_candidates(record(result, seconds))
    row.update(sink, winner_test=bits(winner_test))
    return row


def main() -> None:
    parser = suite_arguments(__doc__.splitlines()[0], ["max-drop-1"], RESULTS)
    parser.add_argument("--workers", type=int, default=None,
                        help="compress's worker processes (default: the library's)")
    args = parser.parse_args()
    results = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
    lock_timing()
    from surgery.persist.assets import resolve_model_path

    results["machine"] = machine_info().model_dump(mode="json")
    results["lscpu"] = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    results["threads"] = args.threads
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(args.model))

    def line(row: dict[str, Any]) -> str:
        return f"winner {row['winner']}, {len(row['scores'])} candidates scored ({row['seconds'] / 60:.1f} min)"

    run_grid(args, results, lambda target: False, lambda task, seed, target: run_task(args, task, seed, tokenizer),
             line)


if __name__ == "__main__":
    main()
