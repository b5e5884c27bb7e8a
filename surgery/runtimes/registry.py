"""The runtimes registered on this installation, by name, through the entry-point group ``surgery.runtimes``.

The built-in runtimes are entries of encoder-surgery's own ``pyproject.toml``; a third party adds one
the same way (``[project.entry-points."surgery.runtimes"] tensorrt = "mypkg.trt:TensorRTRuntime"``) or
in-process with :func:`register_runtime`. Resolving one name imports only that runtime's module, so
asking for ``torch`` never imports openvino. ``SURGERY_PLUGINS`` restricts third-party packages as
for strategies (:mod:`surgery.core.registry`).

Example:
    >>> "openvino-int8" in runtime_names() and "torch" in runtime_names()
    True
    >>> get_runtime("torch").name
    'torch'
    >>> available_runtimes()["torch"] is None
    True
"""

from __future__ import annotations

import os
from importlib import import_module, metadata
from typing import TYPE_CHECKING

from surgery.core.errors import ConfigError
from surgery.core.registry import BUILTIN_DISTRIBUTION

if TYPE_CHECKING:
    from surgery.runtimes.base import Runtime

#: The entry-point group runtimes register under (``name = "module:Class"``).
RUNTIME_GROUP = "surgery.runtimes"

#: Names registered in-process (tests, notebooks): name -> class, ahead of the entry points.
_registered: dict[str, type[Runtime]] = {}


def _allowed(dist: str) -> bool:
    """Whether ``SURGERY_PLUGINS`` lets ``dist`` contribute (the built-ins always do), as for strategies."""
    spec = os.environ.get("SURGERY_PLUGINS")
    if spec is None or dist == BUILTIN_DISTRIBUTION:
        return True
    return dist in {s.strip() for s in spec.split(",") if s.strip()}


def _entry_points() -> dict[str, str]:
    """name -> ``module:Class`` of every allowed entry point; the first package to claim a name keeps it."""
    found: dict[str, str] = {}
    for ep in metadata.entry_points(group=RUNTIME_GROUP):
        dist = ep.dist.name if ep.dist is not None else "<unknown>"
        if _allowed(dist):
            found.setdefault(ep.name, ep.value)
    return found


def runtime_names() -> tuple[str, ...]:
    """Every registered runtime name (installed or not on this machine), built-ins first in their order."""
    names = list(_entry_points()) + [n for n in _registered if n not in _entry_points()]
    order = {n: i for i, n in enumerate(BUILTIN_ORDER)}
    return tuple(sorted(dict.fromkeys(names), key=lambda n: (order.get(n, len(order)), n)))


#: How the built-ins are listed (fastest to set up first); third-party names follow alphabetically.
BUILTIN_ORDER = ("torch", "torch-bf16", "torch-fp16", "onnxruntime", "onnxruntime-int8", "openvino", "openvino-int8")


def register_runtime(cls: type[Runtime]) -> type[Runtime]:
    """Register a :class:`~surgery.runtimes.base.Runtime` subclass in-process under ``cls.name`` (a decorator).

    Example:
        >>> from surgery.runtimes.torch_runtime import TorchRuntime
        >>> @register_runtime
        ... class Mine(TorchRuntime):
        ...     '''PyTorch under another name.'''
        ...     name = "mine-doc"
        >>> get_runtime("mine-doc").name
        'mine-doc'
    """
    name = getattr(cls, "name", "")
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ValueError(f"invalid runtime name {name!r}: use letters, digits, '-', '_' or '.'")
    _registered[name] = cls
    return cls


def runtime_class(name: str) -> type[Runtime]:
    """The class registered as ``name`` (imports only its module); an unknown name is a one-line ConfigError."""
    from surgery.runtimes.base import Runtime

    if name in _registered:
        return _registered[name]
    value = _entry_points().get(name)
    if value is None:
        raise ConfigError(f"runtime {name!r} is not one of {', '.join(runtime_names())}")
    module, _, attr = value.partition(":")
    try:
        cls = getattr(import_module(module.strip()), attr.strip())
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"runtime {name!r} ({value}) failed to import: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Runtime)):
        raise ConfigError(f"runtime {name!r} ({value}) is not a surgery.runtimes.Runtime subclass")
    return cls


def get_runtime(name: str, *, require_available: bool = True) -> Runtime:
    """The runtime registered as ``name``; refused in one line when unknown or (by default) unavailable here.

    An unavailable runtime raises :class:`~surgery.deploy.runtime.MissingDependencyError` when a package
    is missing and :class:`~surgery.core.errors.ConfigError` otherwise (a CPU flag), each with the runtime's
    own reason and fix.

    Example:
        >>> get_runtime("tensorrt-doc")
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: runtime 'tensorrt-doc' is not one of torch, torch-bf16, ...
    """
    runtime = runtime_class(name)()
    if require_available:
        reason = runtime.unavailable()
        if reason is not None:
            from surgery.deploy.runtime import MissingDependencyError

            error = MissingDependencyError if "pip install" in reason else ConfigError
            raise error(f"runtime {name!r} is not available here: {reason}")
    return runtime


def available_runtimes() -> dict[str, str | None]:
    """Every registered runtime name -> None where it runs on this machine, else the one-line reason.

    A runtime whose module fails to import is reported unavailable with that error, not raised.
    """
    found: dict[str, str | None] = {}
    for name in runtime_names():
        try:
            found[name] = runtime_class(name)().unavailable()
        except ConfigError as exc:
            found[name] = str(exc)
    return found
