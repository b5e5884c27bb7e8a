"""The evaluation suite: methods x tasks x seeds on MiniLM-L6, with measured speed.

Steps (named; each resumes from what is on disk):

* ``train``: for every (task, seed, method) not yet in the results, run the method on the task's
  seeded train split (choices on dev), evaluate on dev and test, save the model under ``--work``;
  results merge into ``experiments/suite/results/suite.json`` after each run;
* ``bench``: load the saved models of one (task, seed) and measure them side by side against the
  fine-tuned baseline in this one process (interleaved rounds): the measured speedup of each method;
* ``render``: summary (mean ± std over seeds), ``experiments/suite/results/suite_pareto.png``,
  ``experiments/suite/results/suite_usage.png`` and the suite section of ``docs/results.md``.

Methods are pluggable: a function ``(ctx) -> (model, extra)`` registered with :func:`method`;
``needs`` names the methods whose results or saved models it starts from. Run from the repository
root, one heavy job at a time::

    nohup nice -n 5 python experiments/suite/bench_suite.py --steps train bench render > logs/suite.log 2>&1 &
    python experiments/suite/bench_suite.py --steps render          # tables and plots from the JSON only
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoTokenizer

import surgery
from surgery.cli.plot import write_pareto, write_usage
from surgery.measure.bench import bench_models
from surgery.measure.stats import mean_std
from surgery.persist.assets import resolve_model_path
from surgery.strategies import FFNPruningStrategy, HeadPruningStrategy, ShrpPipeline
from surgery.strategies.pruning.layer_drop import LayerDropStrategy
from surgery.strategies.shrp import finetune
from surgery.training import RecoveryConfig, accuracy, recover

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
from experiments.tasks import SuiteTask, load_suite_task

ROOT = Path(__file__).resolve().parents[2]  # experiments/<study>/<script>.py
RESULTS = ROOT / "experiments" / "suite" / "results" / "suite.json"
MODEL = "minilm-l6"  # --model overrides it (an embedded name or a model directory)
#: SHRP's defaults, unchanged (only the number of layers is set), applied to the same fine-tuned model
#: the baselines start from: the recipe a user with a task model runs.
SHRP_RECIPE: dict[str, Any] = dict(bench=False)


@dataclass
class Context:
    """What a method sees: the task, the seed, earlier methods' rows and saved models, the settings."""

    task: SuiteTask
    seed: int
    args: argparse.Namespace
    rows: dict[str, dict[str, Any]]
    work: Path

    def model_dir(self, method_name: str) -> Path:
        return self.work / self.task.name / str(self.seed) / method_name.replace("/", "of")

    def load(self, method_name: str) -> nn.Module:
        return surgery.from_pretrained(self.model_dir(method_name), model_class="AutoModelForSequenceClassification")

    def pretrained(self) -> nn.Module:
        torch.manual_seed(self.seed)  # the new classifier head
        return surgery.from_pretrained(self.args.model, model_class="AutoModelForSequenceClassification",
                                       allow_new_head=True, num_labels=self.task.data.num_labels)


@dataclass(frozen=True)
class Method:
    name: str
    run: Callable[[Context], tuple[nn.Module, dict[str, Any]]]
    needs: tuple[str, ...] = ()
    description: str = ""


METHODS: dict[str, Method] = {}


def method(name: str, *, needs: tuple[str, ...] = (), description: str = "") -> Callable[..., Any]:
    """Register a suite method under ``name``."""
    def register(fn: Callable[[Context], tuple[nn.Module, dict[str, Any]]]) -> Callable[..., Any]:
        METHODS[name] = Method(name, fn, needs, description)
        return fn
    return register


@method("finetuned", description="MiniLM-L6 fine-tuned (the reference of every ratio)")
def run_finetuned(ctx: Context) -> tuple[nn.Module, dict[str, Any]]:
    model = ctx.pretrained()
    finetune(model, ctx.task.data, epochs=ctx.args.baseline_epochs, learning_rate=ctx.args.lr, seed=ctx.seed)
    return model, {"epochs": ctx.args.baseline_epochs}


#: SHRP settings measured against the default recipe (defaults are chosen from the suite).
#: A variant runs as method ``shrp-K/6+NAME``, on the same fine-tuned model and split as the default.
SHRP_VARIANTS: dict[str, dict[str, Any]] = {
    "kd": dict(distill_alpha=0.5, distill_hidden_weight=1.0),
    "lr1e-4": dict(learning_rate=1e-4),
    "kd-lr1e-4": dict(distill_alpha=0.5, distill_hidden_weight=1.0, learning_rate=1e-4),
    "kd-lr1e-4-x4": dict(distill_alpha=0.5, distill_hidden_weight=1.0, learning_rate=1e-4, extra_epochs=4),
    "gain0.1": dict(expander_gain=0.1),
    "kd-gain0.1": dict(distill_alpha=0.5, distill_hidden_weight=1.0, expander_gain=0.1),
    "kd-lr1e-4-gain0.1": dict(distill_alpha=0.5, distill_hidden_weight=1.0, learning_rate=1e-4, expander_gain=0.1),
}


def shrp_method(converted: int, overrides: dict[str, Any] | None = None
                ) -> Callable[[Context], tuple[nn.Module, dict[str, Any]]]:
    def run(ctx: Context) -> tuple[nn.Module, dict[str, Any]]:
        model = ctx.load("finetuned")
        settings = {**SHRP_RECIPE, "num_layers": converted, "seed": ctx.seed, **(overrides or {})}
        strategy = ShrpPipeline(**settings)
        report = surgery.convert(model, strategy, data=ctx.task.data)
        keep = ("layers", "accuracy_moe", "accuracy_pruned", "accuracy_recovered", "usage", "coverage",
                "expert_drops", "history", "train_seconds")
        return model, {"config": strategy.config.model_dump(mode="json"),
                       "shrp": {k: report.metrics[k] for k in keep if k in report.metrics}}
    return run


for _k in (3, 5):
    method(f"shrp-{_k}/6", needs=("finetuned",),
           description=f"SHRP, top {_k} of 6 layers single-head (default recipe, on the fine-tuned model)")(
        shrp_method(_k))
    for _name, _overrides in SHRP_VARIANTS.items():
        method(f"shrp-{_k}/6+{_name}", needs=("finetuned",),
               description=f"SHRP-{_k}/6 with {_overrides}")(shrp_method(_k, _overrides))


def matched_ratio(model: nn.Module, target: int) -> float:
    """The fraction of heads and of FFN neurons (the same for both) that leaves ``target`` parameters
    without embeddings: bisection on magnitude-pruned copies, so it counts what the strategies remove."""
    def remaining(r: float) -> int:
        trial = copy.deepcopy(model)
        if r > 0:
            surgery.convert(trial, HeadPruningStrategy(ratio=r, importance="magnitude"))
            surgery.convert(trial, FFNPruningStrategy(ratio=r, importance="magnitude"))
        return surgery.count_params(trial).without_embeddings

    lo, hi = 0.0, 0.95
    for _ in range(12):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if remaining(mid) > target else (lo, mid)
    return hi


def pruned_at(converted: int, recover: Callable[[nn.Module, Context], dict[str, Any]]
              ) -> Callable[[Context], tuple[nn.Module, dict[str, Any]]]:
    """Head+FFN pruning of the fine-tuned model to SHRP-K's size, then ``recover``."""
    def run(ctx: Context) -> tuple[nn.Module, dict[str, Any]]:
        target = ctx.rows[f"shrp-{converted}/6"]["params"]["without_embeddings"]
        model = ctx.load("finetuned")
        ratio = matched_ratio(model, target)
        # Gradient importance (Michel et al.) on the training split; heads first, on the unpruned FFN.
        surgery.convert(model, HeadPruningStrategy(ratio=ratio, importance="gradient"), data=ctx.task.data)
        surgery.convert(model, FFNPruningStrategy(ratio=ratio, importance="gradient"), data=ctx.task.data)
        before = {"dev": accuracy(model, ctx.task.data.loader("eval")),
                  "test": accuracy(model, ctx.task.test_data().loader("eval"))}
        return model, {"ratio": ratio, "target_without_embeddings": target, "before_recovery": before,
                       **recover(model, ctx)}
    return run


def recover_finetune(model: nn.Module, ctx: Context) -> dict[str, Any]:
    finetune(model, ctx.task.data, epochs=ctx.args.recovery_epochs, learning_rate=ctx.args.lr, seed=ctx.seed)
    return {"recovery": "fine-tune", "recovery_epochs": ctx.args.recovery_epochs}


def recover_distil(model: nn.Module, ctx: Context, *, refit: bool = False) -> dict[str, Any]:
    """Distillation from the fine-tuned model (logit KL + CE, surgery's recovery defaults) for the same budget.

    ``refit`` first re-solves the cut output projections by least squares (``RecoveryConfig.refit``).
    """
    config = RecoveryConfig(epochs=ctx.args.recovery_epochs, learning_rate=ctx.args.lr, seed=ctx.seed, refit=refit)
    result = recover(model, ctx.load("finetuned").eval(), ctx.task.data, config)
    return {"recovery": "distillation" + (" after a refit" if refit else ""), "recovery_epochs": config.epochs,
            "recovery_config": config.model_dump(mode="json"), "recovery_dev": result.model_dump(mode="json")}


def recover_refit_distil(model: nn.Module, ctx: Context) -> dict[str, Any]:
    return recover_distil(model, ctx, refit=True)


for _k in (3, 5):
    method(f"head+ffn-ft@shrp-{_k}/6", needs=("finetuned", f"shrp-{_k}/6"),
           description=f"heads and FFN neurons pruned to SHRP-{_k}/6's size, fine-tuned to recover")(
        pruned_at(_k, recover_finetune))
    method(f"head+ffn-kd@shrp-{_k}/6", needs=("finetuned", f"shrp-{_k}/6"),
           description=f"heads and FFN neurons pruned to SHRP-{_k}/6's size, distilled from the fine-tuned model")(
        pruned_at(_k, recover_distil))
    method(f"head+ffn-refit-kd@shrp-{_k}/6", needs=("finetuned", f"shrp-{_k}/6"),
           description=f"heads and FFN neurons pruned to SHRP-{_k}/6's size, output projections refitted by "
                       "least squares, then distilled from the fine-tuned model")(
        pruned_at(_k, recover_refit_distil))


def layer_drop_kd(kept: int) -> Callable[[Context], tuple[nn.Module, dict[str, Any]]]:
    """Keep ``kept`` of 6 layers (every other, the sentence-transformers rule) of the fine-tuned model, then distil."""
    def run(ctx: Context) -> tuple[nn.Module, dict[str, Any]]:
        model = ctx.load("finetuned")
        surgery.convert(model, LayerDropStrategy(count=6 - kept, rule="every-other"))
        before = {"dev": accuracy(model, ctx.task.data.loader("eval")),
                  "test": accuracy(model, ctx.task.test_data().loader("eval"))}
        return model, {"kept_layers": kept, "before_recovery": before, **recover_distil(model, ctx)}
    return run


for _n in (3, 2, 1):
    method(f"layer-drop-kd-{_n}/6", needs=("finetuned",),
           description=f"the fine-tuned model with {_n} of 6 layers kept (every other), distilled from it")(
        layer_drop_kd(_n))


# -- bookkeeping -------------------------------------------------------------------------------
def load_results(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {"runs": {}}


def save_results(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def run_key(task: str, seed: int, name: str) -> str:
    return f"{task}|{seed}|{name}"


def ordered(names: list[str]) -> list[str]:
    """``names`` with every method after the methods it needs (which are added if missing)."""
    out: list[str] = []

    def visit(name: str) -> None:
        if name not in METHODS:
            raise SystemExit(f"unknown method {name!r}; known: {', '.join(METHODS)}")
        for dep in METHODS[name].needs:
            visit(dep)
        if name not in out:
            out.append(name)
    for name in names:
        visit(name)
    return out


def training_device() -> str:
    """Where the HF Trainer trains (it takes the GPU when there is one): recorded with every row."""
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def step_train(args: argparse.Namespace, results: dict[str, Any]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(args.model))
    for seed in args.seeds:
        for task_name in args.tasks:
            names = ordered(args.methods)
            if all(run_key(task_name, seed, n) in results["runs"] for n in names):
                continue
            task = load_suite_task(task_name, tokenizer, seed=seed, max_train=args.max_train, max_dev=args.max_dev,
                             max_test=args.max_test)
            rows = {n: results["runs"][run_key(task_name, seed, n)] for n in names
                    if run_key(task_name, seed, n) in results["runs"]}
            ctx = Context(task, seed, args, rows, args.work)
            for name in names:
                if name in rows:
                    continue
                start = time.perf_counter()
                model, extra = METHODS[name].run(ctx)
                row = {"task": task_name, "seed": seed, "method": name, "data": task.data.info,
                       "dev": accuracy(model, task.data.loader("eval")),
                       "test": accuracy(model, task.test_data().loader("eval")),
                       "params": surgery.count_params(model).model_dump(), "device": training_device(),
                       "seconds": time.perf_counter() - start, **extra}
                surgery.save_pretrained(model, ctx.model_dir(name), overwrite=True)
                rows[name] = results["runs"][run_key(task_name, seed, name)] = row
                save_results(args.out, results)
                print(f"[{task_name} seed {seed}] {name}: dev {row['dev']:.4f} test {row['test']:.4f} "
                      f"({row['seconds']:.0f}s)", flush=True)


def step_bench(args: argparse.Namespace, results: dict[str, Any]) -> None:
    task, seed = args.bench_on or (args.tasks[0], str(args.seeds[0]))
    base = args.work / task / seed
    names = [n for n in ordered(args.methods) if (base / n.replace("/", "of") / "surgery.json").exists()]
    if "finetuned" not in names:
        raise SystemExit(f"bench: no saved fine-tuned model under {base}; run the train step first")
    models = {n: surgery.from_pretrained(base / n.replace("/", "of"), model_class="AutoModelForSequenceClassification")
              for n in names}
    report = bench_models(models, batch_size=32, seq_len=args.max_length, repeats=args.bench_repeats, warmup=2,
                          threads=args.threads, device=args.bench_device)
    results["bench"] = {"task": task, "seed": int(seed), "report": report.model_dump(mode="json")}
    save_results(args.out, results)
    for c in report.comparisons:
        print(f"bench {c.name}: {c.speedup:.2f}x (paired {c.paired_speedup:.2f}x, FLOP bound "
              f"{c.flop_bound_speedup:.2f}x)", flush=True)


def base_of(name: str) -> str | None:
    """The method a variant is compared with, seed by seed: ``shrp-K/6+NAME`` with ``shrp-K/6``, and
    ``head+ffn-refit-kd@...`` with ``head+ffn-kd@...`` (the same run without the refit); else None."""
    if name.startswith("shrp-") and "+" in name:
        return name.split("+", 1)[0]
    if name.startswith("head+ffn-refit-kd@"):
        return name.replace("head+ffn-refit-kd@", "head+ffn-kd@")
    return None


def paired(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (task, variant): its accuracy minus its base method's on the same task and seed, in points.

    Dev decides (the suite chooses defaults on dev); test reports. ``dev_wins`` counts seeds where the
    variant is strictly ahead on dev.
    """
    by_key = {(r["task"], r["seed"], r["method"]): r for r in runs}
    out = []
    for task, name in sorted({(r["task"], r["method"]) for r in runs if base_of(r["method"])}):
        base = base_of(name)
        seeds = sorted(s for t, s, m in by_key if t == task and m == name and (task, s, base) in by_key)
        if not seeds:
            continue
        diff = {split: [100 * (by_key[(task, s, name)][split] - by_key[(task, s, base)][split]) for s in seeds]
                for split in ("dev", "test")}
        out.append({"task": task, "method": name, "base": base, "seeds": seeds,
                    "dev": mean_std(diff["dev"]), "test": mean_std(diff["test"]),
                    "dev_wins": sum(d > 0 for d in diff["dev"])})
    return out


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    """Per (task, method): test accuracy and accuracy retained (% of the fine-tuned model, same seed)."""
    runs = results["runs"].values()
    ref = {(r["task"], r["seed"]): r["test"] for r in runs if r["method"] == "finetuned"}
    comps = {c["name"]: c for c in results.get("bench", {}).get("report", {}).get("comparisons", [])}
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        cells.setdefault((r["task"], r["method"]), []).append(r)
    table = []
    for (task, name), rows in sorted(cells.items()):
        retained = [100 * r["test"] / ref[(task, r["seed"])] for r in rows if (task, r["seed"]) in ref]
        cut = [100 * (r["shrp"]["accuracy_moe"] - r["shrp"]["accuracy_pruned"]) for r in rows if "shrp" in r]
        comp = comps.get(name)
        table.append({
            "task": task, "method": name, "seeds": sorted(r["seed"] for r in rows),
            "test": mean_std([100 * r["test"] for r in rows]), "retained": mean_std(retained) if retained else None,
            "cut_loss_dev": mean_std(cut) if cut else None, "cut_loss_dev_max": max(cut) if cut else None,
            "params_without_embeddings": rows[0]["params"]["without_embeddings"],
            "speedup": comp["speedup"] if comp else (1.0 if name == "finetuned" else None),
            "flop_bound_speedup": comp["flop_bound_speedup"] if comp else (1.0 if name == "finetuned" else None),
        })
    pareto = [{"label": c["method"], "group": c["task"], "speedup": c["speedup"], "retained": c["retained"][0],
               "retained_std": c["retained"][1]} for c in table if c["speedup"] is not None and c["retained"]]
    usage: list[tuple[str, dict[str, list[int]]]] = []   # ordered phases (a JSON object could be re-sorted)
    shrp = [r for r in runs if r["method"] == "shrp-3/6"]
    if shrp:
        first = min(shrp, key=lambda r: (r["seed"], r["task"]))
        label = f"{first['task']} seed {first['seed']}"
        for stage, phase in ((1, "training, end of stage 1"), (2, "training, last epoch")):
            seen = [h for h in first["shrp"].get("history", []) if h.get("stage") == stage and h.get("usage")]
            if seen:
                usage.append((f"{label}: {phase}", seen[-1]["usage"]))
        usage.append((f"{label}: at the cut (dev)", first["shrp"]["usage"]))
    return {"table": table, "pareto": pareto, "usage": usage, "paired": paired(list(runs))}


def step_render(args: argparse.Namespace, results: dict[str, Any]) -> None:
    results["suite"] = summarise(results)
    save_results(args.out, results)
    if results["suite"]["pareto"]:
        write_pareto(results["suite"]["pareto"], args.out.with_name(f"{args.out.stem}_pareto.png"), overwrite=True,
                     title="suite: accuracy retained vs measured speedup (mean over seeds)")
    if results["suite"]["usage"]:
        write_usage(dict(results["suite"]["usage"]), args.out.with_name(f"{args.out.stem}_usage.png"), overwrite=True)
    subprocess.run([sys.executable, str(ROOT / "experiments" / "render.py")], check=True)


STEPS = {"train": step_train, "bench": step_bench, "render": step_render}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", nargs="+", default=["train", "bench", "render"], choices=list(STEPS))
    parser.add_argument("--tasks", nargs="+", default=["rt-sentiment", "rt-fresh-rotten-plot", "text-source"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=[n for n in METHODS if "+" not in n],
                        help="default: the suite's methods; SHRP variants (shrp-K/6+NAME) only when named")
    parser.add_argument("--max-train", type=int, default=600)
    parser.add_argument("--max-dev", type=int, default=200)
    parser.add_argument("--max-test", type=int, default=400)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--baseline-epochs", type=int, default=3)
    parser.add_argument("--recovery-epochs", type=int, default=2)
    parser.add_argument("--bench-on", nargs=2, metavar=("TASK", "SEED"), help="the (task, seed) whose models are "
                        "benchmarked (default: the first of each)")
    parser.add_argument("--bench-repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bench-device", default="cpu", help="where the bench step times the models (cpu, cuda)")
    parser.add_argument("--model", default=MODEL, help="the encoder every method starts from (default: minilm-l6)")
    parser.add_argument("--work", type=Path, default=ROOT / "logs" / "suite_work")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    results = load_results(args.out)
    for step in args.steps:
        print(f"== step {step}", flush=True)
        STEPS[step](args, results)


if __name__ == "__main__":
    main()
