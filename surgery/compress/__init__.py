"""Target-driven compression: a latency table measured on the user's runtime, a search, the chosen model.

``surgery.compress`` is both this package and the function that runs it: the package is callable
(``surgery.compress(model, data, CompressConfig(speedup=2, runtime="openvino-int8"))`` is
:func:`surgery.compress.compress_run.compress`),
so the name means the same whichever was imported first.

Example:
    >>> import surgery
    >>> from surgery.compress import CompressConfig, SpeedupTarget
    >>> callable(surgery.compress), SpeedupTarget(speedup=2).describe()
    (True, '--speedup 2')
    >>> CompressConfig(speedup=8, runtime="openvino-int8").target.describe()
    '--speedup 8'
"""

from __future__ import annotations

import sys
import types
from importlib import import_module
from typing import Any

_LAZY = {
    "compress": "surgery.compress.compress_run", "plan_compress": "surgery.compress.plan",
    "SpeedupTarget": "surgery.compress.compress_report", "DropTarget": "surgery.compress.compress_report",
    "CompressReport": "surgery.compress.compress_report", "CompressResult": "surgery.compress.compress_report",
    "Structure": "surgery.compress.structure", "LayerShape": "surgery.compress.structure",
    "LatencyTable": "surgery.compress.latency_table", "CompressConfig": "surgery.compress.config",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'surgery.compress' has no attribute {name!r}")
    return getattr(import_module(module), name)


class _CallablePackage(types.ModuleType):
    """This package, callable as :func:`~surgery.compress.compress_run.compress`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from surgery.compress.compress_run import compress

        return compress(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
