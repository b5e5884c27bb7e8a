"""Does an OpenVINO int8 IR run faster with the bf16 inference precision hint, and what does it cost in fidelity?

NNCF int8 quantizes the products (the linear layers' and attention's MatMuls); softmax, layer norm, GELU, the
residual adds and the dequantized outputs stay in float. surgery serves an int8 IR held to f32
(``INFERENCE_PRECISION_HINT``); on a CPU with native bf16 (avx512_bf16 or AMX) the hint bf16 runs those float
parts, and any product left in float, in bf16. This times, side by side in one interleaved benchmark, PyTorch fp32,
the int8 IR held to f32 and the same IR run with the hint bf16, and scores both against PyTorch fp32 on real
texts: mean and min cosine of the sentence embeddings (all-MiniLM-L6-v2, mean pooling) on held-out texts::

    python experiments/probes/int8_bf16_hint.py --lengths 32 64 128 \\
        --out experiments/probes/results/int8_bf16_hint.json

One thread, batch 32; the IR is calibrated on 256 texts of the embedding corpus (experiments/embedding_suite.py),
scored on 1,000 others. Prints a table and writes the JSON with the machine (CPU model and flags).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import surgery
from experiments.embedding_suite import corpus_texts
from surgery.embedding import read_sentence_config
from surgery.embedding.evaluate import embed_texts
from surgery.measure.machine import machine_info
from surgery.measure.timing import make_inputs, time_models
from surgery.persist.assets import resolve_model_path
from surgery.runtimes import get_runtime
from surgery.runtimes.openvino.openvino_ir import OV_XML, OpenVinoModel
from surgery.runtimes.shared.smooth import text_calibration_batches

HERE = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--lengths", nargs="+", type=int, default=[32, 64, 128])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--texts", type=int, default=1000, help="held-out texts scored")
    parser.add_argument("--out", type=Path, default=HERE / "int8_bf16_hint.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve_model_path(args.model)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    sentence = read_sentence_config(path)
    model = surgery.from_pretrained(path).eval()
    pool = corpus_texts()
    random.Random(0).shuffle(pool)
    calibration = text_calibration_batches(pool[:256], tokenizer, max_texts=256, max_length=64)
    scored = pool[256:256 + args.texts]
    work = Path(tempfile.mkdtemp(prefix="int8-bf16-"))
    f32 = get_runtime("openvino-int8").prepare(model, work / "int8", calibration=calibration, threads=args.threads)
    bf16 = OpenVinoModel(work / "int8" / OV_XML, config=model.config, output="last_hidden_state",
                         threads=args.threads, task="base", precision="bf16")
    reference = embed_texts(model, tokenizer, scored, sentence, max_length=64)
    fidelity = {}
    for name, served in (("int8 [f32 hint]", f32), ("int8 [bf16 hint]", bf16)):
        emb = embed_texts(served, tokenizer, scored, sentence, max_length=64)
        cos = torch.nn.functional.cosine_similarity(emb.double(), reference.double(), dim=-1)
        fidelity[name] = {"mean_cosine": round(float(cos.mean()), 6), "min_cosine": round(float(cos.min()), 6),
                          "precision": getattr(served, "precision", None)}
    load_before = os.getloadavg()[0]
    rows = []
    for length in args.lengths:
        batch = make_inputs(int(model.config.vocab_size), batch_size=args.batch_size, seq_len=length)
        timing = time_models({"torch fp32": model, "int8 [f32 hint]": f32, "int8 [bf16 hint]": bf16}, [batch],
                             repeats=args.repeats, warmup=2, threads=args.threads)
        row = {"seq_len": length}
        for name in ("int8 [f32 hint]", "int8 [bf16 hint]"):
            ratio, interval = timing.speedup(name)
            row[name] = {"speedup": round(ratio, 3), "interval": [round(interval.low, 3), round(interval.high, 3)]}
        bf16_over_f32 = [a / b for a, b in zip(timing.seconds["int8 [f32 hint]"], timing.seconds["int8 [bf16 hint]"],
                                                strict=True)]
        row["bf16_hint_over_f32_hint"] = round(sorted(bf16_over_f32)[len(bf16_over_f32) // 2], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = {"machine": machine_info().model_dump(mode="json"), "threads": args.threads, "batch_size": args.batch_size,
           "repeats": args.repeats, "model": args.model, "fidelity": fidelity, "rows": rows,
           "load_average": [load_before, os.getloadavg()[0]]}
    print(json.dumps(fidelity, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
