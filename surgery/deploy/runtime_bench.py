"""Benchmarks across runtimes: each model in PyTorch and/or ONNX Runtime, fp32 and int8, in one process.

:func:`bench_runtimes` loads each model once, exports it to ONNX (with the parity check of
:func:`surgery.deploy.export_onnx`) where a runtime needs it, quantizes that graph for int8, and then
hands every variant to :func:`surgery.measure.bench.bench_models`: same inputs, interleaved rounds, same
thread count (ONNX Runtime sessions get torch's intra-op thread count), ratios against the first
row. With labelled data, every variant's accuracy on it is added to the report.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from surgery.core.errors import ConfigError
from surgery.core.report import ParamCount
from surgery.core.run import count_params
from surgery.deploy.export import ONNX_NAME, check_int8_fp32, export_onnx, export_target, int8_fp32_scopes
from surgery.deploy.names import SMOOTH_ALPHA
from surgery.deploy.runtime import OnnxRuntimeModel, quantize_int8, require_onnx
from surgery.measure.bench import BenchReport, bench_models
from surgery.measure.flops import count_flops

RUNTIMES: tuple[str, ...] = ("torch", "onnxruntime")


class BenchedOnnxModel(OnnxRuntimeModel):
    """An ONNX Runtime model that reports parameters and FLOPs of the PyTorch model it was exported from.

    The graph computes the same matrix products as its source, so FLOPs per batch are counted on the
    source; its size is the ONNX file (int8 weights take a quarter of fp32); activation memory inside
    ONNX Runtime is not measured.
    """

    runtime = "onnxruntime"

    def __init__(self, path: Path, source: nn.Module, *, output: str, task: str, threads: int | None) -> None:
        super().__init__(path, config=source.config, output=output, threads=threads, task=task)
        self.params: ParamCount = count_params(source)
        object.__setattr__(self, "_source", source)  # not a submodule: the ORT row owns no torch weights

    def bench_counts(self, inputs: Mapping[str, torch.Tensor]) -> tuple[ParamCount, int, int, None, None, str]:
        """Parameters and FLOPs of the source model, and the ONNX file size.

        The hook :mod:`surgery.measure.bench` calls.
        """
        flops = count_flops(self._source, inputs)
        return self.params, flops, self.file_bytes(), None, None, "ONNX file size; ONNX Runtime memory not measured"


def runtime_label(name: str, runtime: str, int8: bool = False) -> str:
    """The display name of one variant, e.g. ``"pruned [onnxruntime int8]"``.

    Example:
        >>> runtime_label("pruned", "onnxruntime", int8=True), runtime_label("base", "torch")
        ('pruned [onnxruntime int8]', 'base [torch]')
    """
    return f"{name} [{runtime}{' int8' if int8 else ''}]"


def check_runtimes(runtimes: Sequence[str]) -> None:
    """Refuse an empty list or a runtime name this module cannot run, in one line.

    Example:
        >>> check_runtimes(["torch", "onnxruntime"])
        >>> check_runtimes(["tensorrt"])
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: bench: runtime 'tensorrt' is not one of torch, onnxruntime
    """
    unknown = [r for r in runtimes if r not in RUNTIMES]
    if unknown or not runtimes:
        raise ConfigError(f"bench: runtime {unknown[0] if unknown else '(none)'!r} is not one of {', '.join(RUNTIMES)}")


def runtime_variants(
    name: str,
    model: nn.Module,
    work_dir: Path,
    *,
    runtimes: Sequence[str] = ("torch",),
    int8: bool = False,
    int8_fp32: Sequence[str] = (),
    calibration: Sequence[Mapping[str, torch.Tensor]] | None = None,
    smooth_alpha: float = SMOOTH_ALPHA,
    threads: int | None = None,
) -> dict[str, nn.Module]:
    """``model`` in each of ``runtimes`` (fp32), plus its int8 ONNX Runtime graph with ``int8``, by display name.

    ONNX graphs are written under ``work_dir``; the export's parity check runs on a small padded batch.
    The int8 graph has per-channel weight scales, with the products of ``int8_fp32`` parts in fp32
    (as ``surgery export --int8 --int8-fp32``); with ``calibration`` batches its activations are smoothed
    first (as ``surgery export --int8 --calibration``).

    Example:
        >>> import tempfile
        >>> from surgery.testing import TinySpec, tiny_model
        >>> list(runtime_variants("tiny", tiny_model(TinySpec("bert")), Path(tempfile.mkdtemp())))
        ['tiny [torch]']
    """
    check_runtimes(runtimes)
    variants: dict[str, nn.Module] = {}
    fp32_graph = None
    target, output, task = export_target(model)
    if int8:
        require_onnx("bench --int8")
    # The plain fp32 graph serves the onnxruntime rows and, unsmoothed, is what int8 quantizes; a smoothed
    # int8 graph is exported from the smoothed model instead.
    if "onnxruntime" in runtimes or (int8 and calibration is None):
        require_onnx("bench --runtime onnxruntime / --int8")
        export_dir = work_dir / "onnx-fp32"
        export_onnx(model, export_dir, batch=2, seq=16, threads=threads)
        fp32_graph = export_dir / ONNX_NAME
    for runtime in dict.fromkeys(runtimes):
        if runtime == "torch":
            variants[runtime_label(name, runtime)] = model
        else:
            variants[runtime_label(name, runtime)] = BenchedOnnxModel(
                fp32_graph, target, output=output, task=task, threads=threads)
    if int8 and calibration is not None:  # the smoothed model is another fp32 graph: export it again
        export_onnx(model, work_dir / "onnx-int8", batch=2, seq=16, threads=threads, int8=True,
                    int8_fp32=int8_fp32, calibration=calibration, smooth_alpha=smooth_alpha)
        int8_graph = work_dir / "onnx-int8" / ONNX_NAME
    elif int8:
        int8_graph = fp32_graph.with_name("model.int8.onnx")
        quantize_int8(fp32_graph, int8_graph, keep_fp32=int8_fp32_scopes(target, int8_fp32))
    if int8:
        variants[runtime_label(name, "onnxruntime", int8=True)] = BenchedOnnxModel(
            int8_graph, target, output=output, task=task, threads=threads)
    return variants


def accuracy_of(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]]) -> float | None:
    """Accuracy of a sequence classifier (torch or ONNX Runtime) on labelled batches; None for other heads.

    Example:
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert", task="seq-cls")
        >>> batch = {**tiny_inputs(spec), "labels": torch.tensor([0, 1, 2])}
        >>> 0.0 <= accuracy_of(tiny_model(spec), [batch]) <= 1.0, accuracy_of(tiny_model(TinySpec("bert")), [batch])
        (True, None)
    """
    correct = total = 0
    with torch.inference_mode():
        for batch in batches:
            out = model(**{k: v for k, v in batch.items() if k != "labels"})
            logits = getattr(out, "logits", None)
            if logits is None or logits.shape[-1] != getattr(model.config, "num_labels", -1) or logits.dim() != 2:
                return None
            correct += int((logits.argmax(-1) == batch["labels"]).sum())
            total += int(batch["labels"].numel())
    return correct / total if total else None


def bench_runtimes(
    paths: Sequence[str | os.PathLike[str]],
    *,
    names: Sequence[str] | None = None,
    runtimes: Sequence[str] = ("torch",),
    int8: bool = False,
    int8_fp32: Sequence[str] = (),
    calibration: Sequence[Mapping[str, torch.Tensor]] | None = None,
    smooth_alpha: float = SMOOTH_ALPHA,
    data: Iterable[Mapping[str, torch.Tensor]] | None = None,
    threads: int | None = None,
    **kwargs: Any,
) -> BenchReport:
    """Bench saved models in several runtimes side by side; the first model's first runtime is the reference.

    Args:
        paths: model directories (or embedded names such as ``"minilm-l6"``).
        names: display names (default: the paths as given).
        runtimes: ``torch`` and/or ``onnxruntime`` (fp32), for every model.
        int8: add every model's ONNX Runtime dynamic-int8 graph.
        int8_fp32: parts of every layer whose products the int8 graphs keep in fp32
            (:data:`surgery.deploy.weight_products.INT8_FP32_PARTS`).
        calibration: tokenized batches of representative texts: every int8 graph's activations are
            smoothed on them first (:mod:`surgery.deploy.smooth`); ``smooth_alpha`` is the strength.
        data: labelled batches; each variant's accuracy on them is recorded (sequence classifiers only).
        threads: intra-op threads for torch and ONNX Runtime alike (default: torch's current count).
        **kwargs: passed to :func:`surgery.measure.bench.bench_models` (``batch_size``, ``seq_len``,
            ``repeats`` ...).

    Example:
        >>> import tempfile
        >>> import surgery
        >>> from surgery.testing import TinySpec, tiny_model
        >>> out = surgery.save_pretrained(tiny_model(TinySpec("bert")), Path(tempfile.mkdtemp()) / "m")
        >>> report = bench_runtimes([out], names=["tiny"], batch_size=2, seq_len=8, repeats=2, warmup=0)
        >>> [(m.name, m.runtime) for m in report.models]  # runtimes=["torch", "onnxruntime"], int8=True add rows
        [('tiny [torch]', 'torch')]
    """
    from surgery.persist.model_io import from_pretrained

    labels = [str(p) for p in paths] if names is None else list(names)
    if len(labels) != len(paths) or len(set(labels)) != len(labels):
        raise ConfigError(f"bench: give one distinct name per path, got {labels} for {len(paths)} paths")
    if kwargs.get("device", "cpu") != "cpu" and ("onnxruntime" in runtimes or int8):
        raise ConfigError(f"bench: ONNX Runtime rows run on the CPU only; drop --device {kwargs['device']} or "
                          "--runtime onnxruntime/--int8")
    check_int8_fp32(int8_fp32, int8, "bench")
    if calibration is not None and not int8:
        raise ConfigError("bench: --calibration smooths the activations of the int8 graphs; add --int8")
    threads = threads or torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="surgery-bench-") as tmp:
        models: dict[str, nn.Module] = {}
        for index, (label, path) in enumerate(zip(labels, paths, strict=True)):
            work = Path(tmp) / str(index)
            work.mkdir()
            models.update(runtime_variants(label, from_pretrained(path), work, runtimes=runtimes, int8=int8,
                                           int8_fp32=int8_fp32, calibration=calibration,
                                           smooth_alpha=smooth_alpha, threads=threads))
        report = bench_models(models, threads=threads, **kwargs)
        if data is not None:
            batches = list(data)
            for bench in report.models:
                bench.accuracy = accuracy_of(models[bench.name], batches)
    return report
