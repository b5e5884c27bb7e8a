"""int8 on all-MiniLM-L6-v2: one weight scale per tensor or per output channel, and mixed precision.

ONNX Runtime's dynamic quantization (``surgery export --int8``) quantizes every constant MatMul
weight to int8. With one scale per weight tensor, a few large weights set the scale of the whole
matrix and the rest lose precision; with one scale per output channel each column keeps its own
range. Mixed precision keeps the products of some parts of every layer (``--int8-fp32 ffn-down``,
``ffn``) in fp32. This script exports the unchanged teacher once in fp32, quantizes that graph each
way, and measures, in one process:

* embedding fidelity against the fp32 PyTorch teacher on the held-out texts of ``bench_embed.py``
  (same seeded split): mean cosine, recall@10 of nearest neighbours, linear probes;
* speed: PyTorch fp32, ONNX Runtime fp32 and every int8 graph, interleaved rounds, paired ratios
  against PyTorch fp32.

    python experiments/int8/probe_int8_granularity.py --out experiments/int8/results/int8_granularity.json
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

import torch
from transformers import AutoTokenizer

import surgery
from surgery.embedding import TeacherCache, evaluate_embeddings, read_sentence_config
from surgery.measure.bench import bench_models
from surgery.persist.assets import resolve_model_path
from surgery.runtimes.onnx import export_onnx
from surgery.runtimes.onnx.onnx_export import int8_fp32_scopes
from surgery.runtimes.onnx.onnx_session import BenchedOnnxModel, OnnxRuntimeModel, quantize_int8

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments/ shared modules
from experiments.embedding_suite import corpus_texts, probe_suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--held-out", type=int, default=2000)
    parser.add_argument("--eval-length", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--out", default="experiments/int8/results/int8_granularity.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    sentence = read_sentence_config(path)
    assert sentence is not None
    # The held-out split of experiments/embeddings/bench_embed.py for the same seed.
    probes = probe_suite(seed=args.seed, max_train=600, max_test=300)
    probe_test = {t for task in probes for t in task.test_texts}
    pool = [t for t in corpus_texts() if t not in probe_test]
    random.Random(args.seed).shuffle(pool)
    held_out = pool[: args.held_out]
    teacher = surgery.from_pretrained(path).eval()
    cache = TeacherCache(teacher, tokenizer, sentence, max_length=args.eval_length)
    results: dict = {"setup": {"model": args.model, "held_out_texts": len(held_out), "eval_length": args.eval_length,
                               "seed": args.seed, "threads": args.threads,
                               "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start"}}
    with tempfile.TemporaryDirectory(prefix="int8-granularity-") as tmp:
        export_onnx(teacher, Path(tmp) / "fp32", task="base", threads=args.threads)
        fp32 = Path(tmp) / "fp32" / "model.onnx"
        graphs = {"onnxruntime fp32": fp32}
        # Mixed precision: the products of the named parts of every layer stay in fp32.
        for name, per_channel, parts in (("int8 per tensor", False, ()), ("int8 per channel", True, ()),
                                         ("int8 per channel, ffn-down in fp32", True, ("ffn-down",)),
                                         ("int8 per channel, ffn in fp32", True, ("ffn",))):
            graphs[name] = Path(tmp) / f"{name.replace(' ', '-').replace(',', '')}.onnx"
            kept = quantize_int8(fp32, graphs[name], per_channel=per_channel,
                                 keep_fp32=int8_fp32_scopes(teacher, parts))
            results.setdefault("fp32_nodes", {})[name] = len(kept)
        for name, graph in graphs.items():
            start = time.perf_counter()
            runtime = OnnxRuntimeModel(graph, config=teacher.config, threads=args.threads)
            report = evaluate_embeddings(runtime, cache, tokenizer, held_out, sentence, probes=probes,
                                         max_length=args.eval_length, seed=args.seed)
            results[name] = {**report.model_dump(mode="json"), "onnx_bytes": graph.stat().st_size}
            print(name, f"cosine {report.mean_cosine:.4f} recall@10 {report.recall_at_k:.4f} "
                  f"({time.perf_counter() - start:.0f}s)", flush=True)
        models = {"pytorch fp32": teacher, **{name: BenchedOnnxModel(graph, teacher, output="last_hidden_state",
                                                                     task="base", threads=args.threads)
                                              for name, graph in graphs.items()}}
        bench = bench_models(models, batch_size=32, seq_len=64, repeats=args.repeats, warmup=2, threads=args.threads)
    results["bench"] = bench.model_dump(mode="json")
    for comparison in bench.comparisons:
        print(comparison.name, f"{comparison.paired_speedup:.2f}x paired", flush=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
