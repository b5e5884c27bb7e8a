"""Activation smoothing (SmoothQuant) before dynamic int8: fidelity over alphas and seeds, and speed.

``surgery export --int8 --calibration DATA`` smooths every attention and FFN projection's input on
the user's texts before ONNX Runtime's dynamic quantization (surgery/runtimes/shared/smooth.py). This script
measures it against plain per-channel int8 (the export without ``--calibration``), in one process:

* ``embeddings``: the unchanged all-MiniLM-L6-v2 on the held-out texts of ``bench_embed.py`` (same
  seeded split per seed; the calibration texts are 512 other texts of the pool): mean cosine and
  recall@10 against the fp32 PyTorch embeddings, and linear probes, for every alpha and seed;
* ``classifiers``: MiniLM classifiers fine-tuned by ``experiments/suite/bench_suite.py --methods finetuned``
  (``--suite-work``): test accuracy in fp32 PyTorch and in each int8 graph (per-tensor weights too),
  and how many test predictions each int8 graph changes, calibrated on 512 texts of the task's
  training split;
* ``speed``: PyTorch fp32, plain int8 and smoothed int8 (the default alpha), interleaved rounds,
  paired ratios against PyTorch fp32, one thread.

    python experiments/suite/bench_suite.py --steps train --methods finetuned --seeds 0 1 --max-train 1500 \\
        --max-test 1000 --work /tmp/suite_work --out /tmp/suite.json
    python experiments/int8/probe_int8_smoothing.py --suite-work /tmp/suite_work \\
        --out experiments/int8/results/int8_smoothing.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

import surgery
from surgery.embedding import TeacherCache, evaluate_embeddings, read_sentence_config
from surgery.measure.bench import bench_models
from surgery.measure.stats import mean_std
from surgery.persist.assets import resolve_model_path
from surgery.runtimes.onnx import export_onnx
from surgery.runtimes.onnx.onnx_session import BenchedOnnxModel, OnnxRuntimeModel
from surgery.runtimes.shared.smooth import DEFAULT_ALPHA
from surgery.training.task_accuracy import accuracy

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
from experiments.embedding_suite import corpus_texts, probe_suite
from experiments.tasks import load_suite_task

PLAIN = "int8"  # per-channel int8 without smoothing: what `surgery export --int8` writes without --calibration
PER_TENSOR = -1.0  # stands for `--int8 --per-tensor` among the alphas of the classifier comparison


def label(alpha: float | None) -> str:
    if alpha == PER_TENSOR:
        return "int8 per tensor"
    return PLAIN if alpha is None else f"int8 smoothed a={alpha:g}"


def int8_graph(model: torch.nn.Module, out: Path, calibration: list[dict[str, torch.Tensor]] | None,
               alpha: float | None, threads: int, per_channel: bool = True) -> Path:
    export_onnx(model, out, int8=True, calibration=calibration if alpha is not None else None,
                smooth_alpha=alpha if alpha is not None else DEFAULT_ALPHA, per_channel=per_channel, threads=threads)
    return out / "model.onnx"


def tokenized(tokenizer: Any, texts: list[str], max_length: int, batch: int = 32) -> list[dict[str, torch.Tensor]]:
    return [dict(tokenizer(texts[i:i + batch], padding=True, truncation=True, max_length=max_length,
                           return_tensors="pt")) for i in range(0, len(texts), batch)]


def embeddings(args: argparse.Namespace, alphas: list[float | None], tmp: Path) -> dict[str, Any]:
    path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    sentence = read_sentence_config(path)
    assert sentence is not None
    teacher = surgery.from_pretrained(path).eval()
    runs: dict[str, Any] = {}
    for seed in args.seeds:
        # The held-out split of experiments/embeddings/bench_embed.py for the same seed; calibration texts come
        # after it.
        probes = probe_suite(seed=seed, max_train=args.probe_train, max_test=args.probe_test)
        probe_test = {t for task in probes for t in task.test_texts}
        pool = [t for t in corpus_texts() if t not in probe_test]
        random.Random(seed).shuffle(pool)
        held_out = pool[: args.held_out]
        calibration = tokenized(tokenizer, pool[args.held_out: args.held_out + args.calibration_texts],
                                args.eval_length)
        cache = TeacherCache(teacher, tokenizer, sentence, max_length=args.eval_length)
        for alpha in alphas:
            start = time.perf_counter()
            graph = int8_graph(teacher, tmp / f"embed-{seed}-{alpha}", calibration, alpha, args.threads)
            runtime = OnnxRuntimeModel(graph, config=teacher.config, threads=args.threads)
            report = evaluate_embeddings(runtime, cache, tokenizer, held_out, sentence, probes=probes,
                                         max_length=args.eval_length, seed=seed)
            runs[f"{label(alpha)} / seed {seed}"] = {"alpha": alpha, "seed": seed, **report.model_dump(mode="json")}
            print(f"[embeddings seed {seed}] {label(alpha)}: cosine {report.mean_cosine:.4f} recall@10 "
                  f"{report.recall_at_k:.4f} probes {[round(p.delta_points, 1) for p in report.probes]} "
                  f"({time.perf_counter() - start:.0f}s)", flush=True)
    summary = {}
    for alpha in alphas:
        rows = [r for r in runs.values() if r["alpha"] == alpha]
        summary[label(alpha)] = {
            "seeds": len(rows), "mean_cosine": mean_std([r["mean_cosine"] for r in rows]),
            "recall_at_10": mean_std([r["recall_at_k"] for r in rows]),
            "worst_probe_delta_points": mean_std([min(p["delta_points"] for p in r["probes"]) for r in rows]),
            "probe_delta_points": {task: mean_std([p["delta_points"] for r in rows for p in r["probes"]
                                                   if p["task"] == task])
                                   for task in [p["task"] for p in rows[0]["probes"]]}}
    return {"setup": {"model": args.model, "seeds": args.seeds, "held_out_texts": args.held_out,
                      "calibration_texts": args.calibration_texts, "eval_length": args.eval_length,
                      "probe_train": args.probe_train, "probe_test": args.probe_test},
            "runs": runs, "summary": summary}


def predictions(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(**{k: v for k, v in b.items() if k != "labels"}).logits.argmax(-1) for b in batches])


def classifiers(args: argparse.Namespace, alphas: list[float | None], tmp: Path) -> dict[str, Any]:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(args.model))
    runs: dict[str, Any] = {}
    for model_dir in sorted(Path(args.suite_work).glob("*/*/finetuned")):
        task_name, seed = model_dir.parent.parent.name, int(model_dir.parent.name)
        task = load_suite_task(task_name, tokenizer, seed=seed, max_train=args.suite_max_train,
                               max_dev=args.suite_max_dev, max_test=args.suite_max_test)
        test = list(task.test_data().loader("eval"))
        calibration = [{k: v for k, v in b.items() if k != "labels"}
                       for b in task.data.loader("train", shuffle=True, seed=0)][: args.calibration_texts // 32]
        model = surgery.from_pretrained(model_dir, model_class="AutoModelForSequenceClassification").eval()
        reference = predictions(model, test)
        row: dict[str, Any] = {"task": task_name, "seed": seed, "test_size": len(reference),
                               "fp32": accuracy(model, test)}
        for alpha in (PER_TENSOR, *alphas):
            graph = int8_graph(model, tmp / f"cls-{task_name}-{seed}-{alpha}", calibration,
                               None if alpha == PER_TENSOR else alpha, args.threads, per_channel=alpha != PER_TENSOR)
            runtime = OnnxRuntimeModel(graph, config=model.config, output="logits", threads=args.threads,
                                       task="seq-cls")
            row[label(alpha)] = {"accuracy": accuracy(runtime, test),
                                 "changed_predictions": int((predictions(runtime, test) != reference).sum())}
        runs[f"{task_name} / seed {seed}"] = row
        print(f"[{task_name} seed {seed}] fp32 {row['fp32']:.4f} "
              + " ".join(f"{label(a)} {row[label(a)]['accuracy']:.4f} ({row[label(a)]['changed_predictions']} "
                         "changed)" for a in (PER_TENSOR, *alphas)), flush=True)
    summary = {label(alpha): {
        "runs": len(runs),
        "accuracy_delta_points": mean_std([100 * (r[label(alpha)]["accuracy"] - r["fp32"]) for r in runs.values()]),
        "changed_predictions_percent": mean_std([100 * r[label(alpha)]["changed_predictions"] / r["test_size"]
                                                 for r in runs.values()])} for alpha in (PER_TENSOR, *alphas)}
    return {"setup": {"suite_work": str(args.suite_work), "max_train": args.suite_max_train,
                      "max_test": args.suite_max_test, "calibration_texts": args.calibration_texts},
            "runs": runs, "summary": summary}


def speed(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    teacher = surgery.from_pretrained(path).eval()
    pool = corpus_texts()
    random.Random(0).shuffle(pool)
    calibration = tokenized(tokenizer, pool[: args.calibration_texts], args.eval_length)
    models: dict[str, torch.nn.Module] = {"pytorch fp32": teacher}
    for alpha in (None, DEFAULT_ALPHA):
        graph = int8_graph(teacher, tmp / f"speed-{alpha}", calibration, alpha, args.threads)
        models[label(alpha)] = BenchedOnnxModel(graph, teacher, output="last_hidden_state", task="base",
                                                threads=args.threads)
    result = bench_models(models, batch_size=32, seq_len=64, repeats=args.repeats, warmup=2, threads=args.threads)
    for comparison in result.comparisons:
        print(f"[speed] {comparison.name}: {comparison.paired_speedup:.2f}x paired", flush=True)
    return result.model_dump(mode="json")


def pm(value: list[float], digits: int = 3) -> str:
    """``mean ± std`` of a ``[mean, std]`` pair."""
    return f"{value[0]:.{digits}f} ± {value[1]:.{digits}f}"


def table_head(*cells: str) -> list[str]:
    """A markdown table's header row and separator."""
    return ["| " + " | ".join(cells) + " |", "|" + "---|" * len(cells)]


def render(results: dict[str, Any], source: str) -> str:
    """The markdown tables of the results file ``source`` (every figure read from it)."""
    lines = ["# Activation smoothing before dynamic int8 (SmoothQuant)", "",
             f"Generated by `experiments/int8/probe_int8_smoothing.py` from [{source}]({source}) "
             f"on {results.get('machine', 'an unrecorded machine')}. `int8`: `surgery export --int8` (per-channel "
             "weights, activations as they are); `int8 smoothed a=A`: the same with `--calibration` at "
             f"`--smooth-alpha A` (the default is {results['default_alpha']:g}). Mean ± sample std."]
    if "embeddings" in results:
        e = results["embeddings"]
        setup = e["setup"]
        lines += ["", "## all-MiniLM-L6-v2 embeddings against its fp32 PyTorch embeddings", "",
                  f"Seeds {', '.join(map(str, setup['seeds']))}: each seed draws its own {setup['held_out_texts']} "
                  f"held-out texts (drawn as `bench_embed.py` draws them) and {setup['calibration_texts']} other "
                  f"texts to calibrate on; {setup['eval_length']} tokens; linear probes (training / test texts: "
                  + ", ".join(f"{p['task']} {p['train_size']} / {p['test_size']}"
                              for p in next(iter(e["runs"].values()))["probes"])
                  + "; Δ points against the "
                  "fp32 teacher's probe).", "",
                  *table_head("graph", "mean cosine", "recall@10", "worst probe Δ",
                              *(f"{t} Δ" for t in next(iter(e["summary"].values()))["probe_delta_points"]))]
        for name, row in e["summary"].items():
            lines.append(f"| {name} | {pm(row['mean_cosine'], 4)} | {pm(row['recall_at_10'])} | "
                         f"{pm(row['worst_probe_delta_points'], 1)} | "
                         + " | ".join(pm(v, 1) for v in row["probe_delta_points"].values()) + " |")
    if "classifiers" in results:
        c = results["classifiers"]
        runs = c["runs"]
        lines += ["", "## Fine-tuned MiniLM classifiers: test accuracy of the int8 graph against fp32 PyTorch", "",
                  f"{len(runs)} classifiers ({', '.join(runs)}), fine-tuned by "
                  f"`experiments/suite/bench_suite.py --methods "
                  f"finetuned` on {c['setup']['max_train']} training examples; {c['setup']['max_test']} test "
                  f"examples each; calibrated on {c['setup']['calibration_texts']} training texts. Changed: test "
                  "predictions that differ from fp32 PyTorch's.", "",
                  *table_head("graph", "accuracy Δ points", "changed predictions %", *runs)]
        for name, row in c["summary"].items():
            cells = [f"{100 * r[name]['accuracy']:.1f} ({100 * (r[name]['accuracy'] - r['fp32']):+.1f})"
                     for r in runs.values()]
            lines.append(f"| {name} | {pm(row['accuracy_delta_points'], 2)} | "
                         f"{pm(row['changed_predictions_percent'], 2)} | " + " | ".join(cells) + " |")
        lines.append("| fp32 PyTorch | - | - | " + " | ".join(f"{100 * r['fp32']:.1f}" for r in runs.values()) + " |")
    if "speed" in results:
        b = results["speed"]
        settings = b["settings"]
        lines += ["", "## Speed", "", "Paired speedup against PyTorch fp32 (median of same-round ratios, and its 95% "
                  f"interval), batch {settings['batch_size']} x {settings['seq_len']} tokens, {settings['threads']} "
                  f"thread(s), {settings['repeats']} interleaved rounds in one process.", "",
                  *table_head("graph", "paired speedup", "95% interval")]
        for comp in b["comparisons"]:
            lo, hi = comp["paired_speedup_ci"]
            lines.append(f"| {comp['name']} | {comp['paired_speedup']:.2f}x | {lo:.2f}-{hi:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", nargs="+", default=["embeddings", "classifiers", "speed"],
                        choices=["embeddings", "classifiers", "speed"])
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--alphas", nargs="+", type=float, default=[0.5, 0.7, 0.8, 0.85, 0.9, 1.0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--held-out", type=int, default=2000)
    parser.add_argument("--calibration-texts", type=int, default=512)
    parser.add_argument("--eval-length", type=int, default=128)
    parser.add_argument("--probe-train", type=int, default=600)
    parser.add_argument("--probe-test", type=int, default=300)
    parser.add_argument("--suite-work", type=Path, default=Path("/tmp/suite_work"))
    parser.add_argument("--suite-max-train", type=int, default=1500)
    parser.add_argument("--suite-max-dev", type=int, default=200)
    parser.add_argument("--suite-max-test", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--out", type=Path, default=Path("experiments/int8/results/int8_smoothing.json"))
    parser.add_argument("--render-only", action="store_true", help="only write the table from --out")
    args = parser.parse_args()
    table = args.out.with_suffix(".md")
    if args.render_only:
        table.write_text(render(json.loads(args.out.read_text()), args.out.name))
        return
    torch.set_num_threads(args.threads)
    alphas: list[float | None] = [None, *args.alphas]
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    machine = f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start"
    results.setdefault("machine", machine)  # of the first run; each part records its own below
    results["default_alpha"] = DEFAULT_ALPHA
    with tempfile.TemporaryDirectory(prefix="int8-smoothing-") as tmp:
        for part in args.parts:
            results[part] = {"embeddings": lambda: embeddings(args, alphas, Path(tmp)),
                             "classifiers": lambda: classifiers(args, alphas, Path(tmp)),
                             "speed": lambda: speed(args, Path(tmp))}[part]()
            results[part]["machine"] = machine
            args.out.write_text(json.dumps(results, indent=2) + "\n")
            table.write_text(render(results, args.out.name))


if __name__ == "__main__":
    main()
