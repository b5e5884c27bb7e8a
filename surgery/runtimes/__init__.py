"""Runtimes: one name per way to run a model (``torch``, ``torch-bf16``, ``onnxruntime``, ``onnxruntime-int8``,
``openvino``, ``openvino-int8``), shared by ``surgery export``, ``surgery bench`` and ``surgery compress``.

See :mod:`surgery.runtimes.shared.runtime` for the interface and :mod:`surgery.runtimes.runtime_registry` for how
runtimes are found (the entry-point group ``surgery.runtimes``). The names and the registry import without
torch (the CLI builds its help from them); a runtime's own module loads when it is asked for.

Layout: each runtime family is one folder holding its exporter, its served model and its Runtime classes
(``torch/``, ``onnx/``, ``openvino/``); what several share is ``shared/``; this package's own modules (the
registry, the export verb :mod:`surgery.runtimes.export_config`, sentence-transformers interop, the
cross-runtime bench) sit above them all.

Example:
    >>> from surgery.runtimes import runtime_names
    >>> runtime_names()[:2]
    ('torch', 'torch-bf16')
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from surgery.core.lazy_exports import lazy_exports
from surgery.runtimes.runtime_registry import (
    RUNTIME_GROUP,
    available_runtimes,
    get_runtime,
    register_runtime,
    runtime_class,
    runtime_names,
)

if TYPE_CHECKING:
    from surgery.runtimes.shared.runtime import Runtime, RuntimeArtefact

__getattr__, __dir__ = lazy_exports(__name__, globals(), {"Runtime": "surgery.runtimes.shared.runtime",
                                                          "RuntimeArtefact": "surgery.runtimes.shared.runtime"})

__all__ = [
    "RUNTIME_GROUP",
    "Runtime",
    "RuntimeArtefact",
    "available_runtimes",
    "get_runtime",
    "register_runtime",
    "runtime_class",
    "runtime_names",
]
