"""sentence-transformers' own runtimes against surgery's int8 exports, side by side in one process.

Runs in the STOCK venv of ``run.sh`` (sentence-transformers 5.7, transformers 4.57, optimum-onnx,
onnxruntime, optimum-intel, openvino, nncf, torch CPU), which does not have surgery: surgery needs
transformers 5 and optimum-onnx needs transformers < 4.58. So this script imports no surgery code;
``report_st_runtimes.py`` turns what it writes into intervals and fidelity, with surgery's venv.

Three steps, each its own command, so that ``run.sh`` can run the exports without the timing lock:

* ``export WORK``: sentence-transformers' own exports of all-MiniLM-L6-v2, each with the function
  its documentation names: ONNX fp32 (``backend="onnx"``), ONNX dynamic qint8
  (``export_dynamic_quantized_onnx_model`` with the configuration that matches this CPU), OpenVINO
  fp32 (``backend="openvino"``) and OpenVINO static qint8 (``export_static_quantized_openvino_model``,
  calibrated on the same texts as surgery's smoothing).
* ``embed WORK``: every backend's embeddings of the held-out texts, saved as ``emb-<backend>.npy``.
* ``time WORK``: every backend at each thread count, ``model.encode(texts, batch_size=32)`` on the
  same batches of real texts, interleaved: each round runs every backend once, moments apart, in an
  order rotated from round to round, so the per-round ratio to torch fp32 cancels most of the load
  the rest of the machine puts on it. Writes ``timing.json`` (seconds per round per backend) with
  the machine (CPU model and flags) and the version of every package.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import importlib.util
import json
import os
import platform
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

# The packages whose versions decide the figures.
PACKAGES = ("sentence-transformers", "transformers", "torch", "optimum", "optimum-onnx", "onnxruntime", "onnx",
            "optimum-intel", "openvino", "nncf", "datasets", "huggingface-hub", "numpy", "tokenizers")
# CPU flags that decide which int8 kernels the runtimes pick.
FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile",
         "amx_int8", "amx_bf16")
OV_INT8 = "openvino/openvino_model_qint8_quantized.xml"
# Backend name -> (folder under WORK, sentence-transformers backend, file inside the folder or None).
BACKENDS: dict[str, tuple[str, str, str | None]] = {
    "torch-fp32": ("st-minilm", "torch", None),
    "st-onnx-fp32": ("st-minilm", "onnx", "onnx/model.onnx"),
    "st-onnx-qint8": ("st-minilm", "onnx", None),  # the file name depends on the CPU: see onnx_qint8_file
    "st-openvino-fp32": ("st-minilm", "openvino", "openvino/openvino_model.xml"),
    "st-openvino-qint8": ("st-minilm", "openvino", OV_INT8),
    # OpenVINO runs "fp32" models in bf16 on CPUs with bf16 instructions (its default precision hint); these two
    # rows hold it to f32, to tell what int8 brings from what bf16 brings.
    "st-openvino-fp32-f32": ("st-minilm", "openvino", "openvino/openvino_model.xml"),
    "st-openvino-qint8-f32": ("st-minilm", "openvino", OV_INT8),
    "surgery-int8": ("surgery-int8", "onnx", "onnx/model.onnx"),
    "surgery-int8-smooth": ("surgery-int8-smooth", "onnx", "onnx/model.onnx"),
}
REFERENCE = "torch-fp32"


def cpu() -> dict[str, Any]:
    """The CPU model, its logical CPUs and its int8-relevant flags, from /proc/cpuinfo (Linux)."""
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    info: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())  # the first processor's entry
    flags = set(info.get("flags", "").split())
    return {"model": info.get("model name", platform.processor()),
            "logical_cpus": sum(line.startswith("processor") for line in lines),
            "flags": {flag: flag in flags for flag in FLAGS}}


def onnx_qint8_config() -> str:
    """sentence-transformers' dynamic-quantization preset for this CPU (its names: avx2, avx512, avx512_vnni)."""
    flags = cpu()["flags"]
    if flags["avx512_vnni"]:
        return "avx512_vnni"
    return "avx512" if flags["avx512f"] and flags["avx512bw"] else "avx2"


def onnx_qint8_file() -> str:
    """Where ``export_dynamic_quantized_onnx_model`` writes the qint8 graph for this CPU's preset."""
    return f"onnx/model_qint8_{onnx_qint8_config()}.onnx"


def onnx_qint8_preset() -> dict[str, str]:
    """The fields of Optimum's preset that ``export_dynamic_quantized_onnx_model`` applies on this CPU."""
    import dataclasses

    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    preset = getattr(AutoQuantizationConfig, onnx_qint8_config())(is_static=False)
    return {key: str(value) for key, value in dataclasses.asdict(preset).items()}


def settings(model: SentenceTransformer, backend: str) -> dict[str, Any]:
    """What the runtime actually runs with: threads, and OpenVINO's precision (it may pick bf16 for fp32)."""
    inner = model[0].auto_model
    if backend == "openvino":
        compiled = inner.request  # optimum-intel keeps the compiled model there
        return {key: str(compiled.get_property(key)) for key in
                ("INFERENCE_PRECISION_HINT", "INFERENCE_NUM_THREADS", "ENABLE_CPU_PINNING", "PERFORMANCE_HINT")}
    if backend == "onnx":
        options = inner.model.get_session_options()
        return {"intra_op_num_threads": options.intra_op_num_threads, "providers": inner.model.get_providers(),
                "graph_optimization_level": str(options.graph_optimization_level)}
    return {"torch_num_threads": torch.get_num_threads(), "attn_implementation":
            str(getattr(inner.config, "_attn_implementation", None))}


def export(work: Path, ov_samples: int) -> None:
    """sentence-transformers' own ONNX and OpenVINO exports of the model, fp32 and int8, into WORK/st-minilm."""
    from optimum.intel import OVQuantizationConfig
    from sentence_transformers import (
        export_dynamic_quantized_onnx_model,
        export_static_quantized_openvino_model,
    )

    target = work / "st-minilm"
    # A copy, so the exports land beside the model without writing into the installed package.
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(Path((work / "model_path.txt").read_text().strip()), target)
    onnx = SentenceTransformer(str(target), backend="onnx", device="cpu")
    onnx.save_pretrained(str(target))  # writes onnx/model.onnx
    export_dynamic_quantized_onnx_model(onnx, onnx_qint8_config(), str(target))
    openvino = SentenceTransformer(str(target), backend="openvino", device="cpu")
    openvino.save_pretrained(str(target))  # writes openvino/openvino_model.xml
    # A local folder with train.csv stands in for a hub dataset name; num_samples: every calibration text.
    export_static_quantized_openvino_model(
        openvino, OVQuantizationConfig(num_samples=ov_samples), str(target),
        dataset_name=str(work / "calibration"), dataset_config_name="default", dataset_split="train",
        column_name="text")
    for file in ("onnx/model.onnx", onnx_qint8_file(), "openvino/openvino_model.xml", OV_INT8):
        if not (target / file).exists():
            raise SystemExit(f"sentence-transformers did not write {target / file}")
    print("exports in", target, sorted(str(p.relative_to(target)) for p in target.rglob("*.onnx")),
          sorted(str(p.relative_to(target)) for p in target.rglob("*.xml")))


def load(work: Path, name: str, threads: int) -> SentenceTransformer:
    """One backend, held to ``threads`` threads by its own runtime's setting."""
    folder, backend, file = BACKENDS[name]
    if name == "st-onnx-qint8":
        file = onnx_qint8_file()
    kwargs: dict[str, Any] = {}
    if backend == "onnx":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        kwargs = {"file_name": file, "provider": "CPUExecutionProvider", "session_options": options}
    elif backend == "openvino":
        # optimum-intel's default hint is LATENCY; pinning is turned off because torch and ONNX Runtime
        # do not pin either, and the other processes on this machine would otherwise share the pinned core.
        # CACHE_DIR "": no compiled-model cache; every load compiles afresh and writes nothing beside the model.
        ov_config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
                                     "ENABLE_CPU_PINNING": False, "CACHE_DIR": ""}
        if name.endswith("-f32"):
            ov_config["INFERENCE_PRECISION_HINT"] = "f32"
        kwargs = {"file_name": file, "ov_config": ov_config}
    return SentenceTransformer(str(work / folder), backend=backend, device="cpu", model_kwargs=kwargs or None)


def texts(work: Path) -> dict[str, list[str]]:
    """The held-out and calibration texts that split_texts.py wrote."""
    return json.loads((work / "texts.json").read_text())


def embed(work: Path, names: list[str]) -> None:
    """Every backend's embeddings of the held-out texts, as ``encode`` returns them, as ``emb-<backend>.npy``."""
    held_out = texts(work)["eval"]
    # Untimed: two threads only to finish sooner; the thread count does not change the numbers that matter here.
    torch.set_num_threads(2)
    for name in names:
        model = load(work, name, threads=2)
        emb = model.encode(held_out, batch_size=32, convert_to_numpy=True)
        np.save(work / f"emb-{name}.npy", emb.astype(np.float32))
        print(f"{name}: {emb.shape[0]} embeddings")


def timed(encode: Callable[[], Any]) -> float:
    """Seconds one call takes."""
    start = time.perf_counter()
    encode()
    return time.perf_counter() - start


def time_backends(work: Path, names: list[str], threads: list[int], rounds: int, batches: int) -> None:
    """Seconds per round for every backend at each thread count, interleaved; writes ``timing.json``."""
    batch_texts = texts(work)["eval"][: 32 * batches]
    result: dict[str, Any] = {
        "what": f"SentenceTransformer.encode of {len(batch_texts)} held-out Rotten Tomatoes snippets, batch_size=32 "
                "(padded to the longest in each batch), one call per backend per round, rounds interleaved",
        "machine": {"cpu": cpu(), "python": platform.python_version(), "platform": platform.platform()},
        "versions": {p: md.version(p) for p in PACKAGES}, "onnx_qint8_config": onnx_qint8_config(),
        "onnx_qint8_preset": onnx_qint8_preset(), "texts": len(batch_texts), "batch_size": 32, "rounds": rounds,
        "settings": {}, "load_average": {}, "seconds": {}}
    for n in threads:
        torch.set_num_threads(n)
        models = {name: load(work, name, n) for name in names}
        result["settings"][str(n)] = {name: settings(model, BACKENDS[name][1]) for name, model in models.items()}
        for model in models.values():  # warm-up: first calls build kernels and caches
            for _ in range(2):
                model.encode(batch_texts, batch_size=32)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        # Other jobs share the machine: the 1-minute load average before and after says how much.
        load_avg = [os.getloadavg()[0]]
        for r in range(rounds):
            order = names[r % len(names):] + names[: r % len(names)]  # rotated: no backend always runs first
            for name in order:
                seconds[name].append(timed(lambda m=models[name]: m.encode(batch_texts, batch_size=32)))
            print(f"threads {n} round {r + 1}/{rounds}: " + ", ".join(
                f"{name} {seconds[REFERENCE][-1] / seconds[name][-1]:.2f}x" for name in names if name != REFERENCE),
                flush=True)
        result["seconds"][str(n)] = seconds
        result["load_average"][str(n)] = [*load_avg, os.getloadavg()[0]]
        del models
    (work / "timing.json").write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", work / "timing.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=("export", "embed", "time"))
    parser.add_argument("work", type=Path, help="the work folder run.sh and split_texts.py wrote")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batches", type=int, default=4, help="batches of 32 texts timed per backend per round")
    parser.add_argument("--ov-samples", type=int, default=512, help="OpenVINO calibration texts")
    args = parser.parse_args()
    # The point of this venv is that surgery is absent: its figures are what a stock user gets.
    assert importlib.util.find_spec("surgery") is None, "run this in the stock venv, without surgery"
    names = [REFERENCE] + [n for n in args.backends if n != REFERENCE]
    if args.step == "export":
        export(args.work, args.ov_samples)
    elif args.step == "embed":
        embed(args.work, names)
    else:
        time_backends(args.work, names, args.threads, args.rounds, args.batches)


if __name__ == "__main__":
    main()
