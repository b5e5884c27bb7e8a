"""Deployment: ONNX export with a parity check, int8 quantization, and benchmarks across runtimes.

Needs the ``onnx`` extra (``pip install 'encoder-surgery[onnx]'``); without it every entry point
raises a one-line :class:`MissingDependencyError` naming what to install.

Example:
    >>> require_onnx("ONNX export")  # silent when the extra is installed
    >>> ONNX_NAME, INFO_NAME
    ('model.onnx', 'surgery-onnx.json')
"""

from __future__ import annotations

from surgery.deploy.export import (
    INFO_NAME,
    ONNX_NAME,
    Agreement,
    ExportParityError,
    ExportReport,
    export_onnx,
    read_export_info,
)
from surgery.deploy.runtime import MissingDependencyError, OnnxRuntimeModel, require_onnx

__all__ = [
    "INFO_NAME",
    "ONNX_NAME",
    "Agreement",
    "ExportParityError",
    "ExportReport",
    "MissingDependencyError",
    "OnnxRuntimeModel",
    "export_onnx",
    "read_export_info",
    "require_onnx",
]
