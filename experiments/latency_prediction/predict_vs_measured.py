"""Does the latency table predict a cut model's speedup within 5% of the speedup measured side by side?

For MiniLM-L6 (the embedded all-MiniLM-L6-v2) and a random 12-layer encoder at BERT-base widths, this
measures the latency table (:func:`surgery.compress.latency_measure.measure_latency_table`), cuts the
model to several structures (uniform and uneven heads and FFN widths, widths off the table's grid,
dropped layers), predicts each one's speedup from the table, and times all of them against the
original side by side in one interleaved benchmark (:func:`surgery.measure.timing.time_models`,
the one timing routine, which ``measured_speedups`` uses too). With ``onnxruntime-int8`` the same is
done for the smoothed int8 graphs, against the int8 original and against PyTorch fp32 (the table times the original in
PyTorch in its own rounds: ``reference_runtime``)::

    nice python experiments/latency_prediction/predict_vs_measured.py --threads 1
    nice python experiments/latency_prediction/predict_vs_measured.py --threads 1 --models minilm \\
        --runtime onnxruntime-int8 --tag int8
    python experiments/latency_prediction/predict_vs_measured.py --models minilm --runtime openvino-int8 \\
        --recipes shallow --repeats 20 --tag openvino-int8-shallow

Writes ``results[-TAG].json`` and ``results[-TAG].md`` (with the machine and the load average) here.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

import surgery
from surgery.anatomy import adapter_for
from surgery.compress.latency_measure import measure_latency_table, runtime_model
from surgery.compress.latency_table import LatencyTable
from surgery.compress.structure import LayerShape, Structure
from surgery.measure.machine import machine_info
from surgery.measure.timing import make_inputs, time_models

HERE = Path(__file__).resolve().parent / "results"
TARGET = 0.05

# Per structure, from (layers, heads, width): one LayerShape or None per layer. Fractions of the full
# sizes cycle over the layers, so the same structures apply to 6 and 12 layers.
Recipe = Callable[[int, int, int], list[LayerShape | None]]


def _cycle(n: int, heads: int, width: int, head_fractions: list[float], width_fractions: list[float],
           drop_every: int | None = None) -> list[LayerShape | None]:
    layers: list[LayerShape | None] = []
    for i in range(n):
        if drop_every and i % drop_every == drop_every - 1:
            layers.append(None)
            continue
        hf, wf = head_fractions[i % len(head_fractions)], width_fractions[i % len(width_fractions)]
        layers.append(LayerShape(max(1, round(heads * hf)), round(width * wf)))
    return layers


RECIPES: dict[str, Recipe] = {
    "heads 1/2": lambda n, h, w: _cycle(n, h, w, [0.5], [1.0]),
    "ffn 1/2": lambda n, h, w: _cycle(n, h, w, [1.0], [0.5]),
    "off-grid heads 7/12, ffn 0.65": lambda n, h, w: _cycle(n, h, w, [7 / 12], [0.65]),
    "uneven heads and ffn": lambda n, h, w: _cycle(n, h, w, [1.0, 0.75, 0.5, 0.25, 0.67, 0.33],
                                                   [0.9, 0.6, 0.3, 0.45, 0.15, 0.75]),
    "drop every 3rd layer": lambda n, h, w: _cycle(n, h, w, [1.0], [1.0], drop_every=3),
    "drop every 2nd, rest uneven": lambda n, h, w: _cycle(n, h, w, [0.75, 0.5, 1.0], [0.5, 0.35, 0.7],
                                                          drop_every=2),
    "about 4x: small uneven, drop every 3rd": lambda n, h, w: _cycle(n, h, w, [0.25, 0.5, 0.17, 0.33],
                                                                     [0.1, 0.2, 0.15, 0.25], drop_every=3),
}

# Shallow cuts, the structures a 6x embedding target or a --max-drop path point on a fast int8 runtime asks
# for (10-30% of the time taken off): a head or two, FFN widths just below the full one, on and off 64.
SHALLOW: dict[str, Recipe] = {
    "heads 11/12": lambda n, h, w: _cycle(n, h, w, [11 / 12], [1.0]),
    "heads 10/12": lambda n, h, w: _cycle(n, h, w, [10 / 12], [1.0]),
    "ffn 0.9 (off 64)": lambda n, h, w: _cycle(n, h, w, [1.0], [0.9]),
    "ffn 11/12 (a multiple of 64)": lambda n, h, w: _cycle(n, h, w, [1.0], [11 / 12]),
    "ffn 3/4": lambda n, h, w: _cycle(n, h, w, [1.0], [0.75]),
    "heads 10/12, ffn 0.85": lambda n, h, w: _cycle(n, h, w, [10 / 12], [0.85]),
    "shallow uneven": lambda n, h, w: _cycle(n, h, w, [1.0, 11 / 12, 10 / 12, 1.0, 0.75, 11 / 12],
                                             [1.0, 0.91, 0.85, 0.97, 0.78, 0.94]),
    "heads 1/2": RECIPES["heads 1/2"],
}
RECIPE_SETS = {"default": RECIPES, "shallow": SHALLOW}


def cut_to(model: nn.Module, structure: Structure) -> nn.Module:
    """A copy of ``model`` with layer ``i`` cut to ``structure.layers[i]`` (its first heads and neurons)."""
    cut = copy.deepcopy(model)
    adapter = adapter_for(cut)
    for index, shape in enumerate(structure.layers):
        if shape is not None:
            adapter.keep_heads(index, range(shape.heads))
            adapter.keep_neurons(index, range(shape.ffn_width))
    layers = adapter.layers()
    for index in reversed(structure.removed):
        del layers[index]
    assert Structure.from_model(cut).kept == structure.kept
    return cut.eval()


def load_model(name: str) -> nn.Module:
    if name == "minilm":
        return surgery.from_pretrained("minilm-l6").eval()
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=1000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                     intermediate_size=3072, max_position_embeddings=512)
    return transformers.BertModel(config).eval()


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    model = load_model(name)
    batch = args.batch_size if name == "minilm" else args.big_batch_size
    shape = dict(batch_size=batch, seq_len=args.seq_len, threads=args.threads)
    original = Structure.from_model(model)
    n, heads, width = len(original.layers), original.kept[0].heads, original.kept[0].ffn_width
    structures = {label: Structure(tuple(recipe(n, heads, width)))
                  for label, recipe in RECIPE_SETS[args.recipes].items()}
    runtime = args.runtime
    say(f"{name}: latency table, {runtime}, batch {batch} x {args.seq_len}, {args.threads} thread(s)")
    # The original in PyTorch is timed in the table's own rounds, so the speedup over it needs no second table.
    table = measure_latency_table(model, runtime=runtime, cache=False, repeats=args.table_repeats,
                                  reference_runtime="torch", **shape)
    tables: dict[str, LatencyTable] = {runtime: table}
    say(f"{name}: {runtime} table in {table.measured['seconds']:.0f} s")
    cuts = {label: cut_to(model, s) for label, s in structures.items()}
    target = args.runtime
    work = Path(tempfile.mkdtemp(prefix="predict-"))
    entries: dict[str, nn.Module] = {"original [torch]": model}
    if target != "torch":
        entries[f"original [{target}]"] = runtime_model(model, target, work / "original", threads=args.threads)
    entries.update({f"{label} [{target}]": runtime_model(cut, target, work / label, threads=args.threads)
                    for label, cut in cuts.items()})
    say(f"{name}: side by side, {len(entries)} models, {args.repeats} rounds")
    started = time.perf_counter()
    inputs = make_inputs(int(model.config.vocab_size), batch_size=batch, seq_len=args.seq_len)
    report = time_models(entries, [inputs], repeats=args.repeats, warmup=2, threads=args.threads)
    bench_seconds = time.perf_counter() - started
    rows = []
    for label, structure in structures.items():
        measured, interval = report.speedup(f"{label} [{target}]")
        predicted = table.speedup(structure, original)
        row = {"structure": label, "layers": structure.to_json(), "predicted": predicted,
               "measured": measured, "measured_ci95": (interval.low, interval.high),
               "error": predicted / measured - 1}
        if target != "torch":  # against the same runtime's original: the table's own model, no reference
            own = report.speedup(f"original [{target}]")[0]
            row.update({"predicted_vs_own_original": table.predict_ms(original) / table.predict_ms(structure),
                        "measured_vs_own_original": measured / own})
            row["error_vs_own_original"] = row["predicted_vs_own_original"] / row["measured_vs_own_original"] - 1
        rows.append(row)
        say(f"{name} {label}: predicted {predicted:.3f}x, measured {measured:.3f}x "
            f"({row['error']:+.1%})")
    return {"model": name, "runtime": target, **shape, "tables": {k: t.model_dump(mode="json") for k, t in
                                                                  tables.items()},
            "rows": rows, "bench_seconds": bench_seconds,
            "bench_settings": {"repeats": report.repeats, "warmup": report.warmup, "threads": report.threads,
                               "load_average": report.load_average}}


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [f"# Latency table: predicted against measured speedup ({results['runtime']})", "",
             f"Machine: {m['cpu_model']} (vendor {m['vendor']}, family/model {m['cpu_family']}, {m['arch']}, "
             f"{m['usable_cpus']} CPUs, hypervisor: {m['hypervisor']}); flags: {', '.join(m['flags'])}; "
             f"torch {m['torch_version']} ({m['torch_cpu_capability']} kernels), onnxruntime "
             f"{m['onnxruntime_version']}; fingerprint `{results['fingerprint']}`.", "",
             f"Load average (1 min) before / after: {results['load_before']:.1f} / {results['load_after']:.1f} on "
             f"{m['usable_cpus']} CPUs (other jobs beside it show in it). Target: prediction within "
             f"{TARGET:.0%} of the measured paired speedup.", ""]
    for part in results["models"]:
        own = part["runtime"] != "torch"
        lines += [f"## {part['model']}: batch {part['batch_size']} x {part['seq_len']}, {part['threads']} "
                  f"thread(s), {part['runtime']}", ""]
        for runtime, table in part["tables"].items():
            meas = table["measured"]
            reference = (f", the original in {table['reference_runtime']} {table['reference_ms']:.1f} ms"
                         if table.get("reference_ms") is not None else "")
            lines.append(f"- {runtime} table: {meas['seconds']:.0f} s; base {table['base_ms']:.1f} ms, model "
                         f"{meas['model_ms']:.1f} ms{reference}, layer scale {meas['scale']:.3f}, FFN block "
                         f"{table.get('ffn_step', 1)}, load {meas['load_average'][0]:.1f}/"
                         f"{meas['load_average'][1]:.1f}")
        lines.append(f"- side-by-side benchmark: {part['bench_settings']['repeats']} rounds, "
                     f"{part['bench_seconds']:.0f} s")
        lines.append("")
        head = "| structure | predicted | measured [95% CI] | error | within 5% | inside the CI |"
        if own:
            head += f" predicted vs {part['runtime']} original | measured | error |"
        lines += [head, "|" + "---|" * (head.count("|") - 1)]
        for row in part["rows"]:
            low, high = row["measured_ci95"]
            line = (f"| {row['structure']} | {row['predicted']:.2f}x | {row['measured']:.2f}x [{low:.2f}-{high:.2f}] "
                    f"| {row['error']:+.1%} | {'yes' if abs(row['error']) <= TARGET else 'no'} | "
                    f"{'yes' if low <= row['predicted'] <= high else 'no'} |")
            if own:
                line += (f" {row['predicted_vs_own_original']:.2f}x | {row['measured_vs_own_original']:.2f}x | "
                         f"{row['error_vs_own_original']:+.1%} |")
            lines.append(line)
        errors = [abs(r["error"]) for r in part["rows"]]
        lines += ["", f"{sum(e <= TARGET for e in errors)} of {len(errors)} within {TARGET:.0%}; largest miss "
                  f"{max(errors):.1%}, mean absolute error {sum(errors) / len(errors):.1%}.", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["minilm", "bert-base-width"],
                        choices=["minilm", "bert-base-width"])
    parser.add_argument("--runtime", default="torch", help="a registered runtime (surgery export --runtime list)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32, help="MiniLM's batch")
    parser.add_argument("--big-batch-size", type=int, default=8, help="the 12-layer model's batch (time)")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=15, help="side-by-side rounds")
    parser.add_argument("--table-repeats", type=int, default=9)
    parser.add_argument("--recipes", default="default", choices=sorted(RECIPE_SETS),
                        help="which structures: the default set, or shallow cuts (10-30%% of the time)")
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument("--render", action="store_true", help="only rewrite the .md from the tag's .json")
    args = parser.parse_args()
    stem = "results" + (f"-{args.tag}" if args.tag else "")
    if args.render:
        (HERE / f"{stem}.md").write_text(markdown(json.loads((HERE / f"{stem}.json").read_text())))
        return
    info = machine_info()
    load_before = os.getloadavg()[0]
    parts = [run_model(name, args) for name in args.models]
    results = {"runtime": args.runtime, "machine": info.model_dump(mode="json"), "fingerprint": info.fingerprint,
               "load_before": load_before, "load_after": os.getloadavg()[0], "args": vars(args), "models": parts}
    (HERE / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    (HERE / f"{stem}.md").write_text(markdown(results))
    say(f"wrote {HERE / stem}.json and .md")


if __name__ == "__main__":
    main()
