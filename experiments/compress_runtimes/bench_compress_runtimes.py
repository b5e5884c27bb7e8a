"""`surgery compress` on every runtime: the compress targets on OpenVINO int8 and `--runtime auto`.

For each (target, task, seed) not yet in ``results/compress_runtimes.json``:

* **classifiers** (the suite's fine-tuned MiniLM-L6 models, built and cached as experiments/compress
  does): ``surgery.compress`` with the target's runtime, speedup and budget; the winner's **test**
  accuracy is measured on the winner's own artefact (``result.artefact``: the files compress judged
  and timed, loaded by the runtime), retained = that / the fine-tuned model's test accuracy in PyTorch
  fp32. Then, side by side in this process (interleaved rounds, one thread): the fine-tuned model in
  PyTorch fp32, the peer recipe (the unchanged fine-tuned classifier through OpenVINO + NNCF int8,
  SmoothQuant, calibrated on the same training batches) and compress's artefact: the speed against
  the peer, and the peer's own test accuracy.
* **embeddings** (all-MiniLM-L6-v2; 4,000 corpus texts to calibrate/train, 500 to judge, 2,000 test
  texts that chose nothing): mean cosine and recall@10 of the winner's artefact against the original
  in PyTorch fp32 on the test texts.

Timing phases (every ``time_models`` call: latency probes, candidates, the comparisons) hold
``flock /work/timing.lock`` so they never overlap another timing run on this shared machine.

Run from the repository root (fine-tuned models as in experiments/compress/README.md, under WORK)::

    OMP_NUM_THREADS=1 nice python experiments/compress_runtimes/bench_compress_runtimes.py --work WORK \\
        --targets ov-int8-8x --seeds 0
    python experiments/compress_runtimes/bench_compress_runtimes.py --render-only
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
import surgery
from experiments.compress.bench_compress import embedding_split, run_grid, suite_arguments
from experiments.tasks import load_suite_task
from surgery.compress.config import CompressConfig
from surgery.measure.machine import machine_info
from surgery.measure.stats import mean_std
from surgery.training import accuracy

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "compress_runtimes" / "results" / "compress_runtimes.json"
LOCK = Path(os.environ.get("SURGERY_TIMING_LOCK", "/work/timing.lock"))


@dataclass(frozen=True)
class Target:
    """One of the compress targets on OpenVINO int8 and `--runtime auto`."""

    speedup: float
    runtime: str
    budget: float | None
    train: bool
    objective: str
    goal: str


TARGETS: dict[str, Target] = {
    "ov-int8-8x": Target(8.0, "openvino-int8", None, False, "task", ">= 99% retained (refit only)"),
    "ov-int8-12x": Target(12.0, "openvino-int8", 20.0, True, "task", ">= 98% retained (--budget 20)"),
    "emb-auto-2x": Target(2.0, "auto", None, False, "embedding", "cos >= 0.999, recall@10 >= 0.97"),
    "emb-ov-int8-6x": Target(6.0, "openvino-int8", None, False, "embedding", "cos >= 0.99, recall@10 >= 0.88"),
    "emb-ov-int8-8x": Target(8.0, "openvino-int8", 20.0, True, "embedding", "cos >= 0.98, recall@10 >= 0.85"),
}
#: Retained test accuracy (%) asked of each task target.
ISSUE_TARGETS = {"ov-int8-8x": 99.0, "ov-int8-12x": 98.0}
#: At >= 99% retained, compress's model at least this many times as fast as the peer's int8.
PEER_FACTOR = 1.6
EMBED_GOALS = {"emb-auto-2x": (0.999, 0.97), "emb-ov-int8-6x": (0.99, 0.88), "emb-ov-int8-8x": (0.98, 0.85)}


@contextlib.contextmanager
def timing_lock() -> Iterator[None]:
    """Hold ``flock LOCK`` for one timing phase (other helpers' timing runs take the same lock)."""
    with open(LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def lock_timing() -> None:
    """Make every interleaved timing of the library (``time_models``) hold the timing lock."""
    from surgery.compress import latency_measure
    from surgery.measure import bench, timing

    original = timing.time_models

    def locked(*args: Any, **kwargs: Any) -> Any:
        with timing_lock():
            return original(*args, **kwargs)

    timing.time_models = bench.time_models = locked
    latency_measure.time_models = locked


def log_progress(event: Any) -> None:
    """Compress's phases and candidates on stderr (the log on disk), not every probe and round."""
    if event.task.startswith("compress"):
        print(f"  {time.strftime('%H:%M:%S')} {event.task} {event.completed}/{event.total or '-'} {event.info}",
              file=sys.stderr, flush=True)


def served_artefact(result: Any, threads: int) -> torch.nn.Module:
    """The winner as compress judged it: its artefact loaded by its runtime (torch: the model itself)."""
    from surgery.runtimes import get_runtime

    if result.artefact is None:
        return result.model.eval()
    return get_runtime(result.report.runtime).load(result.artefact, config=result.model.config, threads=threads)


def peer_comparison(original: Any, result: Any, calibration: Any, test: Any, threads: int, seq_len: int,
                    batch_size: int, score: Callable[[Any], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The peer recipe (the unchanged model, OpenVINO + NNCF int8) against compress's artefact, side by side.

    The peer is scored by its test accuracy (``test``), or by ``score(peer)`` (an embedding model: its figures on
    the test texts, each kept as ``peer_<name>``)."""
    from surgery.measure.timing import make_inputs, time_models
    from surgery.runtimes import get_runtime

    with tempfile.TemporaryDirectory(prefix="bench-peer-") as tmp:
        peer = get_runtime("openvino-int8").prepare(original, Path(tmp) / "peer", calibration=calibration,
                                                    threads=threads)
        ours = served_artefact(result, threads)
        figures = ({"peer_test": accuracy(peer, test.loader("eval"))} if score is None
                   else {f"peer_{k}": v for k, v in score(peer).items()})
        inputs = make_inputs(int(original.config.vocab_size), batch_size=batch_size, seq_len=seq_len)
        timing = time_models({"fine-tuned [torch fp32]": original, "peer [openvino-int8, unchanged]": peer,
                              "compress [artefact]": ours}, [inputs], repeats=20, warmup=2, threads=threads)
    seconds = timing.seconds
    ratios = [p / c for p, c in zip(seconds["peer [openvino-int8, unchanged]"], seconds["compress [artefact]"],
                                    strict=True)]
    import statistics

    from surgery.measure.stats import bootstrap_median

    interval = bootstrap_median(ratios)
    return {**figures, "peer_speedup": timing.speedup("peer [openvino-int8, unchanged]")[0],
            "compress_speedup_side_by_side": timing.speedup("compress [artefact]")[0],
            "vs_peer": statistics.median(ratios), "vs_peer_interval": [interval.low, interval.high],
            "batch_size": batch_size, "seq_len": seq_len, "repeats": 20,
            "load_average": timing.load_average}


def run_task(args: argparse.Namespace, task_name: str, seed: int, target_name: str, tokenizer: Any) -> dict[str, Any]:
    """One compress run on a fine-tuned classifier; test accuracy on the saved (judged) artefact."""
    from surgery.training.refit import task_calibration_batches

    spec = TARGETS[target_name]
    task = load_suite_task(task_name, tokenizer, seed=seed, max_train=args.max_train, max_dev=args.max_dev,
                     max_test=args.max_test)
    original = surgery.from_pretrained(args.work / task_name / str(seed) / "finetuned",
                                       model_class="AutoModelForSequenceClassification").eval()
    test = task.test_data()
    base_test = accuracy(original, test.loader("eval"))
    torch.manual_seed(seed)
    config = CompressConfig(speedup=spec.speedup, runtime=spec.runtime, budget_minutes=spec.budget, train=spec.train,
                            threads=args.threads, seed=seed)
    start = time.perf_counter()
    result = surgery.compress(original, task.data, config, progress=log_progress)
    seconds = time.perf_counter() - start
    test_acc = accuracy(served_artefact(result, args.threads), test.loader("eval"))
    row = {**common(result, task_name, seed, target_name, seconds), "finetuned_test": base_test, "test": test_acc,
           "retained": 100.0 * test_acc / base_test}
    calibration = result.calibration or task_calibration_batches(task.data, 16, batch_size=32)
    row["peer"] = peer_comparison(original, result, calibration, test, args.threads, result.report.seq_len,
                                  result.report.batch_size)
    row["peer"]["peer_retained"] = 100.0 * row["peer"]["peer_test"] / base_test
    return row


def run_embedding(args: argparse.Namespace, seed: int, target_name: str) -> dict[str, Any]:
    """One compress run on all-MiniLM-L6-v2 with unlabelled texts; fidelity of the artefact on test texts."""
    from surgery.compress.candidates import Judge

    spec = TARGETS[target_name]
    split = embedding_split(args.model, seed)  # the same seeded split as experiments/compress
    tokenizer, sentence, data, original = split["tokenizer"], split["sentence"], split["data"], split["original"]
    test_texts = split["test_texts"]
    torch.manual_seed(seed)
    config = CompressConfig(speedup=spec.speedup, runtime=spec.runtime, budget_minutes=spec.budget, train=spec.train,
                            threads=args.threads, seed=seed)
    start = time.perf_counter()
    result = surgery.compress(original, data, config, progress=log_progress)
    seconds = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="bench-embed-") as tmp:
        judge = Judge(original=original, objective="embedding", runtime=result.report.runtime, calibration=[],
                      workdir=Path(tmp), texts=test_texts, tokenizer=tokenizer, sentence=sentence, max_length=64,
                      threads=args.threads)
        figures = judge.judge(served_artefact(result, args.threads))
    return {**common(result, "embedding", seed, target_name, seconds), "test_texts": len(test_texts),
            "dev_texts": len(split["dev_texts"]), "train_texts": len(split["train_texts"]),
            "test_cosine": figures["mean_cosine"],
            "test_recall_at_10": figures["recall_at_10"]}


def common(result: Any, task_name: str, seed: int, target_name: str, seconds: float) -> dict[str, Any]:
    """What every run records: the config, the winner (and its runtime), its speed, the runtimes timed."""
    report = result.report
    winner = report.winner_result()
    return {
        "task": task_name, "seed": seed, "target": target_name, "config": report.config,
        "runtime": report.runtime, "objective": TARGETS[target_name].objective, "seconds": seconds,
        "winner": report.winner, "why": report.why, "warnings": report.warnings,
        "measured_speedup": winner.measured_speedup if winner else None,
        "speedup_interval": winner.speedup_interval if winner else None,
        "predicted_speedup": winner.predicted_speedup if winner else None,
        "dev_drop": winner.drop if winner else None, "structure": winner.structure if winner else None,
        "unchanged_speedup": report.unchanged_speedup, "runtimes": report.runtimes, "training": report.training,
        "artefact": report.artefact, "candidates": [c.model_dump(mode="json") for c in report.candidates],
        "phases": report.phases, "notes": report.notes,
    }


def render(results: dict[str, Any]) -> str:
    """The results as markdown: each target reached against what it asks."""
    runs = list(results["runs"].values())
    lines = ["| target | asked | task | seed | winner runtime | retained % / cos, r@10 | measured speedup | "
             "vs peer int8 | reached |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (r["target"], r["task"], r["seed"])):
        spec = TARGETS[r["target"]]
        if spec.objective == "task":
            figure = f"{r['retained']:.1f}%"
            peer = r.get("peer") or {}
            vs = f"{peer.get('vs_peer', 0):.2f}x (peer {peer.get('peer_retained', 0):.1f}% at " \
                 f"{peer.get('peer_speedup', 0):.2f}x; >= {PEER_FACTOR:g}x: " \
                 f"{'yes' if peer.get('vs_peer', 0) >= PEER_FACTOR and r['retained'] >= 99.0 else '**no**'})" \
                if peer else "-"
            ok = r["retained"] >= ISSUE_TARGETS[r["target"]] and (r["measured_speedup"] or 0) >= spec.speedup * 0.975
        else:
            figure = f"cos {r['test_cosine']:.5f}, r@10 {r['test_recall_at_10']:.3f}"
            vs = "-"
            cos, rec = EMBED_GOALS[r["target"]]
            ok = r["test_cosine"] >= cos and r["test_recall_at_10"] >= rec and \
                (r["measured_speedup"] or 0) >= spec.speedup * 0.975
        lines.append(f"| {r['target']} (--runtime {spec.runtime} --speedup {spec.speedup:g}"
                     f"{f' --budget {spec.budget:g}' if spec.budget else ''}) | {spec.goal} | {r['task']} | "
                     f"{r['seed']} | {r['runtime']} | {figure} | {r['measured_speedup'] or 0:.2f}x | {vs} | "
                     f"{'yes' if ok else '**no**'} |")
    task_runs = [r for r in runs if TARGETS[r["target"]].objective == "task"]
    for name in ISSUE_TARGETS:
        rows = [r for r in task_runs if r["target"] == name]
        if rows:
            ret = mean_std([r["retained"] for r in rows])
            sp = mean_std([r["measured_speedup"] or 0 for r in rows])
            lines.append(f"\n{name}: retained {ret[0]:.1f} ± {ret[1]:.1f}% at {sp[0]:.2f} ± {sp[1]:.2f}x over "
                         f"{len(rows)} run(s)")
    auto = [r for r in runs if r.get("runtimes")]
    for r in auto:
        lines += ["", f"`--runtime auto` ({r['target']}, seed {r['seed']}): runtimes timed (unchanged model against "
                  "the original in PyTorch fp32, side by side):", "",
                  "| runtime | unchanged ratio | searched | why | winner measured | drop |",
                  "|---|---|---|---|---|---|"]
        for row in r["runtimes"]:
            if not row.get("available", True):
                lines.append(f"| {row['runtime']} | unavailable | no | {row['why']} | - | - |")
                continue
            lines.append(f"| {row['runtime']}{' (chosen)' if row.get('chosen') else ''} | "
                         f"{row['unchanged_ratio']:.2f}x | {'yes' if row['searched'] else 'no'} | {row['why']} | "
                         f"{row.get('measured_speedup') or '-'} | {row.get('drop', '-')} |")
    machine = results.get("machine", {})
    lines += ["", f"Machine: {machine.get('cpu_model', '?')}; flags {', '.join(machine.get('flags', []) or [])}; "
              f"{results.get('threads', 1)} thread(s); load average after each run in the JSON."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = suite_arguments(__doc__.splitlines()[0], list(TARGETS), RESULTS)
    args = parser.parse_args()
    results = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
    if not args.render_only:
        lock_timing()
        from surgery.persist.assets import resolve_model_path

        results["machine"] = machine_info().model_dump(mode="json")
        results["threads"] = args.threads
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(args.model))
        def run(task: str, seed: int, target: str) -> dict[str, Any]:
            if TARGETS[target].objective == "embedding":
                return run_embedding(args, seed, target)
            return run_task(args, task, seed, target, tokenizer)

        def line(row: dict[str, Any]) -> str:
            figure = (f"cos {row['test_cosine']:.4f} recall@10 {row['test_recall_at_10']:.3f}"
                      if row["task"] == "embedding" else
                      f"retained {row['retained']:.1f}% vs peer {row['peer']['vs_peer']:.2f}x")
            return (f"{figure} at {row['measured_speedup']}x on {row['runtime']} ({row['seconds']:.0f}s) "
                    f"winner {row['winner']}")

        run_grid(args, results, lambda target: TARGETS[target].objective == "embedding", run, line)
    # Runs started side by side write their own JSON files (--out); the rendering shows them all.
    merged = {"runs": {}, "machine": results.get("machine", {}), "threads": results.get("threads", args.threads)}
    for path in sorted(args.out.parent.glob("compress_runtimes*.json")):
        merged["runs"].update(json.loads(path.read_text())["runs"])
    if merged["runs"]:
        (args.out.parent / "compress_runtimes.md").write_text(render(merged))


if __name__ == "__main__":
    main()
