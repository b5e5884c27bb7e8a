"""Recovery by distillation on real data: MiniLM-L6 + Rotten Tomatoes (issue 8, items 2-4).

Per seed: fine-tune MiniLM-L6 (the teacher and the reference), then from copies of it

* ``head+ffn``: ``head-prune`` 0.5 then ``ffn-prune`` 0.5 (gradient / attribution importance on
  training batches), without recovery;
* ``head+ffn+kd``: the same model, then :func:`surgery.training.recover` for ``--kd-epochs`` with the
  fine-tuned model as teacher;
* ``layer-drop:RULE+kd``: ``layer-drop`` of 3 of 6 layers by each rule, accuracy right after the
  drop and after the same recovery.

Every accuracy is on the held-out split (nothing is selected on it: recovery runs a fixed budget).
Throughput of seed 0's models is measured side by side with the baseline in this one process
(interleaved rounds, ``surgery.bench.bench_models``) on a machine shared with other jobs.

Example:
    nice -n 5 python scripts/bench_recovery.py --seeds 0 1 > /tmp/recover_bench/log.txt 2>&1 &
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

import surgery
from surgery.assets import resolve_model_path
from surgery.bench import bench_models
from surgery.data import TaskData, load_task_data
from surgery.strategies import FFNPruningStrategy, HeadPruningStrategy, LayerDropStrategy
from surgery.training import RecoveryConfig, accuracy, fit, recover, scratch_dir, training_arguments

OUT = Path(__file__).resolve().parent.parent / "docs" / "results" / "recovery.json"
RULES = ("every-other", "keep-ends", "top")


def log(*parts: Any) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


def finetune(task: TaskData, epochs: int, lr: float, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = surgery.from_pretrained("minilm-l6", model_class="AutoModelForSequenceClassification",
                                    num_labels=task.num_labels)
    with scratch_dir() as tmp:
        fit(model, task, training_arguments(tmp, epochs=epochs, batch_size=32, learning_rate=lr, weight_decay=0.01,
                                            seed=seed))
    return model


def run_seed(task: TaskData, args: argparse.Namespace, seed: int, keep: dict[str, torch.nn.Module]) -> dict[str, Any]:
    evaluate = task.loader("eval", batch_size=64)
    kd = RecoveryConfig(epochs=args.kd_epochs, learning_rate=args.lr, temperature=args.temperature, alpha=args.alpha,
                        seed=seed)
    start = time.perf_counter()
    teacher = finetune(task, args.epochs, args.lr, seed)
    out: dict[str, Any] = {"baseline": {"accuracy": accuracy(teacher, evaluate),
                                        "train_seconds": time.perf_counter() - start,
                                        "params": surgery.count_params(teacher).model_dump()}}
    log(f"seed {seed} baseline", out["baseline"]["accuracy"])
    keep["baseline"] = teacher

    pruned = copy.deepcopy(teacher)
    surgery.convert(pruned, HeadPruningStrategy(ratio=args.ratio, max_batches=8), data=task)
    surgery.convert(pruned, FFNPruningStrategy(ratio=args.ratio, importance="attribution", max_batches=8), data=task)
    out["head+ffn"] = {"accuracy": accuracy(pruned, evaluate), "params": surgery.count_params(pruned).model_dump()}
    log(f"seed {seed} head+ffn", out["head+ffn"]["accuracy"])
    result = recover(pruned, teacher, task, kd)
    out["head+ffn+kd"] = {"accuracy": result.accuracy_after, "recovery": result.model_dump(mode="json"),
                          "params": surgery.count_params(pruned).model_dump()}
    log(f"seed {seed} head+ffn+kd", result.accuracy_after, f"{result.seconds:.0f}s")
    keep["head+ffn+kd"] = pruned

    for rule in args.rules:
        dropped = copy.deepcopy(teacher)
        report = surgery.convert(dropped, LayerDropStrategy(count=args.drop, rule=rule))
        result = recover(dropped, teacher, task, kd)
        out[f"layer-drop:{rule}+kd"] = {"drop": report.plan["drop"], "accuracy_dropped": result.accuracy_before,
                                        "accuracy": result.accuracy_after, "recovery": result.model_dump(mode="json"),
                                        "params": surgery.count_params(dropped).model_dump()}
        log(f"seed {seed} layer-drop {rule}", result.accuracy_before, "->", result.accuracy_after)
        keep[f"layer-drop:{rule}+kd"] = dropped
    return out


def summarise(seeds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    names = list(next(iter(seeds.values())))
    summary: dict[str, Any] = {}
    for name in names:
        accs = torch.tensor([seeds[s][name]["accuracy"] for s in seeds], dtype=torch.float64)
        base = torch.tensor([seeds[s]["baseline"]["accuracy"] for s in seeds], dtype=torch.float64)
        summary[name] = {"accuracy_mean": float(accs.mean()),
                         "accuracy_std": float(accs.std()) if len(accs) > 1 else None,
                         "retained_mean": float((accs / base).mean()), "n_seeds": len(accs)}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--max-train", type=int, default=2400, help="seeded training subset (CPU budget)")
    parser.add_argument("--max-eval", type=int, default=None, help="first N of the held-out split (CPU budget)")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3, help="baseline fine-tuning epochs")
    parser.add_argument("--kd-epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--ratio", type=float, default=0.5, help="head and FFN pruning ratio")
    parser.add_argument("--drop", type=int, default=3, help="layers dropped of 6")
    parser.add_argument("--rules", nargs="+", default=list(RULES))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("minilm-l6"))
    results: dict[str, Any] = {"setup": {k: v for k, v in vars(args).items() if k != "out"}, "seeds": {}}
    for seed in args.seeds:
        task = load_task_data("rotten-tomatoes", tokenizer, max_length=args.max_length, seed=seed,
                              max_train=args.max_train, max_eval=args.max_eval)
        results["setup"][f"data_seed{seed}"] = task.info
        keep: dict[str, torch.nn.Module] = {}
        results["seeds"][str(seed)] = run_seed(task, args, seed, keep)
        results["summary"] = summarise(results["seeds"])
        if seed == args.seeds[0]:
            report = bench_models(keep, batch_size=32, seq_len=64, repeats=10, warmup=2)
            results["bench"] = {c.name: {"paired_speedup": c.paired_speedup, "paired_speedup_iqr": c.paired_speedup_iqr,
                                         "flop_bound_speedup": c.flop_bound_speedup,
                                         "params_ratio_without_embeddings": c.params_ratio_without_embeddings}
                                for c in report.comparisons}
            results["bench_settings"] = report.settings.model_dump(mode="json")
            log("bench", json.dumps(results["bench"]))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        log("wrote", args.out)


if __name__ == "__main__":
    main()
