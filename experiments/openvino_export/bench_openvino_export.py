"""surgery's OpenVINO int8 export of all-MiniLM-L6-v2 against sentence-transformers' own, in one process.

Three steps (run.sh runs them; ``time`` under the machine's timing lock):

* ``fidelity WORK``: embeddings (mean pooling, normalized, as the model's sentence-transformers modules
  say) of the 2,000 held-out texts with PyTorch fp32, surgery's IR (WORK/surgery/openvino_model.xml,
  written by ``surgery export --runtime openvino-int8 --calibration``) and the peer's IR
  (WORK/peer/openvino/openvino_model_qint8_quantized.xml, written by sentence-transformers'
  ``export_static_quantized_openvino_model`` in the stock venv); mean cosine and recall@10 of each int8
  model against fp32. Then long texts: consecutive held-out snippets concatenated into documents of
  300-500 tokens (no long corpus is installed), both calibrated on short texts only.
* ``time WORK --threads 1 --rounds N``: paired interleaved rounds, batch 32 of held-out texts (padded to
  the longest of the batch), the three models in an order rotated every round; both IRs loaded with
  ``openvino`` in this process by the same class and settings (:class:`surgery.runtimes.openvino.openvino_export.
  OpenVinoModel`: f32 for the non-int8 operators, INFERENCE_NUM_THREADS, pinning off, LATENCY hint).
* ``report WORK``: medians of the per-round ratios with 95% bootstrap intervals
  (:func:`surgery.measure.stats.bootstrap_median`), the machine (:func:`surgery.measure.machine.machine_info`),
  into experiments/openvino_export/results/openvino_export.json and .md, with each target met or missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import surgery
from surgery.embedding import read_sentence_config
from surgery.embedding.evaluate import embed_texts, mean_cosine, retrieval_agreement
from surgery.measure.machine import machine_info
from surgery.measure.stats import bootstrap_median
from surgery.runtimes.openvino.openvino_export import OV_INFO, OpenVinoModel

HERE = Path(__file__).resolve().parent
PEER_XML = "peer/openvino/openvino_model_qint8_quantized.xml"
SURGERY_XML = "surgery/openvino_model.xml"
TARGETS = {"speed_vs_peer": 0.97, "mean_cosine": 0.997, "recall_at_10": 0.91, "long_mean_cosine": 0.98}


def model_dir(work: Path) -> Path:
    return Path((work / "model_path.txt").read_text().strip())


def texts(work: Path) -> dict[str, list[str]]:
    return json.loads((work / "texts.json").read_text())


def load(work: Path, threads: int) -> dict[str, torch.nn.Module]:
    """PyTorch fp32, surgery's IR and the peer's IR, each held to ``threads`` threads."""
    torch.set_num_threads(threads)
    reference = surgery.from_pretrained(model_dir(work)).eval()
    return {"torch fp32": reference,
            "surgery openvino-int8": OpenVinoModel(work / SURGERY_XML, config=reference.config, threads=threads),
            "sentence-transformers openvino qint8": OpenVinoModel(work / PEER_XML, config=reference.config,
                                                                  threads=threads)}


def long_documents(snippets: list[str], tokenizer: Any, *, low: int = 300, high: int = 500,
                   count: int = 150) -> list[str]:
    """Consecutive snippets joined until a document has ``low`` tokens (at most ``high``), ``count`` of them."""
    docs, current, tokens = [], [], 0
    for text in snippets:
        length = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if tokens + length > high:
            current, tokens = [], 0
        current.append(text)
        tokens += length
        if tokens >= low:
            docs.append(" ".join(current))
            current, tokens = [], 0
            if len(docs) == count:
                break
    return docs


def fidelity(work: Path) -> None:
    from transformers import AutoTokenizer

    models = load(work, threads=2)
    tokenizer = AutoTokenizer.from_pretrained(model_dir(work))
    config = read_sentence_config(model_dir(work))
    held_out = texts(work)["eval"]
    docs = long_documents(held_out, tokenizer)
    lengths = [len(tokenizer(d)["input_ids"]) for d in docs]
    result: dict[str, Any] = {"texts": len(held_out), "long_documents": len(docs),
                              "long_tokens": {"min": min(lengths), "median": statistics.median(lengths),
                                              "max": max(lengths)},
                              "max_seq_length": config.max_seq_length, "models": {}}
    embeddings = {name: embed_texts(m, tokenizer, held_out, config) for name, m in models.items()}
    long_embeddings = {name: embed_texts(m, tokenizer, docs, config, max_length=512) for name, m in models.items()}
    reference, long_reference = embeddings["torch fp32"], long_embeddings["torch fp32"]
    for name in models:
        if name == "torch fp32":
            continue
        result["models"][name] = {
            "mean_cosine": mean_cosine(embeddings[name], reference),
            "recall_at_10": retrieval_agreement(embeddings[name], reference, k=10),
            "long_mean_cosine": mean_cosine(long_embeddings[name], long_reference),
            "long_min_cosine": float(torch.nn.functional.cosine_similarity(long_embeddings[name],
                                                                           long_reference).min()),
        }
        print(name, result["models"][name])
    result["surgery_export"] = json.loads((work / "surgery" / OV_INFO).read_text())
    (work / "fidelity.json").write_text(json.dumps(result, indent=1) + "\n")


def timing(work: Path, threads: int, rounds: int, warmup: int = 3, batch_size: int = 32) -> None:
    from transformers import AutoTokenizer

    models = load(work, threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir(work))
    held_out = texts(work)["eval"]
    # Consecutive batches of the held-out texts, from the start again when more rounds than texts are asked.
    starts = [(k * batch_size) % (len(held_out) - batch_size + 1) for k in range(rounds + warmup)]
    batches = [dict(tokenizer(held_out[i:i + batch_size], padding=True, truncation=True, max_length=256,
                              return_tensors="pt")) for i in starts]
    names = list(models)
    seconds: dict[str, list[float]] = {n: [] for n in names}
    with torch.inference_mode():
        for index, batch in enumerate(batches):
            # The order rotates every round, so no model always runs first (warm caches) or last.
            order = names[index % len(names):] + names[:index % len(names)]
            for name in order:
                start = time.perf_counter()
                models[name](**batch)
                elapsed = time.perf_counter() - start
                if index >= warmup:
                    seconds[name].append(elapsed)
    info = machine_info()
    settings = {name: {key: str(m.compiled.get_property(key)) for key in
                       ("INFERENCE_PRECISION_HINT", "INFERENCE_NUM_THREADS", "ENABLE_CPU_PINNING",
                        "PERFORMANCE_HINT")} for name, m in models.items() if isinstance(m, OpenVinoModel)}
    tokens = [int(b["attention_mask"].sum()) for b in batches[warmup:]]
    (work / f"timing_{threads}.json").write_text(json.dumps({
        "threads": threads, "rounds": rounds, "warmup": warmup, "batch_size": batch_size,
        "tokens_per_batch": {"median": statistics.median(tokens), "min": min(tokens), "max": max(tokens)},
        "seconds": seconds, "openvino_settings": settings, "torch_threads": torch.get_num_threads(),
        "machine": info.model_dump(mode="json"), "machine_summary": info.summary(),
        "load_average": list(os.getloadavg())}, indent=1) + "\n")
    print({n: statistics.median(s) for n, s in seconds.items()})


def ratio_interval(slow: list[float], fast: list[float]) -> dict[str, float]:
    """Median and 95% interval of the per-round ratio slow/fast (how many times faster ``fast`` ran)."""
    ci = bootstrap_median([a / b for a, b in zip(slow, fast, strict=True)])
    return {"median": ci.estimate, "low": ci.low, "high": ci.high, "rounds": ci.rounds}


def report(work: Path, threads: list[int]) -> None:
    fid = json.loads((work / "fidelity.json").read_text())
    peer = json.loads((work / "peer_versions.json").read_text())
    ours, theirs = "surgery openvino-int8", "sentence-transformers openvino qint8"
    speed = {}
    for n in threads:
        t = json.loads((work / f"timing_{n}.json").read_text())
        s = t["seconds"]
        speed[str(n)] = {"surgery_vs_peer": ratio_interval(s[theirs], s[ours]),
                         "surgery_vs_torch_fp32": ratio_interval(s["torch fp32"], s[ours]),
                         "peer_vs_torch_fp32": ratio_interval(s["torch fp32"], s[theirs]),
                         "median_seconds": {k: statistics.median(v) for k, v in s.items()},
                         "tokens_per_batch": t["tokens_per_batch"], "load_average": t["load_average"],
                         "openvino_settings": t["openvino_settings"]}
        machine = t["machine"]
        summary = t["machine_summary"]
    first = speed[str(threads[0])]["surgery_vs_peer"]["median"]
    measured = {"speed_vs_peer": first, "mean_cosine": fid["models"][ours]["mean_cosine"],
                "recall_at_10": fid["models"][ours]["recall_at_10"],
                "long_mean_cosine": fid["models"][ours]["long_mean_cosine"]}
    verdict = {k: {"target": TARGETS[k], "measured": v, "met": v >= TARGETS[k]} for k, v in measured.items()}
    export = fid.pop("surgery_export")
    result = {"question": "Is `surgery export --runtime openvino-int8 --calibration` of unchanged all-MiniLM-L6-v2 at "
                          "least level with sentence-transformers' own static int8 OpenVINO export?",
              "machine": machine, "machine_summary": summary, "targets": verdict, "speed": speed, "fidelity": fid,
              "surgery_export": {k: export[k] for k in ("precision", "int8_quantization", "int8_drift", "parity",
                                                        "versions", "ir_bytes")},
              "peer": peer}
    out = HERE / "results" / "openvino_export.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    rows = [f"| {k} | >= {v['target']} | {v['measured']:.4f} | {'met' if v['met'] else 'MISSED'} |"
            for k, v in verdict.items()]
    lines = ["# surgery openvino-int8 against sentence-transformers' OpenVINO static int8", "",
             f"Machine: {summary}; flags {', '.join(machine['flags'])}.", "",
             "| target | wanted | measured | |", "|---|---|---|---|", *rows, ""]
    for n, sp in speed.items():
        lines.append(f"{n} thread(s): surgery/peer {sp['surgery_vs_peer']['median']:.3f}x "
                     f"({sp['surgery_vs_peer']['low']:.3f}-{sp['surgery_vs_peer']['high']:.3f}), surgery "
                     f"{sp['surgery_vs_torch_fp32']['median']:.2f}x and peer {sp['peer_vs_torch_fp32']['median']:.2f}x "
                     f"over PyTorch fp32, {sp['surgery_vs_peer']['rounds']} rounds.")
    for name, m in fid["models"].items():
        lines.append(f"- {name}: mean cosine {m['mean_cosine']:.4f}, recall@10 {m['recall_at_10']:.3f}, long "
                     f"texts mean cosine {m['long_mean_cosine']:.4f} (min {m['long_min_cosine']:.4f})")
    (HERE / "results" / "openvino_export.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=("fidelity", "time", "report"))
    parser.add_argument("work", type=Path)
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    if args.step == "fidelity":
        fidelity(args.work)
    elif args.step == "time":
        for n in args.threads:
            timing(args.work, n, args.rounds)
    else:
        report(args.work, args.threads)


if __name__ == "__main__":
    main()
