"""Deprecated: ``surgery.deploy`` moved into ``surgery.runtimes`` (one folder per runtime); removed in the next release.

Every old import still works for this release and warns once with a :class:`DeprecationWarning` naming the new
path: ``from surgery.deploy import export_onnx`` reads :mod:`surgery.runtimes.onnx`, and a module such as
``surgery.deploy.smooth`` is a thin alias of :mod:`surgery.runtimes.shared.smooth` (CHANGELOG.md lists every move).

Example:
    >>> import surgery.deploy
    >>> surgery.deploy.MOVED["smooth"], surgery.deploy.MOVED_NAMES["agreement"]
    ('surgery.runtimes.shared.smooth', 'surgery.runtimes.shared.graph_export')
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

#: Each old module of surgery.deploy and where it lives now.
MOVED: dict[str, str] = {
    "export": "surgery.runtimes.onnx.onnx_export",
    "runtime": "surgery.runtimes.onnx.onnx_session",
    "static_int8": "surgery.runtimes.onnx.static_int8",
    "fused_attention": "surgery.runtimes.onnx.fused_attention",
    "openvino_export": "surgery.runtimes.openvino.openvino_ir",
    "openvino_ir_bench": "surgery.runtimes.openvino.openvino_ir_bench",
    "quantized_refit": "surgery.runtimes.openvino.quantized_refit",
    "names": "surgery.runtimes.shared.names",
    "weight_products": "surgery.runtimes.shared.weight_products",
    "smooth": "surgery.runtimes.shared.smooth",
    "tokenizer": "surgery.runtimes.shared.tokenizer",
    "runtime_bench": "surgery.runtimes.shared.benched_model",
    "sentence_interop": "surgery.runtimes.sentence_interop",
}
#: Names that moved out of their old module (the old module's alias still finds them there).
MOVED_NAMES: dict[str, str] = {
    **dict.fromkeys(("Task", "SAMPLE_TEXTS", "ExportParityError", "Agreement", "ExportRecord", "export_record",
                     "SingleOutput", "export_target", "input_names", "parity_inputs", "agreement", "check_parity",
                     "check_export_settings", "quiet_loggers", "graph_feeds"),
                    "surgery.runtimes.shared.graph_export"),
    "MissingDependencyError": "surgery.core.errors",
    "export_openvino": "surgery.runtimes.openvino.openvino_export",
    "BenchedOnnxModel": "surgery.runtimes.onnx.onnx_session",
}
NEW_FACE = "surgery.runtimes.onnx"


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; import it from there ({old} goes in the next release)",
                  DeprecationWarning, stacklevel=3)


def _forward(old: str, new: str, name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(f"module {old!r} has no attribute {name!r}")
    for home in (new, MOVED_NAMES.get(name)):
        if home is not None:
            module = importlib.import_module(home)
            if hasattr(module, name):
                return getattr(module, name)
    raise AttributeError(f"module {old!r} has no attribute {name!r}")


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``surgery.deploy.<old module>`` as a thin module that reads its new home on first use."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        package, _, leaf = fullname.rpartition(".")
        if package != __name__ or leaf not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def exec_module(self, module: ModuleType) -> None:
        old, new = module.__name__, MOVED[module.__name__.rpartition(".")[2]]
        _deprecated(old, new)
        module.__getattr__ = lambda name: _forward(old, new, name)  # type: ignore[method-assign]
        module.__dir__ = lambda: dir(importlib.import_module(new))  # type: ignore[method-assign]


if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
    sys.meta_path.append(_AliasFinder())


def __getattr__(name: str) -> Any:
    if name.startswith("__"):  # tools probing the module (doctest, inspect): nothing moved under such a name
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _deprecated(f"surgery.deploy.{name}", f"{NEW_FACE}.{name}")
    value = _forward(__name__, NEW_FACE, name)
    globals()[name] = value
    return value
