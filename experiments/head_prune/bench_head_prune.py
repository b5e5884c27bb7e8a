"""Head and FFN pruning of the real MiniLM-L6, benchmarked side by side against the original.

This is the README's main job done through the Python API: each variant is converted, saved with
``surgery.save_pretrained`` and loaded back with ``surgery.from_pretrained`` (the path the CLI
takes), then all of them are benchmarked in one process with interleaved rounds. It also measures
how far each variant's sentence embeddings move from the original's on real review snippets (the
model is a sentence-embedding model, so mean-pooled embeddings are its real output). The variants
are pruned by weight magnitude without data and without fine-tuning: this is a speed/size baseline,
not an accuracy result.

Writes ``experiments/head_prune/results/head_prune.json``; ``experiments/render.py`` (run at the end)
renders it into ``docs/results.md`` and the README's before/after table. Run from the repository root::

    python experiments/head_prune/bench_head_prune.py            # about 2-3 minutes on one core
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

import surgery
from surgery.data.task_data import read_table
from surgery.measure.bench import bench_models
from surgery.persist.assets import resolve_model_path
from surgery.strategies import FFNPruningStrategy, HeadPruningStrategy

ROOT = Path(__file__).resolve().parents[2]  # experiments/<study>/<script>.py
BASE = "minilm-l6"


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
    parser.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "head_prune.json")
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
    argv_shown = " ".join(["experiments/head_prune/bench_head_prune.py", *(argv if argv is not None else sys.argv[1:])])
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
    # The one renderer writes the page section and the README table from the JSON just written.
    subprocess.run([sys.executable, str(ROOT / "experiments" / "render.py")], check=True)
    for warning in report.warnings:
        print("warning:", warning)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
