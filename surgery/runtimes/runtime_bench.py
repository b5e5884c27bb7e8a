"""Benchmarks across runtimes: each model in each named runtime, side by side in one process.

:func:`bench_runtimes` loads each model once, turns it into every runtime asked for with that
runtime's own :meth:`~surgery.runtimes.shared.runtime.Runtime.prepare` (the artefact it would deploy, checked as
its export checks it: a parity check for fp32, the drift recorded for int8), and hands every variant
to :func:`surgery.measure.bench.bench_models`: same inputs, interleaved rounds, same thread count
(each runtime holds itself to it), ratios against the first row. With labelled data, every variant's
accuracy on it is added to the report.
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
from surgery.core.strategy import Batch
from surgery.measure.bench import BenchReport, bench_models
from surgery.runtimes.runtime_registry import check_calibration_use, get_runtime, runtime_class
from surgery.runtimes.shared.benched_model import BenchedRuntimeModel, accuracy_of
from surgery.runtimes.shared.runtime import Runtime


def runtime_label(name: str, runtime: str) -> str:
    """The display name of one variant, e.g. ``"pruned [onnxruntime-int8]"``.

    Example:
        >>> runtime_label("pruned", "openvino-int8"), runtime_label("base", "torch")
        ('pruned [openvino-int8]', 'base [torch]')
    """
    return f"{name} [{runtime}]"


def resolve_runtimes(runtimes: Sequence[str], options: Mapping[str, Mapping[str, Any]] | None = None
                     ) -> dict[str, Runtime]:
    """Each named runtime, available here, built with its ``options``; refused in one line otherwise.

    Example:
        >>> list(resolve_runtimes(["torch", "torch"]))
        ['torch']
        >>> resolve_runtimes([])
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: bench: name at least one --runtime
    """
    if not runtimes:
        raise ConfigError("bench: name at least one --runtime")
    options = options or {}
    found = {}
    for name in dict.fromkeys(runtimes):
        get_runtime(name)  # unknown or unavailable here: one line naming the fix
        found[name] = runtime_class(name)(**options.get(name, {}))
    return found


def runtime_variants(name: str, model: nn.Module, work_dir: Path, runtimes: Mapping[str, Runtime], *,
                     calibration: Sequence[Batch] | None = None, threads: int | None = None) -> dict[str, nn.Module]:
    """``model`` in each of ``runtimes`` (:func:`resolve_runtimes`), by display name; artefacts under ``work_dir``.

    Example:
        >>> import tempfile
        >>> from surgery.testing import TinySpec, tiny_model
        >>> variants = runtime_variants("tiny", tiny_model(TinySpec("bert")), Path(tempfile.mkdtemp()),
        ...                             resolve_runtimes(["torch", "onnxruntime"]), threads=1)
        >>> {label: getattr(m, "runtime", "torch") for label, m in variants.items()}
        {'tiny [torch]': 'torch', 'tiny [onnxruntime]': 'onnxruntime'}
    """
    variants: dict[str, nn.Module] = {}
    for runtime_name, runtime in runtimes.items():
        if runtime.as_is:  # the model object itself
            variants[runtime_label(name, runtime_name)] = model
            continue
        folder = work_dir / runtime_name
        served = runtime.prepare(model, folder, calibration=calibration if runtime.needs_calibration else None,
                                 threads=threads)
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0
        variants[runtime_label(name, runtime_name)] = BenchedRuntimeModel(served, model, runtime=runtime_name,
                                                                          artefact_bytes=size)
    return variants


def bench_runtimes(
    paths: Sequence[str | os.PathLike[str]],
    *,
    names: Sequence[str] | None = None,
    runtimes: Sequence[str] = ("torch",),
    options: Mapping[str, Mapping[str, Any]] | None = None,
    calibration: Sequence[Batch] | None = None,
    data: Iterable[Mapping[str, torch.Tensor]] | None = None,
    threads: int | None = None,
    **kwargs: Any,
) -> BenchReport:
    """Bench saved models in several runtimes side by side; the first model's first runtime is the reference.

    Args:
        paths: model directories (or embedded names such as ``"minilm-l6"``).
        names: display names (default: the paths as given).
        runtimes: registered runtime names (:func:`surgery.runtimes.runtime_names`), for every model.
        options: per runtime name, the keyword arguments its class takes (e.g. ``{"onnxruntime-int8":
            {"int8_fp32": ["ffn-down"]}}``).
        calibration: tokenized batches of representative texts for the int8 runtimes (smoothing for
            ``onnxruntime-int8``, NNCF's static scales for ``openvino-int8``, which requires them).
        data: labelled batches; each variant's accuracy on them is recorded (sequence classifiers only).
        threads: threads for every runtime alike (default: torch's current count).
        **kwargs: passed to :func:`surgery.measure.bench.bench_models` (``batch_size``, ``seq_len``, ``repeats`` ...).

    Example:
        >>> import tempfile
        >>> import surgery
        >>> from surgery.testing import TinySpec, tiny_model
        >>> out = surgery.save_pretrained(tiny_model(TinySpec("bert")), Path(tempfile.mkdtemp()) / "m")
        >>> report = bench_runtimes([out], names=["tiny"], batch_size=2, seq_len=8, repeats=2, warmup=0)
        >>> [(m.name, m.runtime) for m in report.models]
        [('tiny [torch]', 'torch')]
    """
    from surgery.persist.model_io import from_pretrained

    labels = [str(p) for p in paths] if names is None else list(names)
    if len(labels) != len(paths) or len(set(labels)) != len(labels):
        raise ConfigError(f"bench: give one distinct name per path, got {labels} for {len(paths)} paths")
    resolved = resolve_runtimes(runtimes, options)
    device = str(kwargs.get("device", "cpu")).partition(":")[0]
    if elsewhere := [n for n, r in resolved.items() if not r.runs_on(device)]:
        raise ConfigError(f"bench: {', '.join(elsewhere)} cannot run on {kwargs['device']}; drop --device or those "
                          "--runtime names")
    check_calibration_use(list(resolved.values()), calibration)
    threads = threads or torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="surgery-bench-") as tmp:
        models: dict[str, nn.Module] = {}
        for index, (label, path) in enumerate(zip(labels, paths, strict=True)):
            work = Path(tmp) / str(index)
            work.mkdir()
            models.update(runtime_variants(label, from_pretrained(path), work, resolved, calibration=calibration,
                                           threads=threads))
        report = bench_models(models, threads=threads, **kwargs)
        if data is not None:
            batches = list(data)
            for bench in report.models:
                bench.accuracy = accuracy_of(models[bench.name], batches)
    return report
