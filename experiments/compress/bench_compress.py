"""The compress benchmark: `surgery.compress` on fine-tuned MiniLM-L6 classifiers, tasks x seeds x targets.

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
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

import surgery
from surgery.compress import SpeedupTarget
from surgery.measure.machine import machine_info
from surgery.measure.stats import mean_std
from surgery.persist.assets import resolve_model_path
from surgery.runtimes.shared.names import GRAPH_FORMAT
from surgery.training import accuracy

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
from experiments.tasks import load_suite_task

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "compress" / "results" / "compress.json"


@dataclass(frozen=True)
class BenchTarget:
    """One target of the benchmark: the speedup, the runtime, the budget, whether it trains, the objective."""

    speedup: float
    runtime: str
    budget: float | None  # minutes for the whole job; None: no limit and no training
    train: bool
    objective: str  # task: fine-tuned classifiers; embedding: all-MiniLM-L6-v2 on unlabelled texts
    goal: str  # what the target asks for, as the table states it


TARGETS: dict[str, BenchTarget] = {
    "torch-1.6x-notrain": BenchTarget(1.6, "torch", 5.0, False, "task", ">= 99% at >= 1.6x in <= 5 min"),
    "torch-2x": BenchTarget(2.0, "torch", None, False, "task", ">= 99.5% at >= 1.95x"),
    "torch-2x-distil": BenchTarget(2.0, "torch", 20.0, True, "task", ">= 99.5% at >= 1.95x"),
    "int8-4x": BenchTarget(4.0, "onnxruntime-int8", None, False, "task", ">= 98.5% at >= 4x"),
    "int8-6x": BenchTarget(6.0, "onnxruntime-int8", None, False, "task", ">= 97% at >= 6x"),
    "emb-2x": BenchTarget(2.0, "torch", 15.0, True, "embedding", "cos >= 0.97, recall@10 >= 0.85 at 2x"),
    "emb-4x-int8": BenchTarget(4.0, "onnxruntime-int8", 15.0, True, "embedding",
                               "cos >= 0.95, recall@10 >= 0.80 at 4x"),
}
#: Retained test accuracy (%) each task target asks for.
ISSUE_TARGETS = {"torch-1.6x-notrain": 99.0, "torch-2x": 99.5, "torch-2x-distil": 99.5, "int8-4x": 98.5,
                 "int8-6x": 97.0}
#: Embedding split sizes: texts compress trains and calibrates on, judges candidates on, and the test texts.
EMBED_TRAIN, EMBED_DEV, EMBED_TEST = 4000, 500, 2000


def runtime_accuracy(result: Any, runtime: str, test: Any, workdir: Path) -> float:
    """Test accuracy of the winner on the runtime it was chosen for."""
    if runtime == "torch":
        return accuracy(result.model, test.loader("eval"))
    from surgery.runtimes.onnx.onnx_export import export_onnx
    from surgery.runtimes.onnx.onnx_session import OnnxRuntimeModel

    out = workdir / "onnx"
    int8 = runtime.endswith("int8")
    # As compress judged it: smoothed on the run's own calibration batches, then dynamic int8.
    report = export_onnx(result.model, out, int8=int8, calibration=(result.calibration or None) if int8 else None,
                         save_tokenizer=False, batch=2, seq=8, threads=1)
    ort = OnnxRuntimeModel(out / "model.onnx", config=result.model.config, output=report.output, threads=1,
                           task=report.task)
    return accuracy(ort, test.loader("eval"))


def run_one(args: argparse.Namespace, task_name: str, seed: int, target_name: str, tokenizer: Any) -> dict[str, Any]:
    """One compress run on a fine-tuned classifier; retained = winner test accuracy / fine-tuned test accuracy."""
    spec = TARGETS[target_name]
    task = load_suite_task(task_name, tokenizer, seed=seed, max_train=args.max_train, max_dev=args.max_dev,
                     max_test=args.max_test)
    model_dir = args.work / task_name / str(seed) / "finetuned"
    original = surgery.from_pretrained(model_dir, model_class="AutoModelForSequenceClassification").eval()
    test = task.test_data()
    base_test = accuracy(original, test.loader("eval"))
    torch.manual_seed(seed)
    start = time.perf_counter()
    result = surgery.compress(original, task.data, target=SpeedupTarget(speedup=spec.speedup), runtime=spec.runtime,
                              budget_minutes=spec.budget, train=spec.train, threads=args.threads, seed=seed)
    seconds = time.perf_counter() - start
    tmp = args.work / "compress_tmp" / f"{task_name}-{seed}-{target_name}"
    tmp.mkdir(parents=True, exist_ok=True)
    test_acc = runtime_accuracy(result, spec.runtime, test, tmp)
    return {**_common(result, task_name, seed, target_name, seconds), "finetuned_test": base_test,
            "test": test_acc, "retained": 100.0 * test_acc / base_test}


def embedding_split(model: str, seed: int) -> dict[str, Any]:
    """The embedding study's seeded split of the corpus: train texts (data), dev texts (judging), test texts that
    chose nothing, the tokenizer, the pooling and the original (all-MiniLM-L6-v2 by default)."""
    import random

    from experiments.embedding_suite import corpus_texts
    from surgery.embedding import load_text_data, read_sentence_config

    path = resolve_model_path(model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    sentence = read_sentence_config(path)
    pool = corpus_texts()
    random.Random(seed).shuffle(pool)
    test_texts = pool[:EMBED_TEST]
    dev_texts = pool[EMBED_TEST:EMBED_TEST + EMBED_DEV]
    train_texts = pool[EMBED_TEST + EMBED_DEV:EMBED_TEST + EMBED_DEV + EMBED_TRAIN]
    data = load_text_data(train_texts, tokenizer, eval_data=dev_texts, max_length=64, seed=seed, batch_size=32)
    data.sentence_config = sentence
    return {"tokenizer": tokenizer, "sentence": sentence, "test_texts": test_texts, "dev_texts": dev_texts,
            "train_texts": train_texts, "data": data, "original": surgery.from_pretrained(path).eval()}


def run_embedding(args: argparse.Namespace, seed: int, target_name: str) -> dict[str, Any]:
    """One compress run on all-MiniLM-L6-v2 with unlabelled texts; fidelity on test texts that chose nothing."""
    import tempfile

    from surgery.compress.candidates import Judge

    spec = TARGETS[target_name]
    split = embedding_split(args.model, seed)
    tokenizer, sentence, data, original = split["tokenizer"], split["sentence"], split["data"], split["original"]
    test_texts, dev_texts, train_texts = split["test_texts"], split["dev_texts"], split["train_texts"]
    torch.manual_seed(seed)
    start = time.perf_counter()
    result = surgery.compress(original, data, target=SpeedupTarget(speedup=spec.speedup), runtime=spec.runtime,
                              budget_minutes=spec.budget, train=spec.train, threads=args.threads, seed=seed)
    seconds = time.perf_counter() - start
    # The test texts are judged as compress judged its dev texts: on the runtime, against the original in fp32.
    with tempfile.TemporaryDirectory(prefix="bench-compress-") as tmp:
        judge = Judge(original=original, objective="embedding", runtime=spec.runtime,
                      calibration=list(result.calibration), smoothing=list(result.calibration), workdir=Path(tmp),
                      texts=test_texts, tokenizer=tokenizer, sentence=sentence, max_length=64, threads=args.threads)
        figures = judge.judge(judge.on_runtime(result.model))
    return {**_common(result, "embedding", seed, target_name, seconds), "test_texts": len(test_texts),
            "dev_texts": len(dev_texts), "train_texts": len(train_texts), "test_cosine": figures["mean_cosine"],
            "test_recall_at_10": figures["recall_at_10"]}


def compare_uniform(args: argparse.Namespace, row: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """The suite's best single-method recipe at the same speed, recovered as the compress run recovered its winner.

    The recipe is heads and FFN neurons cut alike in every layer (the suite's ``head+ffn-kd``), here the
    uniform candidate compress itself timed at the target, refitted, then distilled from the fine-tuned
    model for as many epochs as compress gave its winner, with the same seed: only the cut differs.
    """
    import tempfile

    from surgery.compress.candidates import Judge
    from surgery.compress.removal_path import Removal
    from surgery.compress.training_tier import distil
    from surgery.training.refit import task_calibration_batches

    uniform = next(c for c in row["candidates"] if c["origin"] == "uniform-path")
    epochs = (row.get("training") or {}).get("epochs") or 0
    task = load_suite_task(row["task"], tokenizer, seed=row["seed"], max_train=args.max_train, max_dev=args.max_dev,
                     max_test=args.max_test)
    original = surgery.from_pretrained(args.work / row["task"] / str(row["seed"]) / "finetuned",
                                       model_class="AutoModelForSequenceClassification").eval()
    with tempfile.TemporaryDirectory(prefix="bench-compress-") as tmp:
        judge = Judge(original=original, objective="task", runtime="torch", workdir=Path(tmp),
                      calibration=task_calibration_batches(task.data, 8, batch_size=32))
        model, _, _ = judge.build(Removal.model_validate(uniform["removal"]))
    torch.manual_seed(row["seed"])
    if epochs:
        distil(model, original, task.data, epochs=epochs, batch_size=32, seed=row["seed"])
    test = accuracy(model.eval(), task.test_data().loader("eval"))
    return {"name": uniform["name"], "measured_speedup": uniform["measured_speedup"], "epochs": epochs,
            "test": test, "retained": 100.0 * test / row["finetuned_test"]}


def _commit() -> str | None:
    """The repository commit the run's code came from (the export graph and the search change between commits)."""
    import subprocess

    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or None


def _common(result: Any, task_name: str, seed: int, target_name: str, seconds: float) -> dict[str, Any]:
    """What every run records: the target, the winner, its speed, the candidates, the phases."""
    spec = TARGETS[target_name]
    report = result.report
    winner = report.winner_result()
    return {
        "task": task_name, "seed": seed, "target": target_name, "speedup_target": spec.speedup,
        "runtime": spec.runtime, "budget_minutes": spec.budget, "train": spec.train, "objective": spec.objective,
        "seconds": seconds, "winner": report.winner, "why": report.why, "warnings": report.warnings,
        "measured_speedup": winner.measured_speedup if winner else None,
        "speedup_interval": winner.speedup_interval if winner else None,
        "predicted_speedup": winner.predicted_speedup if winner else None,
        "dev_drop": winner.drop if winner else None, "structure": winner.structure if winner else None,
        "training": report.training, "candidates": [c.model_dump(mode="json") for c in report.candidates],
        "phases": report.phases, "notes": report.notes,
    }


def _graph(row: dict[str, Any]) -> str:
    """How an ONNX Runtime run's graphs were exported: rows before the graph format was recorded had format 1."""
    if row["runtime"] == "torch":
        return "-"
    return "fused attention" if row.get("graph_format", 1) >= 2 else "unfused attention"


#: A measured speedup at most this far below the target counts as reaching it (compress's own pick rule).
SPEED_SLACK = 0.975


def goal_verdict(goal: str, *, speedup: float, retained: float | None = None, minutes: float | None = None,
                 cosine: float | None = None, recall: float | None = None) -> str:
    """``met``, or ``missed:`` and every figure short of what ``goal`` (a BenchTarget's text) asks for.

    Example:
        >>> goal_verdict("cos >= 0.97, recall@10 >= 0.85 at 2x", speedup=2.07, cosine=0.7601, recall=0.317)
        'missed: cosine 0.7601 < 0.97, recall@10 0.317 < 0.85'
        >>> goal_verdict(">= 99% at >= 1.6x in <= 5 min", speedup=1.68, retained=99.9, minutes=4.5)
        'met'
    """
    short = []
    if (m := re.search(r">= ([\d.]+)% at", goal)) and retained is not None and retained < float(m.group(1)):
        short.append(f"retained {retained:.1f}% < {m.group(1)}%")
    if (m := re.search(r"cos >= ([\d.]+)", goal)) and cosine is not None and cosine < float(m.group(1)):
        short.append(f"cosine {cosine:.4f} < {m.group(1)}")
    if (m := re.search(r"recall@10 >= ([\d.]+)", goal)) and recall is not None and recall < float(m.group(1)):
        short.append(f"recall@10 {recall:.3f} < {m.group(1)}")
    if (m := re.search(r"at (?:>= )?([\d.]+)x", goal)) and speedup < SPEED_SLACK * float(m.group(1)):
        short.append(f"speedup {speedup:.2f}x < {SPEED_SLACK * float(m.group(1)):.2f}x")
    if (m := re.search(r"in <= ([\d.]+) min", goal)) and minutes is not None and minutes > float(m.group(1)):
        short.append(f"{minutes:.1f} min > {m.group(1)} min")
    return "missed: " + ", ".join(short) if short else "met"


def render(results: dict[str, Any]) -> str:
    runs = {k: r for k, r in results["runs"].items() if r.get("objective", "task") == "task"}
    lines = ["| target | goal | retained % (test, mean ± std) | measured speedup | predicted | job minutes | runs | "
             "goal met (means) |", "|---|---|---|---|---|---|---|---|"]
    for name in TARGETS:
        rows = [r for r in runs.values() if r["target"] == name]
        if not rows:
            continue
        ret = mean_std([r["retained"] for r in rows])
        sp = mean_std([r["measured_speedup"] or 0.0 for r in rows])
        pr = mean_std([r["predicted_speedup"] or 0.0 for r in rows])
        mins = mean_std([r["seconds"] / 60 for r in rows])
        spec = TARGETS[name]
        if spec.objective != "task":
            continue
        verdict = goal_verdict(spec.goal, speedup=sp[0], retained=ret[0], minutes=mins[0])
        lines.append(f"| {name} ({spec.runtime}, {spec.speedup:g}x) | {spec.goal} | "
                     f"{ret[0]:.1f} ± {ret[1]:.1f} | {sp[0]:.2f} ± {sp[1]:.2f}x | {pr[0]:.2f}x | "
                     f"{mins[0]:.1f} | {len(rows)} | {verdict} |")
    lines += ["", "| task | seed | target | fine-tuned test | winner test | retained % | winner | measured x | "
              "exported graph |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(runs.values(), key=lambda r: (r["target"], r["task"], r["seed"])):
        lines.append(f"| {r['task']} | {r['seed']} | {r['target']} | {r['finetuned_test']:.3f} | {r['test']:.3f} | "
                     f"{r['retained']:.1f} | {r['winner']} | {r['measured_speedup'] or 0:.2f} | {_graph(r)} |")
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
    compared = [r for r in runs.values() if "uniform_kd" in r]
    if compared:
        lines += ["", "Against the suite's best single-method recipe (heads and FFN neurons cut alike in every layer, "
                  "the uniform candidate compress timed at the target), refitted and distilled for the same epochs "
                  "with the same seed (test accuracy retained, %):", "",
                  "| task | seed | target | compress | measured x | uniform head+FFN, distilled | measured x | "
                  "difference (points) |", "|---|---|---|---|---|---|---|---|"]
        for r in sorted(compared, key=lambda r: (r["target"], r["task"], r["seed"])):
            u = r["uniform_kd"]
            lines.append(f"| {r['task']} | {r['seed']} | {r['target']} | {r['retained']:.1f} | "
                         f"{r['measured_speedup'] or 0:.2f} | {u['retained']:.1f} | {u['measured_speedup'] or 0:.2f} | "
                         f"{100 * (r['test'] - u['test']):+.1f} |")
        diff = mean_std([100 * (r["test"] - r["uniform_kd"]["test"]) for r in compared])
        lines.append(f"| mean | | | | | | | {diff[0]:+.1f} ± {diff[1]:.1f} |")
    embedding = [r for r in results["runs"].values() if r.get("objective") == "embedding"]
    if embedding:
        lines += ["", "Embeddings (all-MiniLM-L6-v2 against itself in PyTorch fp32; compress trained on "
                  f"{EMBED_TRAIN:,} texts, judged on {EMBED_DEV}, and the figures are on {EMBED_TEST:,} test texts "
                  "that chose nothing):", "",
                  "| target | goal | seed | mean cosine | recall@10 | measured speedup | winner | "
                  "training | job minutes | exported graph | goal met |", "|" + "---|" * 11]
        for r in sorted(embedding, key=lambda r: (r["target"], r["seed"])):
            epochs = (r.get("training") or {}).get("epochs", 0)
            verdict = goal_verdict(TARGETS[r["target"]].goal, speedup=r["measured_speedup"] or 0.0,
                                   cosine=r["test_cosine"], recall=r["test_recall_at_10"])
            lines.append(f"| {r['target']} | {TARGETS[r['target']].goal} | {r['seed']} | {r['test_cosine']:.4f} | "
                         f"{r['test_recall_at_10']:.3f} | {r['measured_speedup'] or 0:.2f}x | {r['winner']}"
                         f"{' (' + r['note'] + ')' if r.get('note') else ''} | "
                         f"{epochs} epoch(s) | {r['seconds'] / 60:.1f} | {_graph(r)} | {verdict} |")
    machine = results.get("machine", {})
    lines += ["", f"Machine: {machine.get('cpu_model', '?')}; flags {', '.join(machine.get('flags', []) or [])}; "
              f"1-minute load average after each run in the JSON."]
    return "\n".join(lines) + "\n"


def suite_arguments(description: str, targets: list[str], out: Path) -> argparse.ArgumentParser:
    """The arguments every compress study takes: where the fine-tuned models are, tasks, seeds, targets, sizes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--work", type=Path, default=ROOT / "logs" / "suite_work")
    parser.add_argument("--tasks", nargs="+", default=["rt-sentiment", "rt-fresh-rotten-plot", "text-source"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--targets", nargs="+", default=targets, choices=targets)
    parser.add_argument("--max-train", type=int, default=2000)
    parser.add_argument("--max-dev", type=int, default=400)
    parser.add_argument("--max-test", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--render-only", action="store_true")
    return parser


def run_grid(args: argparse.Namespace, results: dict[str, Any], is_embedding: Callable[[str], bool],
             run: Callable[[str, int, str], dict[str, Any]], line: Callable[[dict[str, Any]], str]) -> None:
    """Every ``(target, seed, task)`` of ``args`` not yet in ``results["runs"]``: ``run(task, seed, target)``,
    recorded with when it started, the load average and the commit, and written to ``args.out`` after each
    run (a long grid can stop anywhere and resume); ``line(row)`` is its one-line summary. Embedding
    targets run once per seed, as task ``embedding``."""
    for target in args.targets:
        for seed in args.seeds:
            for task in ["embedding"] if is_embedding(target) else args.tasks:
                key = f"{task}|{seed}|{target}"
                if key in results["runs"]:
                    continue
                started = time.strftime("%H:%M:%S")
                commit = _commit()  # the code the run imports: read before it, in case the tree moves meanwhile
                row = run(task, seed, target)
                row.update(task=task, seed=seed, target=target, started=started, load_average=list(os.getloadavg()),
                           commit=commit)
                results["runs"][key] = row
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(results, indent=1))
                print(f"[{key}] {line(row)}", flush=True)


def main() -> None:
    parser = suite_arguments(__doc__.splitlines()[0], list(TARGETS), RESULTS)
    parser.add_argument("--compare", action="store_true", help="only add the uniform head+FFN recipe, distilled "
                        "alike, to the distilled task runs that lack it (no benchmark run)")
    args = parser.parse_args()
    results = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
    if not args.render_only and not args.compare:  # --compare only adds the comparison
        results["machine"] = machine_info().model_dump(mode="json")
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(args.model))
        def run(task: str, seed: int, target: str) -> dict[str, Any]:
            row = (run_embedding(args, seed, target) if TARGETS[target].objective == "embedding"
                   else run_one(args, task, seed, target, tokenizer))
            return {**row, "graph_format": GRAPH_FORMAT}

        def line(row: dict[str, Any]) -> str:
            figure = (f"cos {row['test_cosine']:.4f} recall@10 {row['test_recall_at_10']:.3f}"
                      if row["task"] == "embedding" else f"retained {row['retained']:.1f}%")
            return f"{figure} at {row['measured_speedup']}x ({row['seconds']:.0f}s) winner {row['winner']}"

        run_grid(args, results, lambda target: TARGETS[target].objective == "embedding", run, line)
    # The comparison trains and times nothing, so it may run beside a benchmark run: its own file.
    compare_file = args.out.with_name(args.out.stem + "_uniform_kd.json")
    compared = json.loads(compare_file.read_text()) if compare_file.exists() else {}
    if args.compare:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(args.model))
        for key, row in results["runs"].items():
            if row.get("train") and row.get("objective", "task") == "task" and key not in compared:
                compared[key] = compare_uniform(args, row, tokenizer)
                compare_file.write_text(json.dumps(compared, indent=1))
                print(f"[{key}] uniform head+FFN distilled: retained {compared[key]['retained']:.1f}% at "
                      f"{compared[key]['measured_speedup']}x", flush=True)
    for key, row in results["runs"].items():
        if key in compared:
            row["uniform_kd"] = compared[key]
    args.out.with_suffix(".md").write_text(render(results))


if __name__ == "__main__":
    main()
