"""The ONNX Runtime runtimes (``onnxruntime``, ``onnxruntime-int8``): the exporter, the served graph, the classes.

Needs the ``onnx`` extra (``pip install 'encoder-surgery[onnx]'``); without it every entry point
raises a one-line :class:`MissingDependencyError` naming what to install.

Example:
    >>> from surgery.runtimes.onnx import require_onnx
    >>> require_onnx("ONNX export")  # silent when the extra is installed
    >>> ONNX_NAME, INFO_NAME
    ('model.onnx', 'surgery-onnx.json')
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from surgery.core.errors import MissingDependencyError
from surgery.core.lazy_exports import lazy_exports
from surgery.runtimes.shared.names import INFO_NAME, ONNX_NAME

if TYPE_CHECKING:
    from surgery.runtimes.onnx.onnx_export import export_onnx
    from surgery.runtimes.onnx.onnx_graph import ExportReport, read_export_info
    from surgery.runtimes.onnx.onnx_session import OnnxRuntimeModel, require_onnx
    from surgery.runtimes.shared.graph_export import Agreement, ExportParityError

# Imported on first use: the export pulls in torch, which `surgery --help` must not pay for.
__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "Agreement": "surgery.runtimes.shared.graph_export", "ExportParityError": "surgery.runtimes.shared.graph_export",
    "ExportReport": "surgery.runtimes.onnx.onnx_graph", "export_onnx": "surgery.runtimes.onnx.onnx_export",
    "read_export_info": "surgery.runtimes.onnx.onnx_graph", "OnnxRuntimeModel": "surgery.runtimes.onnx.onnx_session",
    "require_onnx": "surgery.runtimes.onnx.onnx_session",
})

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
