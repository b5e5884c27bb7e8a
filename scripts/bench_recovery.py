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

Writes docs/results/recovery.json and the table in docs/recovery.md (``--render`` redoes only the table).

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

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "results" / "recovery.json"
PAGE = ROOT / "docs" / "recovery.md"
RULES = ("every-other", "keep-ends", "top")


def log(*parts: Any) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


def finetune(task: TaskData, epochs: int, lr: float, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = surgery.from_pretrained("minilm-l6", model_class="AutoModelForSequenceClassification", allow_new_head=True,
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
    surgery.convert(pruned, HeadPruningStrategy(ratio=args.ratio, max_batches=args.max_batches), data=task)
    surgery.convert(pruned, FFNPruningStrategy(ratio=args.ratio, importance="attribution",
                                              max_batches=args.max_batches), data=task)
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
        if rule not in args.kd_rules:  # measured right after the drop only (the rule comparison)
            out[f"layer-drop:{rule}"] = {"drop": report.plan["drop"], "accuracy": accuracy(dropped, evaluate),
                                         "params": surgery.count_params(dropped).model_dump()}
            log(f"seed {seed} layer-drop {rule} (no recovery)", out[f"layer-drop:{rule}"]["accuracy"])
            continue
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


def render(results: dict[str, Any]) -> str:
    """The results table of docs/recovery.md (between its ``recovery`` markers), from the JSON."""
    setup, summary, bench = results["setup"], results["summary"], results.get("bench", {})
    seeds = sorted(results["seeds"], key=int)
    lines = [
        f"MiniLM-L6 on Rotten Tomatoes: {setup['max_train']} training examples, held-out split of "
        f"{results['setup'][f'data_seed{seeds[0]}']['eval_size']} (seeded, stratified; nothing is selected on it), "
        f"baseline fine-tuned {setup['epochs']} epochs at lr {setup['lr']:g}; recovery = {setup['kd_epochs']} epoch of "
        f"KD (T = {setup['temperature']:g}, alpha = {setup['alpha']:g}) from the fine-tuned model. "
        f"Seeds {', '.join(seeds)}; accuracy mean ± std over seeds. Speedup: paired throughput ratio against the "
        "baseline (seed 0's models, batch 32 x 64 tokens, interleaved rounds, one process, CPU shared with other "
        "jobs).",
        "",
        "| model | accuracy (%) | % of baseline | params w/o emb. | speedup | FLOP bound |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        std = "" if row["accuracy_std"] is None else f" ± {100 * row['accuracy_std']:.1f}"
        params = results["seeds"][seeds[0]][name]["params"]["without_embeddings"]
        b = bench.get(name)
        speed = "1.00" if name == "baseline" else ("-" if b is None else f"{b['paired_speedup']:.2f}")
        bound = "1.00" if name == "baseline" else ("-" if b is None else f"{b['flop_bound_speedup']:.2f}")
        lines.append(f"| {name} | {100 * row['accuracy_mean']:.1f}{std} | {100 * row['retained_mean']:.1f} | "
                     f"{params / 1e6:.2f}M | {speed} | {bound} |")
    dropped = [(n, [results["seeds"][s][n]["accuracy_dropped"] for s in seeds]) for n in summary
               if n.startswith("layer-drop") and n.endswith("+kd")]
    if dropped:
        shown = [f"{n.split(':')[1].split('+')[0]} {', '.join(f'{100 * a:.1f}' for a in accs)}" for n, accs in dropped]
        lines += ["", f"Layer-drop + KD, accuracy after the drop, before recovery (per seed): {'; '.join(shown)}."]
    return "\n".join(lines)


def write_page(results: dict[str, Any]) -> None:
    page = PAGE.read_text()
    begin, end = "<!-- recovery:begin -->", "<!-- recovery:end -->"
    head, rest = page.split(begin, 1)
    PAGE.write_text(head + begin + "\n" + render(results) + "\n" + end + rest.split(end, 1)[1])


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
    parser.add_argument("--rules", nargs="+", default=list(RULES), help="layer-drop rules measured")
    parser.add_argument("--kd-rules", nargs="+", default=list(RULES), help="rules also recovered with KD")
    parser.add_argument("--max-batches", type=int, default=8, help="batches scored by head/FFN importance")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--render", action="store_true", help="only rewrite docs/recovery.md's table from --out")
    args = parser.parse_args()
    if args.render:
        write_page(json.loads(args.out.read_text()))
        return

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
        if args.out == OUT:
            write_page(results)
        log("wrote", args.out)


if __name__ == "__main__":
    main()
