"""Exported graphs against PyTorch: fused attention, the ORT fusions, dynamic against static int8.

For every family, three models at MiniLM-L6 widths (6 layers, 12 heads of 32, FFN 1536): the real
all-MiniLM-L6-v2 for ``bert`` (``minilm``) and random weights for the other families (speed needs no
trained weights), each as

* ``original``;
* ``shrp-3/6`` (MiniLM only): SHRP's end structure without its training, as
  ``experiments/deploy/bench_deploy.py --standin`` builds it: the top 3 of 6 layers converted to Expert
  Attention and Top-1 pruned (one single-head attention layer each, no FFN); its int8 fidelity is
  against its own fp32. Those three layers compute attention themselves and stay unfused;
* ``single-head-3/6``: the top 3 of 6 layers cut to one head by head pruning (FFNs kept): a fusable
  single-head structure for every family;
* ``head+ffn``: heads and FFN neurons pruned unevenly (12/8/6/6/4/2 heads, FFN 1024/768/768/512/512/512);

and each of those in six runtimes: PyTorch fp32, ONNX Runtime fp32 with attention as exported before
(``--no-fuse-attention``), ONNX Runtime fp32 fused (the default export), int8 dynamic unfused and fused,
and int8 static fused, every int8 graph smoothed on calibration batches (``--int8 --calibration``;
``int8_mode='static'``).

Stages, so that only the timing holds the machine's timing lock:

* ``export``: exports every graph into ``--work`` (reused when present), records the operator counts of
  each graph after ONNX Runtime's offline optimisation at level ``extended`` and, for the real MiniLM
  models, the fidelity of both int8 graphs against fp32 PyTorch on 2,000 held-out Rotten Tomatoes texts
  (mean cosine, recall@10; 512 other texts calibrate);
* ``time``: per family and thread count, all 18 variants side by side in one process
  (``surgery.measure.bench.bench_models``: same batch of 32 x ``--seq`` tokens, interleaved rounds in
  rotating order, paired ratios against PyTorch fp32 of the original, 95% bootstrap intervals);
* ``profile``: ONNX Runtime's profiler on the MiniLM graphs, time per operator type;
* ``render``: ``results/graph_speed.md`` from ``results/graph_speed.json``.

    python experiments/graph_speed/bench_graphs.py export --work /tmp/graph_speed
    flock /work/timing.lock python experiments/graph_speed/bench_graphs.py time --work /tmp/graph_speed \\
        --families bert --threads 1 2
    python experiments/graph_speed/bench_graphs.py profile --work /tmp/graph_speed
    python experiments/graph_speed/bench_graphs.py render
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import random
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

import surgery
from surgery.embedding import TeacherCache, evaluate_embeddings, read_sentence_config
from surgery.measure.bench import bench_models
from surgery.measure.machine import machine_info
from surgery.measure.stats import bootstrap_median
from surgery.measure.timing import make_inputs
from surgery.persist.assets import resolve_model_path
from surgery.runtimes.onnx import export_onnx
from surgery.runtimes.onnx.onnx_session import BenchedOnnxModel, OnnxRuntimeModel, optimize_graph, require_onnx
from surgery.strategies import (
    ExpertAttentionStrategy,
    FFNPruningStrategy,
    HeadPruningStrategy,
    Top1PruningStrategy,
)
from surgery.testing import FAMILIES, TinySpec, tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
from experiments.embedding_suite import corpus_texts

ROOT = Path(__file__).resolve().parents[2]  # experiments/<study>/<script>.py
RESULTS = ROOT / "experiments" / "graph_speed" / "results" / "graph_speed.json"
MODELS = ("original", "shrp-3/6", "single-head-3/6", "head+ffn")
#: Runtime variants: label -> export_onnx arguments (None: the PyTorch model itself).
VARIANTS: dict[str, dict[str, Any] | None] = {
    "torch fp32": None,
    "ort fp32 unfused": {"fuse_attention": False},
    "ort fp32 fused": {},
    "int8 dynamic unfused": {"int8": True, "int8_mode": "dynamic", "fuse_attention": False},
    "int8 dynamic": {"int8": True, "int8_mode": "dynamic"},
    "int8 static": {"int8": True, "int8_mode": "static"},
}
HEADS_REMOVED = {0: 0, 1: 4, 2: 6, 3: 6, 4: 8, 5: 10}  # -> 12/8/6/6/4/2 heads
NEURONS_REMOVED = {0: 512, 1: 768, 2: 768, 3: 1024, 4: 1024, 5: 1024}  # -> 1024/768/768/512/512/512
HELD_OUT, CALIBRATION_TEXTS, EVAL_LENGTH = 2000, 512, 64


def base_model(family: str) -> torch.nn.Module:
    """all-MiniLM-L6-v2 for bert, else the family at MiniLM-L6 widths with random weights."""
    if family == "bert":
        return surgery.from_pretrained(resolve_model_path("minilm-l6")).eval()
    # ModernBERT at its real local window (128 tokens; the tiny test config's 8 is for tests of the window).
    real = {"local_attention": 128} if family == "modernbert" else {}
    model = tiny_model(TinySpec(family, heads=12, head_dim=32, layers=6, ffn=1536, seed=FAMILIES.index(family)),
                       **real)
    # PyTorch rows run as from_pretrained would load them: SDPA where the family has it (MPNet and
    # DeBERTa-v2 have their own attention only).
    with contextlib.suppress(ValueError, ImportError):
        model.set_attn_implementation("sdpa")
    return model


def models_of(family: str) -> tuple[str, ...]:
    """The models benched for ``family``: SHRP's stand-in only for the real MiniLM."""
    return MODELS if family == "bert" else tuple(m for m in MODELS if m != "shrp-3/6")


def build(family: str, name: str) -> torch.nn.Module:
    model = base_model(family)
    if name == "shrp-3/6":
        surgery.convert(model, ExpertAttentionStrategy(layers=[3, 4, 5]))
        usage = make_inputs(int(model.config.vocab_size), batch_size=8, seq_len=16, seed=0)
        surgery.convert(model, Top1PruningStrategy(keep=1), data=[usage])
    elif name == "single-head-3/6":
        surgery.convert(model, HeadPruningStrategy(heads={i: list(range(1, 12)) for i in (3, 4, 5)}))
    elif name == "head+ffn":
        surgery.convert(model, HeadPruningStrategy(heads={i: list(range(n)) for i, n in HEADS_REMOVED.items() if n}))
        surgery.convert(model, FFNPruningStrategy(neurons={i: list(range(n)) for i, n in NEURONS_REMOVED.items()}))
    return model.eval()


def texts_split() -> tuple[list[str], list[str]]:
    """2,000 held-out Rotten Tomatoes texts and 512 others to calibrate on (seed 0)."""
    pool = corpus_texts(["rotten-tomatoes-full"])
    random.Random(0).shuffle(pool)
    return pool[:HELD_OUT], pool[HELD_OUT:HELD_OUT + CALIBRATION_TEXTS]


def random_calibration_batches(family: str, model: torch.nn.Module, seq: int) -> list[dict[str, torch.Tensor]]:
    if family == "bert":
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("minilm-l6"))
        texts = texts_split()[1]
        return [dict(tokenizer(texts[i:i + 32], padding=True, truncation=True, max_length=EVAL_LENGTH,
                               return_tensors="pt")) for i in range(0, len(texts), 32)]
    return [make_inputs(int(model.config.vocab_size), batch_size=32, seq_len=seq, seed=s) for s in range(4)]


def graph_path(work: Path, family: str, name: str, variant: str) -> Path:
    return work / family / name.replace("/", "-") / variant.replace(" ", "-") / "model.onnx"


def export_all(args: argparse.Namespace) -> None:
    for family in args.families:
        for name in models_of(family):
            model = build(family, name)
            batches = random_calibration_batches(family, model, args.seq)
            entry: dict[str, Any] = {"ops": {}, "fused_attention": None}
            for variant, options in VARIANTS.items():
                if options is None:
                    continue
                path = graph_path(args.work, family, name, variant)
                if not (path.parent / "report.json").exists():  # exported and recorded before: reused
                    extra = {"calibration": batches} if options.get("int8") else {}
                    report = export_onnx(model, path.parent, batch=4, seq=24, threads=args.threads, overwrite=True,
                                         **options, **extra)
                    (path.parent / "report.json").write_text(report.model_dump_json())
                report = json.loads((path.parent / "report.json").read_text())
                if variant == "ort fp32 fused":
                    entry["fused_attention"] = report["fused_attention"]
                with tempfile.TemporaryDirectory() as tmp:
                    entry["ops"][variant] = optimize_graph(path, Path(tmp) / "optimized.onnx", threads=args.threads)
            if family == "bert":  # measured once per model (minutes); delete it from the results to measure again
                known = load_results().get("graphs", {}).get(family, {}).get(name, {}).get("fidelity")
                entry["fidelity"] = known or fidelity(model, args.work, name, args.threads)
            print(f"[export] {family} {name}: {json.dumps(entry.get('fidelity'))}", flush=True)
            update_results(("graphs", family, name), entry)


def fidelity(model: torch.nn.Module, work: Path, name: str, threads: int) -> dict[str, Any]:
    """Both int8 graphs against the model's own fp32 PyTorch embeddings on the held-out texts."""
    path = resolve_model_path("minilm-l6")
    tokenizer = AutoTokenizer.from_pretrained(path)
    sentence = read_sentence_config(path)
    held_out, _ = texts_split()
    cache = TeacherCache(model, tokenizer, sentence, max_length=EVAL_LENGTH)
    found = {}
    for variant in ("int8 dynamic", "int8 static", "ort fp32 fused"):
        runtime = OnnxRuntimeModel(graph_path(work, "bert", name, variant), config=model.config, threads=threads)
        report = evaluate_embeddings(runtime, cache, tokenizer, held_out, sentence, max_length=EVAL_LENGTH)
        found[variant] = {"mean_cosine": report.mean_cosine, "recall_at_10": report.recall_at_k}
    return found


def time_all(args: argparse.Namespace) -> None:
    for family in args.families:
        for threads in args.threads_list:
            models: dict[str, torch.nn.Module] = {}
            for name in models_of(family):
                model = build(family, name)
                for variant, options in VARIANTS.items():
                    label = f"{name} | {variant}"
                    if options is None:
                        models[label] = model
                    else:
                        models[label] = BenchedOnnxModel(graph_path(args.work, family, name, variant), model,
                                                         output="last_hidden_state", task="base", threads=threads)
            report = bench_models(models, batch_size=32, seq_len=args.seq, repeats=args.repeats, warmup=2,
                                  threads=threads)
            rows = {c.name: {"paired_speedup": c.paired_speedup, "ci95": c.paired_speedup_ci,
                             "flop_bound": c.flop_bound_speedup} for c in report.comparisons}
            rows[report.models[0].name] = {"paired_speedup": 1.0, "ci95": None, "flop_bound": 1.0}
            # Against the same model in PyTorch fp32: each round's ratio, median and 95% bootstrap interval.
            rounds = {b.name: b.throughput_rounds for b in report.models}
            for label, row in rows.items():
                own = rounds[f"{label.split(' | ')[0]} | torch fp32"]
                ci = bootstrap_median([a / b for a, b in zip(rounds[label], own, strict=True)])
                row["vs_own_torch"], row["vs_own_torch_ci95"] = ci.estimate, (ci.low, ci.high)
            run = {"rows": rows, "throughput": {b.name: b.throughput for b in report.models},
                   "warnings": report.warnings,
                   "torch_attention": getattr(models["original | torch fp32"].config, "_attn_implementation", None),
                   "settings": report.settings.model_dump(mode="json"),
                   "machine": report.machine.model_dump(mode="json") if report.machine else None}
            print(f"[time] {family} threads={threads}: " + ", ".join(
                f"{k}: {v['vs_own_torch']:.2f}" for k, v in rows.items()), flush=True)
            update_results(("timing", family, str(threads)), run)


def profile(args: argparse.Namespace) -> None:
    """ONNX Runtime's per-node profile of the MiniLM graphs: share of time per operator type."""
    require_onnx()
    import onnxruntime as ort

    inputs = {k: v.numpy() for k, v in make_inputs(30522, batch_size=32, seq_len=args.seq, seed=0).items()}
    inputs["token_type_ids"] = inputs["input_ids"] * 0
    found: dict[str, Any] = {}
    for name in ("original", "shrp-3/6"):
        for variant in ("ort fp32 fused", "int8 dynamic unfused", "int8 dynamic", "int8 static"):
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.enable_profiling = True
            options.profile_file_prefix = str(args.work / "profile")
            session = ort.InferenceSession(str(graph_path(args.work, "bert", name, variant)), options,
                                           providers=["CPUExecutionProvider"])
            feeds = {i.name: inputs[i.name] for i in session.get_inputs()}
            for _ in range(args.repeats):
                session.run(None, feeds)
            trace = json.loads(Path(session.end_profiling()).read_text())
            per_op: dict[str, float] = defaultdict(float)
            for event in trace:
                if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                    per_op[event["args"]["op_name"]] += event["dur"] / 1000 / args.repeats
            total = sum(per_op.values())
            found[f"{name} | {variant}"] = {
                "ms_per_batch": total,
                "share": {k: v / total for k, v in sorted(per_op.items(), key=lambda kv: -kv[1])}}
            print(f"[profile] {name} {variant}: {total:.1f} ms", flush=True)
    update_results(("profile",), {"threads": 1, "batch": [32, args.seq], "runs": args.repeats, "graphs": found})


def load_results() -> dict[str, Any]:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {}


def update_results(keys: tuple[str, ...], value: Any) -> None:
    """Set ``results[k1][k2]... = value`` in the results file: stages may run in parallel processes."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = load_results()
        node = results
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
        results["machine_at_save"] = machine_info().model_dump(mode="json")
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")


def _cell(row: dict[str, Any] | None, key: str) -> str:
    if row is None:
        return "-"
    ci = row.get(f"{key}_ci95" if key != "paired_speedup" else "ci95")
    return f"{row[key]:.2f}x" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")


def render(_: argparse.Namespace) -> None:
    """``results/graph_speed.md``: speed tables, fidelity, fused operators, the profile."""
    results = load_results()
    timed = [run for by_threads in results.get("timing", {}).values() for run in by_threads.values()]
    machine = next((run["machine"] for run in timed if run.get("machine")), results.get("machine_at_save") or {})
    flags = [f for f in machine.get("flags", []) if "vnni" in f or f in ("avx2", "avx512f", "amx_int8")]
    lines = ["# Exported graphs against PyTorch", "",
             f"Machine: {machine.get('cpu_model')} ({machine.get('arch')}), int8-relevant flags "
             f"{', '.join(flags)}, "
             f"{machine.get('usable_cpus')} usable CPUs. Raw numbers: [graph_speed.json](graph_speed.json). "
             "Batch 32 x 50 random token ids, all real; each cell: median over rounds of the same-round ratio "
             "with its 95% bootstrap interval.", ""]
    variants = [v for v in VARIANTS if v != "torch fp32"]
    for family, by_threads in results.get("timing", {}).items():
        for threads, run in sorted(by_threads.items()):
            lines += [f"## {family}, {threads} thread(s) (PyTorch attention: {run.get('torch_attention')})", "",
                      "Against the same model in PyTorch fp32:", "",
                      "| model | " + " | ".join(variants) + " | PyTorch fp32 vs original |",
                      "|---" * (len(variants) + 2) + "|"]
            benched = [name for name in MODELS if f"{name} | torch fp32" in run["rows"]]
            for name in benched:
                rows = run["rows"]
                cells = [_cell(rows.get(f"{name} | {v}"), "vs_own_torch") for v in variants]
                own = _cell(rows.get(f"{name} | torch fp32"), "paired_speedup")
                lines.append(f"| {name} | " + " | ".join(cells) + f" | {own} |")
            lines += ["", "Against the original in PyTorch fp32:", "",
                      "| model | " + " | ".join(variants) + " |", "|---" * (len(variants) + 1) + "|"]
            for name in benched:
                cells = [_cell(run["rows"].get(f"{name} | {v}"), "paired_speedup") for v in variants]
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
            for warning in run.get("warnings", []):
                lines.append(f"- warning: {warning}")
            lines.append("")
    graphs = results.get("graphs", {})
    if graphs:
        lines += ["## Fidelity of int8 (all-MiniLM-L6-v2 models, 2,000 held-out Rotten Tomatoes texts)", "",
                  "| model | graph | mean cosine to its fp32 PyTorch | recall@10 |", "|---|---|---|---|"]
        for name, entry in graphs.get("bert", {}).items():
            for variant, found in (entry.get("fidelity") or {}).items():
                lines.append(f"| {name} | {variant} | {found['mean_cosine']:.4f} | {found['recall_at_10']:.3f} |")
        lines += ["", "## Operators after ONNX Runtime's offline optimisation (level extended)", "",
                  "| family | model | graph | fused attention layers (num_heads) | MultiHeadAttention | Softmax | "
                  "SkipLayerNormalization | LayerNormalization | BiasGelu | Gelu | FastGelu | MatMul | "
                  "int8 products |", "|---" * 13 + "|"]
        for family, models in graphs.items():
            for name, entry in models.items():
                fused = entry.get("fused_attention") or {}
                heads = f"{len(fused.get('layers', []))} ({'/'.join(map(str, fused.get('num_heads', [])))})"
                for variant, ops in entry["ops"].items():
                    int8 = sum(ops.get(k, 0) for k in ("MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QLinearMatMul",
                                                       "MatMulInteger"))
                    cells = [str(ops.get(k, 0)) for k in ("MultiHeadAttention", "Softmax", "SkipLayerNormalization",
                                                          "LayerNormalization", "BiasGelu", "Gelu", "FastGelu",
                                                          "MatMul")]
                    shown = heads if "unfused" not in variant else "-"
                    lines.append(f"| {family} | {name} | {variant} | {shown} | " + " | ".join(cells) + f" | {int8} |")
        lines.append("")
    prof = results.get("profile")
    if prof:
        lines += [f"## Where the time goes (ONNX Runtime profiler, {prof['threads']} thread, batch "
                  f"{prof['batch'][0]} x {prof['batch'][1]}, {prof['runs']} runs)", "",
                  "| graph | ms per batch | top operators (share of kernel time) |", "|---|---|---|"]
        for label, found in prof["graphs"].items():
            top = ", ".join(f"{k} {v:.0%}" for k, v in list(found["share"].items())[:6])
            lines.append(f"| {label.replace(' | ', ', ')} | {found['ms_per_batch']:.1f} | {top} |")
        lines.append("")
    RESULTS.with_suffix(".md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=("export", "time", "profile", "render"))
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "graph_speed")
    parser.add_argument("--families", type=lambda s: s.split(","), default=list(FAMILIES))
    parser.add_argument("--threads", dest="threads_list", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seq", type=int, default=50, help="tokens per sequence (real texts: ~50 when padded)")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    args.threads = args.threads_list[0]
    {"export": export_all, "time": time_all, "profile": profile, "render": render}[args.stage](args)


if __name__ == "__main__":
    main()
