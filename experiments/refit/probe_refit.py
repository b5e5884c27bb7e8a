"""What the least-squares refit alone recovers, before any training: MiniLM-L6 embeddings after head+FFN pruning.

Prunes heads and FFN neurons of all-MiniLM-L6-v2 at ``--ratio`` (gradient importance, as
``experiments/embeddings/bench_embed.py`` does), then compares on held-out texts, against the unpruned model: the pruned
model as cut, and the same model after :func:`surgery.training.refit.refit_projections` at each
``--ridge``. No training runs, so this isolates the refit. Writes ``experiments/refit/results/refit_probe.json``.

    python experiments/refit/probe_refit.py --ratio 0.48 --ridge 1e-3 1e-2
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

import surgery
from surgery.embedding import load_text_data, read_sentence_config
from surgery.embedding.evaluate import TeacherCache, evaluate_embeddings
from surgery.persist.assets import resolve_model_path
from surgery.strategies.pruning.ffn_prune import FFNPruningStrategy
from surgery.strategies.pruning.head_prune import HeadPruningStrategy
from surgery.training.refit import refit_projections, task_calibration_batches

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
from experiments.embedding_suite import corpus_texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ratio", type=float, default=0.48, help="fraction of heads and of FFN neurons removed")
    parser.add_argument("--ridge", type=float, nargs="+", default=[1e-3, 1e-2])
    parser.add_argument("--calibration-batches", type=int, default=32, help="training batches of 32 texts")
    parser.add_argument("--train-texts", type=int, default=4000)
    parser.add_argument("--held-out", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("experiments/refit/results/refit_probe.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    path = resolve_model_path("minilm-l6")
    tokenizer = AutoTokenizer.from_pretrained(path)
    sentence = read_sentence_config(path)
    assert sentence is not None
    pool = corpus_texts()
    random.Random(0).shuffle(pool)
    held_out, train = pool[: args.held_out], pool[2000: 2000 + args.train_texts]  # bench_embed's held-out split
    data = load_text_data(train, tokenizer, eval_data=held_out, max_length=64, seed=0, batch_size=32)
    data.sentence_config = sentence
    teacher = surgery.from_pretrained(path).eval()
    cache = TeacherCache(teacher, tokenizer, sentence, max_length=128)

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        report = evaluate_embeddings(model, cache, tokenizer, held_out, sentence, max_length=128)
        return {"mean_cosine": report.mean_cosine, "recall_at_10": report.recall_at_k}

    pruned = copy.deepcopy(teacher)
    for p in pruned.parameters():  # gradient importance needs gradients; the teacher stays frozen
        p.requires_grad_(True)
    for strategy in (HeadPruningStrategy(ratio=args.ratio, importance="gradient", max_batches=8),
                     FFNPruningStrategy(ratio=args.ratio, importance="gradient", max_batches=8)):
        surgery.convert(pruned, strategy, data=data)
    results: dict[str, object] = {
        "setup": {"model": "all-MiniLM-L6-v2", "ratio": args.ratio, "importance": "gradient",
                  "calibration_batches": args.calibration_batches, "train_texts": len(train),
                  "held_out_texts": len(held_out), "threads": args.threads},
        "pruned": evaluate(pruned), "refit": {}}
    print("pruned", results["pruned"], flush=True)
    batches = task_calibration_batches(data, args.calibration_batches, batch_size=32)
    for ridge in args.ridge:
        model = copy.deepcopy(pruned)
        start = time.perf_counter()
        fit = refit_projections(model, teacher, batches, ridge=ridge)
        entry = {**evaluate(model), "seconds": time.perf_counter() - start, "tokens": fit.tokens,
                 "error": fit.error}
        results["refit"][str(ridge)] = entry  # type: ignore[index]
        print("ridge", ridge, {k: entry[k] for k in ("mean_cosine", "recall_at_10", "seconds")}, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
