"""``export_onnx``: a model as a directory that needs only ``onnxruntime`` to serve.

The directory is what every runtime's export writes (:meth:`surgery.runtimes.shared.runtime.Runtime.write_folder`:
atomic, the serving tokenizer, accuracy on data) around the ONNX Runtime runtime's artefact
(:func:`surgery.runtimes.onnx.onnx_graph.write_onnx`: ``model.onnx`` and ``surgery-onnx.json``, parity-checked
against PyTorch). ``surgery export --runtime onnxruntime`` writes the same directory.

The graph's names are importable from here too, as before the graph moved to :mod:`surgery.runtimes.onnx.onnx_graph`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from surgery.core.errors import ConfigError
from surgery.runtimes.onnx.onnx_graph import (
    ExportReport,
    check_int8_fp32,
    int8_fp32_scopes,
    part_modules,
    read_export_info,
    write_onnx,
)
from surgery.runtimes.onnx.onnx_runtime import OnnxRuntimeInt8Runtime, OnnxRuntimeRuntime

__all__ = ["ExportReport", "check_int8_fp32", "export_onnx", "int8_fp32_scopes", "part_modules", "read_export_info",
           "write_onnx"]


def export_onnx(model: nn.Module, out_dir: str | os.PathLike[str], *, tokenizer: Any = None, int8: bool = False,
                calibration: Iterable[Mapping[str, torch.Tensor]] | None = None, task: str = "auto",
                save_tokenizer: bool = True, data: Iterable[Mapping[str, torch.Tensor]] | None = None,
                threads: int | None = None, overwrite: bool = False, max_length: int | None = None,
                **graph: Any) -> ExportReport:
    """Export ``model`` to ``out_dir``: ``model.onnx`` checked against PyTorch, optionally int8, with the tokenizer.

    ``int8``, ``calibration`` and ``**graph`` are :func:`~surgery.runtimes.onnx.onnx_graph.write_onnx`'s settings
    (``per_channel``, ``int8_fp32``, ``smooth_alpha``, ``optimize``, ``batch``, ``seq``, ``tolerance``, ``opset``,
    ``fuse_attention``, ``int8_mode``), with their defaults there; ``tokenizer`` also builds its parity batch.
    The rest are the folder's (:meth:`~surgery.runtimes.shared.runtime.Runtime.write_folder`):

    Args:
        tokenizer: saved next to the graph (unless ``save_tokenizer`` is False) as the serving tokenizer.
        data: labelled batches (``labels`` key); the accuracy of PyTorch and of the written graph is recorded.
        threads: ONNX Runtime threads for the checks (default: torch's).
        overwrite: replace a non-empty ``out_dir`` that surgery wrote.
        max_length: the tokens the saved ``tokenizer.json`` truncates at; default: ``max_seq_length`` of
            the source's ``sentence_bert_config.json``, else the tokenizer's own limit, else the model's
            positions (:mod:`surgery.runtimes.shared.tokenizer`); it pads to the longest text of each batch.

    Returns the :class:`~surgery.runtimes.onnx.onnx_graph.ExportReport` saved as ``surgery-onnx.json``.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> import surgery
        >>> from surgery.strategies import HeadPruningStrategy
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert"))
        >>> _ = surgery.convert(model, HeadPruningStrategy(heads={0: [1, 2]}))
        >>> out = Path(tempfile.mkdtemp()) / "onnx"
        >>> report = export_onnx(model, out, batch=2, seq=8)
        >>> report.parity.max_abs_diff < 1e-4, report.steps, sorted(p.name for p in out.iterdir())
        (True, ['head-prune'], ['.surgery-manifest.json', 'model.onnx', 'surgery-onnx.json'])
    """
    if calibration is not None and not int8:
        raise ConfigError("export: calibration batches smooth the activations for int8; they need --int8")
    runtime = (OnnxRuntimeInt8Runtime if int8 else OnnxRuntimeRuntime)(**graph, parity_tokenizer=tokenizer)
    return runtime.write_folder(model, out_dir, task=task, tokenizer=tokenizer if save_tokenizer else None,
                                calibration=None if calibration is None else list(calibration), data=data,
                                threads=threads, overwrite=overwrite, max_length=max_length)
