"""The runtimes registered on this installation, by name, through the entry-point group ``surgery.runtimes``.

The built-in runtimes are entries of encoder-surgery's own ``pyproject.toml``; a third party adds one
the same way (``[project.entry-points."surgery.runtimes"] tensorrt = "mypkg.trt:TensorRTRuntime"``) or
in-process with :func:`register_runtime`. Resolving one name imports only that runtime's module, so
asking for ``torch`` never imports openvino. ``SURGERY_PLUGINS`` restricts third-party packages as
for strategies (:mod:`surgery.core.registry`).

Example:
    >>> "openvino-bf16" in runtime_names() and "torch" in runtime_names()
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
    from surgery.runtimes.shared.runtime import Runtime

#: The entry-point group runtimes register under (``name = "module:Class"``).
RUNTIME_GROUP = "surgery.runtimes"

#: Names registered in-process (tests, notebooks): name -> class, ahead of the entry points.
_registered: dict[str, type[Runtime]] = {}

#: How the built-ins are listed (fastest to set up first); third-party names follow alphabetically. A plugin
#: cannot take one of these names.
BUILTIN_ORDER = ("torch", "torch-bf16", "torch-fp16", "onnxruntime", "onnxruntime-int8", "openvino", "openvino-bf16",
                 "openvino-int8")


def _allowed(dist: str) -> bool:
    """Whether ``SURGERY_PLUGINS`` lets ``dist`` contribute (the built-ins always do), as for strategies."""
    spec = os.environ.get("SURGERY_PLUGINS")
    if spec is None or dist == BUILTIN_DISTRIBUTION:
        return True
    return dist in {s.strip() for s in spec.split(",") if s.strip()}


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a runtime's name (it names a folder of compress's output), else None.

    Example:
        >>> name_problem("tensorrt-fp16") is None
        True
        >>> name_problem("../../esc")
        "invalid runtime name '../../esc': use letters, digits, '-', '_' or '.', starting with a letter or digit"
    """
    if (not isinstance(name, str) or not name or not name[0].isalnum()
            or not all(c.isascii() and (c.isalnum() or c in "-_.") for c in name)):
        return f"invalid runtime name {name!r}: use letters, digits, '-', '_' or '.', starting with a letter or digit"
    return None


def _entry_points() -> tuple[dict[str, str], dict[str, str]]:
    """name -> ``module:Class`` of every allowed, valid entry point, and label -> why each refused one was refused.

    The first package to claim a name keeps it, and a built-in name belongs to encoder-surgery: a plugin that
    claims ``onnxruntime`` is refused and named, not silently put in its place.
    """
    found: dict[str, str] = {}
    owner: dict[str, str] = {}
    refused: dict[str, str] = {}
    for ep in metadata.entry_points(group=RUNTIME_GROUP):
        dist = ep.dist.name if ep.dist is not None else "<unknown>"
        if not _allowed(dist):
            continue
        if (problem := name_problem(ep.name)) is not None:
            refused[f"{ep.name} ({dist})"] = f"{problem}; the entry point of package {dist} is ignored"
        elif ep.name in BUILTIN_ORDER and dist != BUILTIN_DISTRIBUTION:
            refused[f"{ep.name} ({dist})"] = (f"package {dist} registers runtime {ep.name!r}, a built-in name of "
                                              "encoder-surgery; it is ignored (the plugin must pick another name)")
        elif ep.name in owner and owner[ep.name] != dist:
            refused[f"{ep.name} ({dist})"] = (f"package {dist} registers runtime {ep.name!r}, already registered by "
                                              f"{owner[ep.name]}; it is ignored")
        else:
            owner.setdefault(ep.name, dist)
            found.setdefault(ep.name, ep.value)
    return found, refused


def refused_runtimes() -> dict[str, str]:
    """Entry points that were not registered (an invalid name, a name already taken), by label, with why.

    Example:
        >>> refused_runtimes()
        {}
    """
    return _entry_points()[1]


def runtime_names() -> tuple[str, ...]:
    """Every registered runtime name (installed or not on this machine), built-ins first in their order."""
    points = _entry_points()[0]
    names = list(points) + [n for n in _registered if n not in points]
    order = {n: i for i, n in enumerate(BUILTIN_ORDER)}
    return tuple(sorted(dict.fromkeys(names), key=lambda n: (order.get(n, len(order)), n)))


def check_runtime_name(name: str, field: str = "runtime", *, also: tuple[str, ...] = ()) -> str:
    """``name`` if it is a registered runtime (or one of ``also``), else a one-line ConfigError listing the choices.

    Only the name is checked; whether the runtime runs on this machine is checked when it is used.

    Example:
        >>> check_runtime_name("openvino-int8"), check_runtime_name("auto", also=("auto",))
        ('openvino-int8', 'auto')
        >>> check_runtime_name("tensorrt-doc")
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: runtime 'tensorrt-doc' is not one of torch, torch-bf16, ...
    """
    known = runtime_names()
    if name in known or name in also:
        return name
    raise ConfigError(f"{field} {name!r} is not one of {', '.join([*known, *also])}")


def register_runtime(cls: type[Runtime]) -> type[Runtime]:
    """Register a :class:`~surgery.runtimes.shared.runtime.Runtime` subclass in-process under ``cls.name`` (a
    decorator).

    Example:
        >>> from surgery.runtimes.torch.torch_runtime import TorchRuntime
        >>> @register_runtime
        ... class Mine(TorchRuntime):
        ...     '''PyTorch under another name.'''
        ...     name = "mine-doc"
        >>> get_runtime("mine-doc").name
        'mine-doc'
    """
    name = getattr(cls, "name", "")
    if (problem := name_problem(name)) is not None:
        raise ValueError(problem)
    _registered[name] = cls
    return cls


def runtime_class(name: str) -> type[Runtime]:
    """The class registered as ``name`` (imports only its module); an unknown name is a one-line ConfigError."""
    from surgery.runtimes.shared.runtime import Runtime

    if name in _registered:
        return _registered[name]
    value = _entry_points()[0].get(name)
    if value is None:
        raise ConfigError(f"runtime {name!r} is not one of {', '.join(runtime_names())}")
    module, _, attr = value.partition(":")
    try:
        cls = getattr(import_module(module.strip()), attr.strip())
    except Exception as exc:  # a plugin's module may raise anything on import: one line, not a crash
        raise ConfigError(f"runtime {name!r} ({value}) failed to import: {type(exc).__name__}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Runtime)):
        raise ConfigError(f"runtime {name!r} ({value}) is not a surgery.runtimes.Runtime subclass")
    if getattr(cls, "name", None) != name:  # the class's own name labels its rows and names its output folder
        raise ConfigError(f"runtime {name!r} ({value}) calls itself {getattr(cls, 'name', None)!r}; the entry point "
                          "and the class's name must agree")
    return cls


def reason_unavailable(runtime: Runtime) -> str | None:
    """``runtime.unavailable()``, a check that raises turned into its one-line reason (a plugin's bug must not
    take down ``--runtime list`` or ``--runtime auto`` for everyone)."""
    try:
        reason = runtime.unavailable()
    except Exception as exc:
        return f"its availability check failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return None if reason is None else str(reason)


def get_runtime(name: str, *, require_available: bool = True) -> Runtime:
    """The runtime registered as ``name``; refused in one line when unknown or (by default) unavailable here.

    An unavailable runtime raises :class:`~surgery.runtimes.onnx.onnx_session.MissingDependencyError` when a package it
    declares (:attr:`~surgery.runtimes.shared.runtime.Runtime.packages`) is missing and
    :class:`~surgery.core.errors.ConfigError` otherwise (a CPU flag), each with the runtime's own reason and fix.

    Example:
        >>> get_runtime("tensorrt-doc")
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: runtime 'tensorrt-doc' is not one of torch, torch-bf16, ...
    """
    cls = runtime_class(name)
    try:
        runtime = cls()
    except Exception as exc:  # a plugin's constructor: one line
        raise ConfigError(f"runtime {name!r} could not be created: {type(exc).__name__}: {exc}") from None
    if require_available:
        reason = reason_unavailable(runtime)
        if reason is not None:
            from surgery.core.errors import MissingDependencyError

            error = MissingDependencyError if runtime.missing() is not None else ConfigError
            raise error(f"runtime {name!r} is not available here: {reason}")
    return runtime


def available_runtimes() -> dict[str, str | None]:
    """Every registered runtime name -> None where it runs on this machine, else the one-line reason.

    A runtime whose module fails to import, whose class cannot be built or whose check raises is reported
    unavailable with that error, not raised.
    """
    found: dict[str, str | None] = {}
    for name in runtime_names():
        try:
            found[name] = reason_unavailable(get_runtime(name, require_available=False))
        except ConfigError as exc:
            found[name] = str(exc)
    return found


def check_calibration_use(runtimes: list[Runtime], calibration: object, what: str = "bench") -> None:
    """Refuse calibration texts no named runtime uses, and a runtime that needs them without them (one line each).

    Reads only the runtimes' class attributes and checks, so the command line asks it before torch is imported.

    Example:
        >>> check_calibration_use([get_runtime("torch")], ["texts"])
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: bench: --calibration feeds the int8 runtimes; add --runtime onnxruntime-int8 \
or openvino-int8
    """
    if calibration is not None and calibration is not False and not any(r.needs_calibration for r in runtimes):
        raise ConfigError(f"{what}: --calibration feeds the int8 runtimes; add --runtime onnxruntime-int8 or "
                          "openvino-int8")
    for runtime in runtimes:
        runtime.check_calibration(calibration)
