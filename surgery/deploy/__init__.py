"""Deployment: ONNX export with a parity check, int8 quantization, and benchmarks across runtimes.

Needs the ``onnx`` extra (``pip install 'encoder-surgery[onnx]'``); without it every entry point
raises a one-line :class:`MissingDependencyError` naming what to install.

Example:
    >>> from surgery.deploy import require_onnx
    >>> require_onnx("ONNX export")  # silent when the extra is installed
    >>> ONNX_NAME, INFO_NAME
    ('model.onnx', 'surgery-onnx.json')
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from surgery.deploy.names import INFO_NAME, ONNX_NAME

if TYPE_CHECKING:
    from surgery.deploy.export import Agreement, ExportParityError, ExportReport, export_onnx, read_export_info
    from surgery.deploy.runtime import MissingDependencyError, OnnxRuntimeModel, require_onnx

# Imported on first use: the export pulls in torch, which `surgery --help` must not pay for.
_LAZY = {
    "Agreement": "surgery.deploy.export", "ExportParityError": "surgery.deploy.export",
    "ExportReport": "surgery.deploy.export", "export_onnx": "surgery.deploy.export",
    "read_export_info": "surgery.deploy.export", "MissingDependencyError": "surgery.deploy.runtime",
    "OnnxRuntimeModel": "surgery.deploy.runtime", "require_onnx": "surgery.deploy.runtime",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'surgery.deploy' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


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
