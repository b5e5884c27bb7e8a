"""Deploy study: SHRP MiniLM-L6 exported to ONNX (fp32 and int8) against the original, side by side.

Needs the SHRP model of the README recipe (``bash scripts/demo.sh`` writes ``out/minilm-shrp``) and the
``onnx`` extra. In one process, with interleaved rounds and the same thread count for torch and ONNX
Runtime, it benchmarks the original all-MiniLM-L6-v2 and the SHRP model, each in PyTorch fp32, ONNX
Runtime fp32 and ONNX Runtime int8 (dynamic quantization), measures the accuracy of every classifier
row on the held-out Rotten Tomatoes split, times the export of a bert-base-sized model, writes
``experiments/deploy/results/deploy.json`` and runs ``experiments/render.py``, which renders it into
the ``deploy`` section of ``docs/results.md``.

    python experiments/deploy/bench_deploy.py [--shrp out/minilm-shrp] [--threads 1] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch
from transformers import BertConfig, BertModel

from surgery.persist.model_io import from_pretrained
from surgery.runtimes.onnx import export_onnx
from surgery.runtimes.runtime_bench import bench_runtimes, runtime_label

ROOT = Path(__file__).resolve().parents[2]  # experiments/<study>/<script>.py
RESULT = ROOT / "experiments" / "deploy" / "results" / "deploy.json"
TARGETS = {"speedup_vs_original_fp32": 3.5, "accuracy_share": 0.98, "speedup_vs_original_int8": 1.7,
           "bert_base_export_seconds": 60.0}


def paired(models: dict[str, Any], name: str, reference: str) -> dict[str, float]:
    """Median and quartiles of the same-round throughput ratios of ``name`` over ``reference``."""
    ratios = [a / b for a, b in zip(models[name]["throughput_rounds"], models[reference]["throughput_rounds"],
                                    strict=True)]
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return {"median": median, "q1": q1, "q3": q3}


def bert_base_export(threads: int) -> dict[str, Any]:
    """Export a randomly initialised bert-base-sized encoder (110M parameters) and time it."""
    torch.manual_seed(0)
    model = BertModel(BertConfig()).eval()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        report = export_onnx(model, Path(tmp) / "onnx", threads=threads)
        total = time.perf_counter() - start
    return {"params": sum(p.numel() for p in model.parameters()), "export_seconds": report.export_seconds,
            "total_seconds_with_parity": total, "parity_max_abs_diff": report.parity.max_abs_diff,
            "onnx_bytes": report.onnx_bytes}


def build_standin(out: Path) -> Path:
    """SHRP's end structure without its training: top 3 of 6 layers Expert Attention, Top-1 pruned by usage.

    Same shapes and operators as the README recipe's model, hence the same speed; its accuracy is that
    of an untrained head and is not reported as a result.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    import surgery
    from surgery.persist.assets import resolve_model_path
    from surgery.strategies import ExpertAttentionStrategy, Top1PruningStrategy

    source = resolve_model_path("minilm-l6")
    tokenizer = AutoTokenizer.from_pretrained(source)
    torch.manual_seed(0)
    model = surgery.from_pretrained(source, model_class=AutoModelForSequenceClassification, allow_new_head=True,
                                     num_labels=2)
    surgery.convert(model, ExpertAttentionStrategy(layers=[3, 4, 5]))
    batch = tokenizer(["a quiet film", "terrible", "an uneven but often funny comedy"], padding=True,
                      return_tensors="pt")
    surgery.convert(model, Top1PruningStrategy(keep=1), data=[dict(batch)])
    return surgery.save_pretrained(model, out, tokenizer=tokenizer, overwrite=True)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from surgery.data.task_data import load_task_data
    from surgery.persist.assets import resolve_model_path

    shrp = build_standin(ROOT / "out" / "minilm-shrp-standin") if args.standin else resolve_model_path(args.shrp)
    tokenizer = AutoTokenizer.from_pretrained(shrp)
    # An untrained stand-in has no accuracy worth measuring; the held-out split is read only for a trained model.
    data = None if args.standin else load_task_data("rotten-tomatoes", tokenizer, max_length=64, seed=0)
    started = time.perf_counter()
    export = export_onnx(from_pretrained(shrp), Path(tempfile.mkdtemp()) / "shrp-int8", tokenizer=tokenizer,
                         int8=True, optimize=True, data=data and data.loader("eval"), threads=args.threads)
    report = bench_runtimes(["minilm-l6", shrp], names=["original", "shrp"],
                            runtimes=["torch", "onnxruntime", "onnxruntime-int8"], data=data and data.loader("eval"),
                            threads=args.threads, batch_size=32, seq_len=64, repeats=args.repeats, warmup=args.warmup)
    bench = report.model_dump(mode="json")
    models = {m["name"]: m for m in bench["models"]}
    ref = runtime_label("original", "torch")
    shrp_torch = runtime_label("shrp", "torch")
    composed = runtime_label("shrp", "onnxruntime-int8")
    original_int8 = runtime_label("original", "onnxruntime-int8")
    accuracy_share = None if data is None else models[composed]["accuracy"] / models[shrp_torch]["accuracy"]
    headline = {
        "speedup_vs_original_fp32": paired(models, composed, ref),
        "speedup_vs_original_int8": paired(models, composed, original_int8),
        "original_int8_vs_original_fp32": paired(models, original_int8, ref),
        "shrp_torch_vs_original_fp32": paired(models, shrp_torch, ref),
        "accuracy_share": accuracy_share,
    }
    return {
        "generated": {"date": date.today().isoformat(), "commit": _commit(),
                      "seconds": round(time.perf_counter() - started, 1)},
        "setup": {"shrp": str(shrp.relative_to(ROOT) if shrp.is_relative_to(ROOT) else shrp),
                  "trained": not args.standin, "threads": args.threads,
                  "eval_size": None if data is None else data.info["eval_size"],
                  "repeats": args.repeats, "warmup": args.warmup},
        "export": export.model_dump(mode="json"),
        "bench": bench,
        "headline": headline,
        "bert_base_export": bert_base_export(args.threads),
        "targets": TARGETS,
    }


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shrp", default="out/minilm-shrp", help="the SHRP model directory (scripts/demo.sh)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--standin", action="store_true",
                        help="measure speed on SHRP's structure without its training (accuracy not reported)")
    args = parser.parse_args()
    data = measure(args)
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(data, indent=2) + "\n")
    subprocess.run([sys.executable, str(ROOT / "experiments" / "render.py")], check=True)


if __name__ == "__main__":
    main()
