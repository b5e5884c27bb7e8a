"""Runtimes: one name per way to run a model (``torch``, ``torch-bf16``, ``onnxruntime``, ``onnxruntime-int8``,
``openvino``, ``openvino-int8``), shared by ``surgery export``, ``surgery bench`` and ``surgery compress``.

See :mod:`surgery.runtimes.base` for the interface and :mod:`surgery.runtimes.registry` for how runtimes
are found (the entry-point group ``surgery.runtimes``). The names and the registry import without
torch (the CLI builds its help from them); a runtime's own module loads when it is asked for.

Example:
    >>> from surgery.runtimes import runtime_names
    >>> runtime_names()[:2]
    ('torch', 'torch-bf16')
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from surgery.core.lazy_exports import lazy_exports
from surgery.runtimes.registry import (
    RUNTIME_GROUP,
    available_runtimes,
    get_runtime,
    register_runtime,
    runtime_class,
    runtime_names,
)

if TYPE_CHECKING:
    from surgery.runtimes.base import Runtime, RuntimeArtefact

__getattr__, __dir__ = lazy_exports(__name__, globals(), {"Runtime": "surgery.runtimes.base",
                                                          "RuntimeArtefact": "surgery.runtimes.base"})

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
