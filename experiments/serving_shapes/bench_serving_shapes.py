"""Does a cut chosen for one serving shape keep its speed at another? Batch 1 against batch 32, in one process.

For one classifier (all-MiniLM-L6-v2's encoder with a new two-class head, on Rotten Tomatoes sentiment) and
one embedding model (all-MiniLM-L6-v2 itself, on the corpora's unlabelled texts):

1. **Two compress runs per model**, the same target (``--speedup``, runtime ``torch``, refit only), one per
   serving shape, both with ``lengths="data"`` (batches of the training texts, each padded to its own
   longest) and ``--threads``:

   * ``online``: batch 1 (the latency table and every speedup are measured on one text per batch);
   * ``bulk``: batch 32.

   Each gives a winner, its predicted speedup (the latency table's) and its measured one.
2. **Side by side** (:func:`surgery.measure.bench.bench_models`, i.e. the one timing routine
   :func:`surgery.measure.timing.time_models`): the original, the online winner and the bulk winner in the
   same interleaved rounds, at each shape, on batches drawn from held-out texts that chose nothing
   (``--repeats`` rounds, one drawn batch per round, ``--threads`` threads). At batch 1 the figure is the
   p50 (and p95) latency speedup; at batch 32 the paired throughput speedup.
3. **The targets' figures**: the online winner's p50 speedup at batch 1 over its predicted speedup (the
   target: at least 0.9), and for both models the bulk winner's speedup at batch 1 and the online
   winner's at batch 32.

The CPU (:func:`surgery.measure.machine.machine_info`: model, speed flags, threads, versions), the load
average before and after every phase and the settings are recorded with the results (JSON to ``--out``).

    nice python experiments/serving_shapes/bench_serving_shapes.py --threads 2 --speedup 2 \\
        --out experiments/serving_shapes/results/serving_shapes.json

``--smoke`` proves the script on a tiny random encoder with MiniLM's vocabulary (real tokenizer, real
texts, few rounds, small data): its figures are not results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

import surgery
from surgery.measure.bench import bench_models
from surgery.measure.machine import machine_info
from surgery.measure.serving import data_batches
from surgery.persist.assets import resolve_model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
from experiments.embedding_suite import corpus_texts
from experiments.tasks import load_suite_task

MODEL = "minilm-l6"
#: The two serving shapes: (name, batch).
SHAPES: dict[str, int] = {"online": 1, "bulk": 32}
#: The target: the online winner keeps at least this fraction of its predicted speedup at batch 1 (p50).
KEEPS = 0.9


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def tiny_like(kind: str, vocab_size: int) -> torch.nn.Module:
    """--smoke: a tiny random BERT with MiniLM's vocabulary (its tokenizer's ids fit), a classifier or an encoder."""
    from surgery.testing import TinySpec, tiny_model

    spec = TinySpec("bert", task="seq-cls" if kind == "classifier" else "base", layers=2)
    extra = {"num_labels": 2} if kind == "classifier" else {}
    return tiny_model(spec, vocab_size=vocab_size, **extra)


def classifier_case(args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    """MiniLM-L6's encoder with a new two-class head (not fine-tuned: only speed is measured), Rotten Tomatoes."""
    from surgery.data.task_data import TaskData

    task = load_suite_task("rt-sentiment", tokenizer, seed=args.seed, max_train=args.max_train, max_dev=args.max_dev,
                           max_test=args.max_test)
    labels = task.data.label_names
    if args.smoke:
        original = tiny_like("classifier", tokenizer.vocab_size)
    else:
        original = surgery.from_pretrained(resolve_model_path(MODEL), model_class="AutoModelForSequenceClassification",
                                           allow_new_head=True, num_labels=len(labels))
    original.config.id2label = dict(enumerate(labels))
    original.config.label2id = {name: i for i, name in enumerate(labels)}
    held = TaskData(task.test, task.test, labels, tokenizer=tokenizer, batch_size=32)
    return {"name": "classifier", "original": original.eval(), "data": task.data, "held_out": held}


def embedding_case(args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    """all-MiniLM-L6-v2 on unlabelled texts (mean pooling, as its sentence-transformers config says)."""
    from surgery.embedding import load_text_data, read_sentence_config

    path = resolve_model_path(MODEL)
    pool = corpus_texts()
    random.Random(args.seed).shuffle(pool)
    test, dev = pool[:args.max_test], pool[args.max_test:args.max_test + args.max_dev]
    train = pool[args.max_test + args.max_dev:args.max_test + args.max_dev + args.max_train]
    data = load_text_data(train, tokenizer, eval_data=dev, max_length=64, seed=args.seed, batch_size=32)
    data.sentence_config = read_sentence_config(path)
    held = load_text_data(test, tokenizer, eval_data=test[:8], max_length=64, seed=args.seed, batch_size=32)
    original = tiny_like("embedding", tokenizer.vocab_size) if args.smoke else surgery.from_pretrained(path)
    return {"name": "embedding", "original": original.eval(), "data": data, "held_out": held}


def compress_at(case: dict[str, Any], batch: int, args: argparse.Namespace) -> dict[str, Any]:
    """One compress run at ``batch`` x the data's lengths: the winner, its predicted and measured speedups."""
    started, before = time.perf_counter(), load()
    torch.manual_seed(args.seed)
    result = surgery.compress(case["original"], case["data"], speedup=args.speedup, runtime="torch",
                              threads=args.threads, batch_size=batch, lengths="data", seed=args.seed, train=False)
    report = result.report
    won = report.winner_result()
    return {"model": result.model.eval(), "batch": batch, "winner": report.winner,
            "predicted_speedup": won.predicted_speedup if won else None,
            "measured_speedup": won.measured_speedup if won else None,
            "serving_shape": report.serving_shape.model_dump(mode="json") if report.serving_shape else None,
            "seconds": round(time.perf_counter() - started, 1), "load_average": [before, load()]}


def side_by_side(case: dict[str, Any], winners: dict[str, dict[str, Any]], batch: int,
                 args: argparse.Namespace) -> dict[str, Any]:
    """The original and both winners in the same interleaved rounds at ``batch``, on held-out drawn batches."""
    models = {"original": case["original"], **{f"{name} winner": w["model"] for name, w in winners.items()}}
    batches = data_batches(case["held_out"], batch_size=batch, count=args.warmup + args.repeats, seed=args.seed)
    before = load()
    report = bench_models(models, batch_size=batch, repeats=args.repeats, warmup=args.warmup, threads=args.threads,
                          batches=batches)
    rows = {}
    for c in report.comparisons:
        rows[c.name] = {"p50_speedup": c.p50_speedup, "p95_speedup": c.p95_speedup,
                        "paired_speedup": c.paired_speedup, "paired_ci95": c.paired_speedup_ci,
                        "throughput_speedup": c.speedup}
    return {"batch": batch, "comparisons": rows,
            "latency_ms": {m.name: {"p50": m.latency_p50_ms, "p95": m.latency_p95_ms} for m in report.models},
            "length_summary": report.settings.length_summary.model_dump(mode="json")
            if report.settings.length_summary else None,
            "warnings": report.warnings, "load_average": [before, load()]}


def run_case(case: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    say(f"{case['name']}: compress at {', '.join(f'{n} (batch {b})' for n, b in SHAPES.items())}")
    winners = {name: compress_at(case, batch, args) for name, batch in SHAPES.items()}
    for name, w in winners.items():
        say(f"{case['name']}: {name} winner {w['winner']} predicted {w['predicted_speedup']} measured "
            f"{w['measured_speedup']} in {w['seconds']} s")
    benches = {name: side_by_side(case, winners, batch, args) for name, batch in SHAPES.items()}
    online, bulk = benches["online"]["comparisons"], benches["bulk"]["comparisons"]
    predicted = winners["online"]["predicted_speedup"] or float("nan")
    kept = online["online winner"]["p50_speedup"] / predicted
    return {
        "model": case["name"],
        "winners": {n: {k: v for k, v in w.items() if k != "model"} for n, w in winners.items()},
        "side_by_side": benches,
        "online_winner_p50_speedup_at_batch_1": online["online winner"]["p50_speedup"],
        "online_winner_kept_of_predicted": kept, "target_kept": KEEPS, "target_met": kept >= KEEPS,
        "bulk_winner_p50_speedup_at_batch_1": online["bulk winner"]["p50_speedup"],
        "online_winner_speedup_at_batch_32": bulk["online winner"]["paired_speedup"],
        "bulk_winner_speedup_at_batch_32": bulk["bulk winner"]["paired_speedup"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--speedup", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=40, help="side-by-side timed rounds per shape")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max-train", type=int, default=2000)
    parser.add_argument("--max-dev", type=int, default=400)
    parser.add_argument("--max-test", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", nargs="+", default=["classifier", "embedding"],
                        choices=["classifier", "embedding"])
    parser.add_argument("--smoke", action="store_true", help="a tiny random encoder with MiniLM's vocabulary, to "
                        "prove the script; its figures are not results")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(MODEL))
    started = time.perf_counter()
    result: dict[str, Any] = {
        "question": "does a cut chosen at batch 1 keep its predicted speedup there, and how do cuts chosen at "
                    "batch 1 and batch 32 fare at the other shape?",
        "smoke": args.smoke, "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "shapes": SHAPES, "machine": machine_info().model_dump(mode="json"),
        "platform": platform.platform(), "torch": torch.__version__, "load_average_start": load(), "cases": [],
    }
    cases = {"classifier": classifier_case, "embedding": embedding_case}
    for name in args.models:
        result["cases"].append(run_case(cases[name](args, tokenizer), args))
        result["seconds"] = round(time.perf_counter() - started, 1)
        result["load_average_end"] = load()
        if args.out is not None:  # after every case: a long run keeps what it measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
    for case in result["cases"]:
        print(f"{case['model']}: online winner keeps {case['online_winner_kept_of_predicted']:.2f} of its predicted "
              f"speedup at batch 1 (p50 {case['online_winner_p50_speedup_at_batch_1']:.2f}x; target >= {KEEPS}); "
              f"bulk winner at batch 1 p50 {case['bulk_winner_p50_speedup_at_batch_1']:.2f}x; online winner at "
              f"batch 32 {case['online_winner_speedup_at_batch_32']:.2f}x, bulk winner "
              f"{case['bulk_winner_speedup_at_batch_32']:.2f}x")


if __name__ == "__main__":
    main()
