"""Deploy study: SHRP MiniLM-L6 exported to ONNX (fp32 and int8) against the original, side by side.

Needs the SHRP model of the README recipe (``bash scripts/demo.sh`` writes ``out/minilm-shrp``) and the
``onnx`` extra. In one process, with interleaved rounds and the same thread count for torch and ONNX
Runtime, it benchmarks the original all-MiniLM-L6-v2 and the SHRP model, each in PyTorch fp32, ONNX
Runtime fp32 and ONNX Runtime int8 (dynamic quantization), measures the accuracy of every classifier
row on the held-out Rotten Tomatoes split, times the export of a bert-base-sized model, writes
``docs/results/deploy.json`` and renders the ``deploy`` section of ``docs/results.md``.

    python scripts/bench_deploy.py [--shrp out/minilm-shrp] [--threads 1] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch
from transformers import BertConfig, BertModel

from surgery.deploy import export_onnx
from surgery.deploy.runtime_bench import bench_runtimes, runtime_label
from surgery.persist.model_io import from_pretrained

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "docs" / "results" / "deploy.json"
PAGE = ROOT / "docs" / "results.md"
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
    from surgery.data.assets import resolve_model_path
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

    from surgery.data.assets import resolve_model_path
    from surgery.data.task_data import load_task_data

    shrp = build_standin(ROOT / "out" / "minilm-shrp-standin") if args.standin else resolve_model_path(args.shrp)
    tokenizer = AutoTokenizer.from_pretrained(shrp)
    # An untrained stand-in has no accuracy worth measuring; the held-out split is read only for a trained model.
    data = None if args.standin else load_task_data("rotten-tomatoes", tokenizer, max_length=64, seed=0)
    started = time.perf_counter()
    export = export_onnx(from_pretrained(shrp), Path(tempfile.mkdtemp()) / "shrp-int8", tokenizer=tokenizer,
                         int8=True, optimize=True, data=data and data.loader("eval"), threads=args.threads)
    report = bench_runtimes(["minilm-l6", shrp], names=["original", "shrp"], runtimes=["torch", "onnxruntime"],
                            int8=True, data=data and data.loader("eval"), threads=args.threads, batch_size=32,
                            seq_len=64, repeats=args.repeats, warmup=args.warmup)
    bench = report.model_dump(mode="json")
    models = {m["name"]: m for m in bench["models"]}
    ref = runtime_label("original", "torch")
    shrp_torch = runtime_label("shrp", "torch")
    composed = runtime_label("shrp", "onnxruntime", int8=True)
    original_int8 = runtime_label("original", "onnxruntime", int8=True)
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


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def render(data: dict[str, Any]) -> str:
    """The markdown between the ``deploy`` markers of docs/results.md."""
    bench, head, s = data["bench"], data["headline"], data["bench"]["settings"]
    trained = data["setup"].get("trained", True)
    comps = {c["name"]: c for c in bench["comparisons"]}
    lines = [
        f"Generated by `python scripts/bench_deploy.py` at commit `{data['generated']['commit']}` on "
        f"{data['generated']['date']}; raw numbers in [`results/deploy.json`](results/deploy.json).",
        "",
        f"Setup: all-MiniLM-L6-v2 (`minilm-l6`) and the README's SHRP recipe (3 of 6 layers single-head, "
        f"`{data['setup']['shrp']}`), batch {s['batch_size']} x {s['seq_len']} tokens, {s['threads']} thread(s) for "
        f"torch and ONNX Runtime alike, {s['repeats']} interleaved rounds after {s['warmup']} warm-up in one process, "
        f"torch {s['torch_version']}; load average {s['load_average_before']:.1f} before / "
        f"{s['load_average_after']:.1f} after on {s['cpu_count']} shared CPUs. "
        + (f"Accuracy on the {data['setup']['eval_size']} held-out Rotten Tomatoes snippets (the original encoder "
           "has no trained head, so no accuracy). " if trained else "**Speed only**: the SHRP row is the recipe's "
           "structure (top 3 layers Expert Attention, Top-1 pruned) without its training, which has the same "
           "shapes and operators as the trained model; accuracy is not reported. ")
        # Exports before int8_per_channel was recorded were per tensor (the only granularity then).
        + "int8 = ONNX Runtime dynamic quantization (int8 weights with one scale per "
        + ("output channel" if data["export"].get("int8_per_channel") else "tensor")
        + ", per-batch activation scales). Size = ONNX file or torch parameter bytes.",
        "",
        "| model | runtime | samples/s | latency p50 / p95 ms | speedup (paired [IQR]) | size MB | accuracy % |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in bench["models"]:
        c = comps.get(m["name"])
        speed = "1.00x" if c is None else (f"{c['paired_speedup']:.2f}x [{c['paired_speedup_iqr'][0]:.2f}, "
                                           f"{c['paired_speedup_iqr'][1]:.2f}]")
        acc = "-" if m["accuracy"] is None or not trained else f"{100 * m['accuracy']:.1f}"
        name, runtime = m["name"].split(" [")
        lines.append(f"| {name} | {runtime.rstrip(']')} | {m['throughput']:.1f} | {m['latency_p50_ms']:.0f} / "
                     f"{m['latency_p95_ms']:.0f} | {speed} | {m['weights_bytes'] / 1e6:.1f} | {acc} |")
    t, base = data["targets"], data["bert_base_export"]
    fp32, int8, share = head["speedup_vs_original_fp32"], head["speedup_vs_original_int8"], head["accuracy_share"]
    seconds, drift = base["export_seconds"], data["export"]["int8_drift"]
    fp32_ok, int8_ok = fp32["median"] >= t["speedup_vs_original_fp32"], int8["median"] >= t["speedup_vs_original_int8"]
    share_cell = (f"{share:.1%} | {_verdict(share >= t['accuracy_share'])}" if trained else
                  "not measured: this run used SHRP's structure without its training (`--standin`) |")
    lines += [
        "",
        "| target (issue 9) | reached | |",
        "|---|---|---|",
        f"| SHRP int8 in ORT vs original fp32 PyTorch, >= {t['speedup_vs_original_fp32']}x | {fp32['median']:.2f}x "
        f"(paired, IQR {fp32['q1']:.2f}-{fp32['q3']:.2f}) | {_verdict(fp32_ok)} |",
        f"| ... at >= {t['accuracy_share']:.0%} of the fp32 PyTorch SHRP accuracy | {share_cell} |",
        f"| SHRP int8 vs original int8 (both ORT), >= {t['speedup_vs_original_int8']}x | {int8['median']:.2f}x (IQR "
        f"{int8['q1']:.2f}-{int8['q3']:.2f}) | {_verdict(int8_ok)} |",
        f"| export of a bert-base-sized model ({base['params'] / 1e6:.0f}M parameters) < "
        f"{t['bert_base_export_seconds']:.0f} s | {seconds:.0f} s (with the parity check "
        f"{base['total_seconds_with_parity']:.0f} s) | {_verdict(seconds < t['bert_base_export_seconds'])} |",
        "",
        f"The SHRP export itself: fp32 parity {data['export']['parity']['max_abs_diff']:.1e} (max abs), int8 drift "
        f"{drift['max_abs_diff']:.2e} (min cosine {drift['min_cosine']:.4f}).",
    ]
    ops = data["export"].get("optimized") or {}
    if ops:
        lines += ["", "Operators of that graph after `--optimize` (ONNX Runtime, extended level): "
                  + ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])) + "."]
    if bench["warnings"]:
        lines += ["", "Warnings from the benchmark:", ""] + [f"- {w}" for w in bench["warnings"]]
    return "\n".join(lines) + "\n"


def write_page(data: dict[str, Any]) -> None:
    page = PAGE.read_text()
    block = f"<!-- deploy:begin -->\n{render(data)}<!-- deploy:end -->"
    pattern = re.compile(r"<!-- deploy:begin -->.*?<!-- deploy:end -->", re.S)
    if pattern.search(page):
        page = pattern.sub(lambda _: block, page)
    else:
        page = page.rstrip("\n") + "\n\n## Deploy: ONNX Runtime and int8\n\nIssue 9 ([deploy.md](deploy.md)): " \
            "the SHRP model exported to ONNX and quantized to int8, against the original in PyTorch and in ONNX " \
            "Runtime.\n\n" + block + "\n"
    PAGE.write_text(page)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shrp", default="out/minilm-shrp", help="the SHRP model directory (scripts/demo.sh)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--standin", action="store_true",
                        help="measure speed on SHRP's structure without its training (accuracy not reported)")
    parser.add_argument("--render-only", action="store_true", help="re-render docs/results.md from the JSON")
    args = parser.parse_args()
    if args.render_only:
        data = json.loads(RESULT.read_text())
    else:
        data = measure(args)
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(json.dumps(data, indent=2) + "\n")
    write_page(data)
    print(render(data))


if __name__ == "__main__":
    main()
