"""Reproduce the SHRP results on the embedded defaults: MiniLM-L6 + Rotten Tomatoes.

Stages (each saves its models, so a later call resumes; results accumulate in ``--work``):

* ``baseline``: plainly fine-tune MiniLM-L6 (the reference of every comparison);
* ``shrp K``: SHRP from the fine-tuned baseline with the top ``K`` of 6 layers converted (top-down),
  ``extra_epochs`` after the last conversion, Top-1 pruning; accuracy before and after pruning;
* ``prune K``: ``ffn-prune``, ``head-prune`` and both together at SHRP-K's parameter count
  (without embeddings), each followed by the same recovery fine-tuning budget;
* ``bench``: parameters, FLOPs and CPU throughput (batch 32) of every saved model side by side
  with the baseline in this one process; writes ``experiments/shrp/results/shrp.json``.

Example:
    nohup python experiments/shrp/bench_shrp.py --stages baseline shrp:3 shrp:5 prune:3 prune:5 bench > logs/shrp.log &
    # baselines trained as long as SHRP-3:
    python experiments/shrp/bench_shrp.py --stages prune:3 --recovery-epochs matched
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

import surgery
from surgery.data.task_data import TaskData, load_task_data
from surgery.measure.bench import bench_models
from surgery.persist.assets import resolve_model_path
from surgery.strategies import FFNPruningStrategy, HeadPruningStrategy, ShrpPipeline
from surgery.training import accuracy, fit, scratch_dir, training_arguments

ROOT = Path(__file__).resolve().parents[2]  # experiments/<study>/<script>.py


def finetune(model: torch.nn.Module, task: TaskData, epochs: int, lr: float, seed: int, batch: int) -> float:
    """Plain fine-tuning on surgery's Trainer (the baselines' and the recoveries' budget); returns seconds."""
    start = time.perf_counter()
    with scratch_dir() as tmp:
        fit(model, task, training_arguments(tmp, epochs=epochs, batch_size=batch, learning_rate=lr, weight_decay=0.01,
                                            seed=seed))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", nargs="+", required=True)
    parser.add_argument("--work", default=str(ROOT / "logs" / "shrp_bench"),
                        help="saved models and results.json of every stage (default: the repository's logs/shrp_bench)")
    parser.add_argument("--max-train", type=int, default=2400, help="seeded training subset (CPU budget)")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3, help="baseline fine-tuning epochs")
    parser.add_argument(
        "--recovery-epochs",
        default="1",
        help="baseline recovery fine-tuning epochs, or 'matched': as many as SHRP-K trained "
        "(K + extra); matched runs are named '<variant>@shrp-K+matched'",
    )
    parser.add_argument("--extra-epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--order", default="top-down", choices=["top-down", "bottom-up"])
    parser.add_argument(
        "--router-input",
        default="cls",
        choices=["cls", "mean"],
        help="SHRP router input ('mean' names the run '...-router-mean')",
    )
    parser.add_argument(
        "--expander-init",
        default="random",
        choices=["random", "output"],
        help="SHRP expander initialisation; the main runs use random (ALGORITHMS.md's recommendation), "
        "'output' names the run '...-expander-output' (the library default since this ablation)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "experiments" / "shrp" / "results" / "shrp.json"))
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["ffn-prune", "head-prune", "head+ffn-prune"],
        help="baselines run by the prune stages (CPU budget)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    results_file = work / "results.json"
    results: dict[str, Any] = json.loads(results_file.read_text()) if results_file.exists() else {}

    touched: set[str] = set()

    def save_results() -> None:
        # Re-read before writing so that two processes running different stages on one work dir
        # (e.g. ``shrp:1 shrp:2`` beside ``prune:3``) do not drop each other's entries.
        merged = json.loads(results_file.read_text()) if results_file.exists() else {}
        merged.update({k: results[k] for k in touched | {"setup"} if k in results})
        results.update(merged)
        tmp = results_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(merged, indent=2) + "\n")
        tmp.replace(results_file)

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("minilm-l6"))
    task = load_task_data(
        "rotten-tomatoes", tokenizer, max_length=args.max_length, seed=args.seed, max_train=args.max_train
    )
    eval_loader = task.loader("eval", batch_size=64)
    results["setup"] = {
        "model": "minilm-l6",
        "data": "rotten-tomatoes",
        **task.info,
        "split_seed": task.split_seed,
        "stratified": True,
        "lr": args.lr,
        "baseline_epochs": args.epochs,
        "extra_epochs": args.extra_epochs,
        "threads": args.threads,
        "torch": torch.__version__,
    }

    def load(name: str) -> torch.nn.Module:
        return surgery.from_pretrained(work / name)

    for stage in args.stages:
        kind, _, arg = stage.partition(":")
        print(f"== {stage}", flush=True)
        if kind == "baseline":
            model = surgery.from_pretrained(
                "minilm-l6", model_class="AutoModelForSequenceClassification", num_labels=task.num_labels,
                allow_new_head=True,
            )
            seconds = finetune(model, task, args.epochs, args.lr, args.seed, 32)
            touched.add("baseline")
            results["baseline"] = {
                "accuracy": accuracy(model, eval_loader),
                "train_seconds": seconds,
                "params": surgery.count_params(model).model_dump(),
            }
            surgery.save_pretrained(model, work / "baseline", overwrite=True)
        elif kind == "shrp":
            k = int(arg)
            model = load("baseline")
            strategy = ShrpPipeline(
                num_layers=k,
                order=args.order,
                expander_init=args.expander_init,
                router_input=args.router_input,
                extra_epochs=args.extra_epochs,
                learning_rate=args.lr,
                seed=args.seed,
                bench=False,
            )

            def show(event: Any) -> None:
                if event.total and event.completed == event.total and event.task.startswith("epoch"):
                    info = {k2: v for k2, v in event.info.items() if k2 != "usage"}
                    print(event.task, info, flush=True)

            report = surgery.convert(model, strategy, data=task, progress=show)
            m = report.metrics
            name = (
                f"shrp-{k}-{args.order}"
                + ("" if args.expander_init == "random" else "-expander-output")
                + ("" if args.router_input == "cls" else "-router-mean")
            )
            touched.add(name)
            results[name] = {
                "layers": m["layers"],
                "order": args.order,
                "expander_init": args.expander_init,
                "router_input": args.router_input,
                "accuracy_moe": m["accuracy_moe"],
                "accuracy_pruned": m["accuracy_pruned"],
                "usage": m["usage"],
                "history": m["history"],
                "train_seconds": m["train_seconds"],
                "params": report.params_after.model_dump(),
            }
            surgery.save_pretrained(model, work / name, overwrite=True)
        elif kind == "prune":
            k = int(arg)
            target = results[f"shrp-{k}-{args.order}"]["params"]["without_embeddings"]
            for label in args.variants:
                model = load("baseline")
                before = surgery.count_params(model).without_embeddings
                ratio = _matching_ratio(model, label, before - target)
                # Heads first: their gradient importance is read on the unpruned FFN, as in the single variants.
                steps: list[surgery.Strategy] = []
                if "heads" in ratio:
                    steps.append(HeadPruningStrategy(ratio=ratio["heads"], importance="gradient"))
                if "ffn" in ratio:
                    steps.append(FFNPruningStrategy(ratio=ratio["ffn"], importance="gradient"))
                for s in steps:
                    surgery.convert(model, s, data=task)
                acc_pruned = accuracy(model, eval_loader)
                matched = args.recovery_epochs == "matched"
                epochs = (
                    len(results[f"shrp-{k}-{args.order}"]["layers"]) + args.extra_epochs
                    if matched
                    else int(args.recovery_epochs)
                )
                seconds = finetune(model, task, epochs, args.lr, args.seed, 32)
                name = f"{label}@shrp-{k}" + ("+matched" if matched else "")
                touched.add(name)
                results[name] = {
                    "ratios": ratio,
                    "accuracy_before_recovery": acc_pruned,
                    "accuracy": accuracy(model, eval_loader),
                    "recovery_seconds": seconds,
                    "recovery_epochs": epochs,
                    "params": surgery.count_params(model).model_dump(),
                    "target_without_embeddings": target,
                    # below 1 only where the variant cannot remove enough (head-prune keeps a head per layer)
                    "params_vs_target": surgery.count_params(model).without_embeddings / target,
                }
                surgery.save_pretrained(model, work / name, overwrite=True)
                print(name, results[name], flush=True)
        elif kind == "bench":
            if results_file.exists():  # entries written meanwhile by another process on this work dir
                results.update({k: v for k, v in json.loads(results_file.read_text()).items() if k not in touched})
            names = [
                "baseline",
                *sorted(
                    p.name
                    for p in work.iterdir()
                    if p.is_dir() and p.name != "baseline" and (p / "surgery.json").exists()
                ),
            ]
            models = {n: load(n) for n in names}
            bench = bench_models(
                models, batch_size=32, seq_len=args.max_length, repeats=10, warmup=2, threads=args.threads
            )
            touched.add("bench")
            results["bench"] = bench.model_dump(mode="json")
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results, indent=2) + "\n")
        else:
            raise SystemExit(f"unknown stage {stage!r}")
        save_results()
    print(json.dumps({k: v for k, v in results.items() if k != "bench"}, indent=1)[:4000], flush=True)


def _matching_ratio(model: torch.nn.Module, label: str, remove: int) -> dict[str, float]:
    """Removal ratios that take ``remove`` parameters (without embeddings) out of ``model``, as far as possible."""
    adapter = surgery.adapter_for(model)
    parts = [adapter.layer(i) for i in range(adapter.num_layers)]
    heads = sum(p.attention.num_heads for p in parts)
    # One head: its Q/K/V rows and biases and its columns of O (every head of MiniLM has the same size).
    per_head = 4 * adapter.head_dim() * adapter.hidden_size + 3 * adapter.head_dim()
    neuron = 2 * adapter.hidden_size + 1
    neurons = sum(p.ffn.width for p in parts)
    max_heads = (heads - len(parts)) / heads  # one head stays in every layer
    max_ffn = (neurons - len(parts)) / neurons
    if label == "ffn-prune":
        return {"ffn": min(remove / (neuron * neurons), max_ffn)}
    if label == "head-prune":
        return {"heads": min(remove / (per_head * heads), max_heads)}
    # Both: the same fraction of heads and of neurons.
    r = min(remove / (per_head * heads + neuron * neurons), max_heads, max_ffn)
    return {"heads": r, "ffn": r}


if __name__ == "__main__":
    main()
