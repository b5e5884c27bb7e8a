"""Head and FFN pruning of the real MiniLM-L6, benchmarked side by side against the original.

This is the README's main job done through the Python API: each variant is converted, saved with
``surgery.save_pretrained`` and loaded back with ``surgery.from_pretrained`` (the path the CLI
takes), then all of them are benchmarked in one process with interleaved rounds. It also measures
how far each variant's sentence embeddings move from the original's on real review snippets (the
model is a sentence-embedding model, so mean-pooled embeddings are its real output). The variants
are pruned by weight magnitude without data and without fine-tuning: this is a speed/size baseline,
not an accuracy result.

Writes ``docs/results/head_prune.json`` and the generated block of the head-prune section in
``docs/results.md``. Run from the repository root::

    python scripts/bench_head_prune.py            # about 2-3 minutes on one core
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

import surgery
from surgery.data.assets import resolve_model_path
from surgery.data.task_data import read_table
from surgery.measure.side_by_side import BenchReport, bench_models
from surgery.strategies import FFNPruningStrategy, HeadPruningStrategy

ROOT = Path(__file__).resolve().parent.parent
BASE = "minilm-l6"
BEGIN, END = "<!-- head-prune:begin -->", "<!-- head-prune:end -->"
README_BEGIN, README_END = "<!-- readme-bench:begin -->", "<!-- readme-bench:end -->"
README_VARIANT = "head-prune 0.5"  # what the README's main command builds


def variants(head_ratios: list[float], ffn_ratio: float) -> dict[str, surgery.Strategy]:
    """Name -> strategy for every pruned variant (magnitude importance: no data needed)."""
    out: dict[str, surgery.Strategy] = {f"head-prune {r:g}": HeadPruningStrategy(ratio=r) for r in head_ratios}
    out[f"ffn-prune {ffn_ratio:g}"] = FFNPruningStrategy(ratio=ffn_ratio)
    return out


def build(work: Path, strategies: dict[str, surgery.Strategy]) -> dict[str, Path]:
    """Convert the base model with each strategy and save it; returns name -> saved directory."""
    saved = {}
    for name, strategy in strategies.items():
        model = surgery.from_pretrained(BASE)
        surgery.convert(model, strategy)
        saved[name] = surgery.save_pretrained(model, work / name.replace(" ", "-"), overwrite=True)
    return saved


@torch.inference_mode()
def embeddings(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """Mean-pooled, L2-normalised sentence embeddings (how all-MiniLM-L6-v2 is meant to be used)."""
    model.eval()
    chunks = []
    for batch in batches:
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        chunks.append(torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1))
    return torch.cat(chunks)


def snippet_batches(count: int, batch_size: int = 32) -> list[dict[str, torch.Tensor]]:
    """The first ``count`` Rotten Tomatoes snippets (plots and duplicates dropped), tokenized."""
    texts = read_table("rotten-tomatoes")["text"][:count]
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(BASE))
    return [dict(tokenizer(texts[i:i + batch_size], padding=True, truncation=True, max_length=64,
                           return_tensors="pt")) for i in range(0, len(texts), batch_size)]


def git_state() -> dict[str, Any]:
    def run(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    return {"commit": run("rev-parse", "HEAD"), "dirty_files": run("status", "--porcelain", "--", "surgery",
                                                                    "strategies", "scripts").splitlines()}


def table(report: BenchReport, anatomy: dict[str, Any], fidelity: dict[str, Any]) -> str:
    """The markdown table of the results."""
    rows = ["| model | heads | FFN width | params (w/o emb.) | GFLOPs / batch | samples/s | latency p50 / p95 ms "
            "| speedup | paired speedup [IQR] | FLOP-bound speedup | realised | peak MB | embedding cosine |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios = {c.name: c for c in report.comparisons}
    for m in report.models:
        c = ratios.get(m.name)
        shape = anatomy[m.name]
        cos = fidelity["cosine"].get(m.name)
        rows.append(
            f"| {m.name} | {sum(shape['heads'])} | {sum(shape['ffn_width'])} "
            f"| {m.params.total / 1e6:.2f}M ({m.params.without_embeddings / 1e6:.2f}M) "
            f"| {m.flops_per_batch / 1e9:.1f} | {m.throughput:.1f} | {m.latency_p50_ms:.0f} / {m.latency_p95_ms:.0f} "
            + (f"| {c.speedup:.2f}x | {c.paired_speedup:.2f}x [{c.paired_speedup_iqr[0]:.2f}, "
               f"{c.paired_speedup_iqr[1]:.2f}] | {c.flop_bound_speedup:.2f}x | {c.fraction_of_flop_bound:.0%} " if c
               else "| 1.00x | - | 1.00x | - ")
            + f"| {m.peak_memory_bytes / 2**20:.0f} | "
            + (f"{cos['mean']:.3f} (min {cos['min']:.3f}) |" if cos else "1 |")
        )
    return "\n".join(rows)


def markdown(result: dict[str, Any], report: BenchReport) -> str:
    s = report.settings
    loads = f"{s.load_average_before:.1f} before, {s.load_average_after:.1f} after" if s.load_average_before else "n/a"
    lines = [
        f"Generated by `python {result['command']}` at commit `{result['git']['commit'][:10]}` "
        f"on {result['date']} ({result['seconds']:.0f} s); raw numbers in "
        "[`results/head_prune.json`](results/head_prune.json).",
        "",
        f"Setup: all-MiniLM-L6-v2 (`{BASE}`), {s.device}, torch {s.torch_version}, {s.threads} thread(s), "
        f"batch {s.batch_size} x {s.seq_len} tokens (no padding), {s.warmup} warm-up + {s.repeats} timed rounds, "
        f"interleaved with rotating order in one process. Machine: {s.cpu_count} CPUs shared with other jobs "
        f"(1-minute load average {loads}), so absolute throughput is lower than on an idle machine and varies "
        "between rounds; the ratios are the figures to read, the paired speedup (median of same-round ratios) "
        "most of all. \"Realised\" is the speedup as a fraction of the FLOP bound; it can exceed 100% because "
        "element-wise work (softmax, GELU), which the FLOP count leaves out, shrinks too. "
        "Variants are pruned by weight magnitude (no data) and **not fine-tuned**; "
        f"embedding cosine is the mean cosine similarity of mean-pooled sentence embeddings to the original on "
        f"{result['fidelity']['snippets']} Rotten Tomatoes snippets (1 = unchanged output).",
        "",
        table(report, result["anatomy"], result["fidelity"]),
        "",
    ]
    if report.warnings:
        lines += ["Warnings from the benchmark:", ""] + [f"- {w}" for w in report.warnings] + [""]
    return "\n".join(lines)


def readme_block(report: BenchReport) -> str:
    """The before/after table the README shows for its main command (original vs head-prune 0.5)."""
    before, after = report.model("original"), report.model(README_VARIANT)
    c = next(c for c in report.comparisons if c.name == README_VARIANT)
    rows = ["| | params (w/o emb.) | GFLOPs / batch | samples/s | latency p50 ms | peak MB |",
            "|---|---|---|---|---|---|"]
    for label, m in (("before: minilm-l6", before), (f"after: {README_VARIANT}", after)):
        rows.append(f"| {label} | {m.params.total / 1e6:.2f}M ({m.params.without_embeddings / 1e6:.2f}M) "
                    f"| {m.flops_per_batch / 1e9:.1f} | {m.throughput:.1f} | {m.latency_p50_ms:.0f} "
                    f"| {m.peak_memory_bytes / 2**20:.0f} |")
    s = report.settings
    return "\n".join([
        *rows, "",
        f"Speedup {c.speedup:.2f}x (paired per round: {c.paired_speedup:.2f}x, quartiles "
        f"{c.paired_speedup_iqr[0]:.2f}-{c.paired_speedup_iqr[1]:.2f}) against a FLOP bound of "
        f"{c.flop_bound_speedup:.2f}x; batch {s.batch_size} x {s.seq_len}, {s.threads} thread on a shared "
        f"{s.cpu_count}-CPU machine. Measured by `scripts/bench_head_prune.py`, which builds the same model through "
        "the Python API; all variants and the method are in [docs/results.md](docs/results.md).",
    ])


def write_block(path: Path, begin: str, end: str, block: str, heading: str | None = None) -> bool:
    """Replace the text between ``begin`` and ``end`` in ``path``, leaving everything else untouched.

    Without the markers, the block is appended under ``heading`` when one is given (else nothing is
    written). Returns whether the file was written.
    """
    text = path.read_text() if path.exists() else ""
    generated = f"{begin}\n{block}\n{end}"
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: generated, text, flags=re.S)
    elif heading is not None:
        text = (text.rstrip() + "\n\n" if text else "# Results\n\n") + f"{heading}\n\n{generated}\n"
    else:
        return False
    path.write_text(text)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-ratios", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    parser.add_argument("--ffn-ratio", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--snippets", type=int, default=256, help="review snippets for the embedding cosine")
    parser.add_argument("--work", type=Path, default=ROOT / "out" / "bench-head-prune")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "results" / "head_prune.json")
    parser.add_argument("--markdown", type=Path, default=ROOT / "docs" / "results.md")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md",
                        help="file whose readme-bench block gets the before/after table")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.time()
    git = git_state()  # the code this run imported, not whatever is committed by the time it ends

    saved = build(args.work, variants(args.head_ratios, args.ffn_ratio))
    # Reload every variant from disk, as `surgery bench DIR --against minilm-l6` does.
    models = {"original": surgery.from_pretrained(BASE)} | {n: surgery.from_pretrained(p) for n, p in saved.items()}
    anatomy = {name: {"heads": [layer.heads for layer in surgery.inspect(m).layers],
                      "ffn_width": [layer.ffn_width for layer in surgery.inspect(m).layers],
                      "steps": [step.model_dump() for step in surgery.inspect(m).steps]}
               for name, m in models.items()}
    batches = snippet_batches(args.snippets)
    reference = embeddings(models["original"], batches)
    cosine = {}
    for name, model in list(models.items())[1:]:
        sims = (embeddings(model, batches) * reference).sum(-1)
        cosine[name] = {"mean": float(sims.mean()), "min": float(sims.min())}

    report = bench_models(models, batch_size=args.batch_size, seq_len=args.seq_len, repeats=args.repeats,
                          warmup=args.warmup, threads=args.threads)
    argv_shown = " ".join(["scripts/bench_head_prune.py", *(argv if argv is not None else sys.argv[1:])])
    result = {
        "command": argv_shown.strip(),
        "date": time.strftime("%Y-%m-%d"),
        "seconds": time.time() - start,
        "git": git,
        "anatomy": anatomy,
        "fidelity": {"snippets": args.snippets, "cosine": cosine},
        "bench": report.model_dump(mode="json"),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    write_block(args.markdown, BEGIN, END, markdown(result, report), heading="## Head and FFN pruning of MiniLM-L6")
    if args.readme is not None and any(m.name == README_VARIANT for m in report.models):
        write_block(args.readme, README_BEGIN, README_END, readme_block(report))
    print(table(report, anatomy, result["fidelity"]))
    for warning in report.warnings:
        print("warning:", warning)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
