"""Plugin discovery through entry points.

Methods (a :class:`~surgery.core.strategy.Strategy`, one replayable step, or a
:class:`~surgery.orchestration.pipeline.Pipeline` of recorded steps with training between) live in the
entry-point group ``surgery.strategies`` (its name predates pipelines; third-party packages register
under it, so it stays), anatomy adapters in
``surgery.encoders`` and command-line commands in ``surgery.commands`` (functions that add commands
to the ``surgery`` typer app, see :mod:`surgery.cli.plugins`). The built-ins are registered in this
package's own ``pyproject.toml`` and are loaded through exactly the same path as third-party plugins.
``register_method`` and ``register_adapter`` add classes in-process (for notebooks and tests).

Set ``SURGERY_PLUGINS`` to a comma-separated list of distribution names to restrict which
installed packages may contribute plugins (the built-ins of ``encoder-surgery`` always load);
set it to the empty string to load the built-ins only.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from surgery.core.errors import StrategyNotFoundError, UnsupportedModelError

if TYPE_CHECKING:
    from surgery.anatomy.base import EncoderAdapter
    from surgery.core.strategy import Method

STRATEGY_GROUP = "surgery.strategies"
ENCODER_GROUP = "surgery.encoders"
COMMAND_GROUP = "surgery.commands"
BUILTIN_DISTRIBUTION = "encoder-surgery"


@dataclass(frozen=True)
class PluginInfo:
    """Where a registered class came from."""

    name: str
    obj: Any
    source: str  # distribution name, or "<runtime>" for register_* calls
    summary: str


_runtime: dict[str, dict[str, PluginInfo]] = {STRATEGY_GROUP: {}, ENCODER_GROUP: {}, COMMAND_GROUP: {}}
_cache: dict[str, dict[str, PluginInfo]] = {}  # group -> every plugin of it, imported
_single: dict[str, PluginInfo | None] = {}  # method name -> that one entry point, imported on its own
_by_model_type: dict[str, type[EncoderAdapter]] = {}  # adapters by config.model_type, built once


def _allowed(dist: str) -> bool:
    spec = os.environ.get("SURGERY_PLUGINS")
    if spec is None or dist == BUILTIN_DISTRIBUTION:
        return True
    return dist in {s.strip() for s in spec.split(",") if s.strip()}


def _discover(group: str) -> dict[str, PluginInfo]:
    if group not in _cache:
        _cache[group] = _load(metadata.entry_points(group=group))
    return _cache[group]


def _load(entry_points: Iterable[metadata.EntryPoint]) -> dict[str, PluginInfo]:
    """Import ``entry_points`` (of one group); a name registered twice keeps the first distribution's."""
    found: dict[str, PluginInfo] = {}
    for ep in entry_points:
        dist = ep.dist.name if ep.dist is not None else "<unknown>"
        if not _allowed(dist):
            continue
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plugin must not take the library down
            warnings.warn(
                f"surgery plugin {ep.name!r} from {dist} ({ep.value}) failed to import and is skipped: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        if ep.name in found and found[ep.name].source != dist:
            warnings.warn(
                f"surgery plugin name {ep.name!r} is registered by both {found[ep.name].source} and {dist}; "
                f"using {found[ep.name].source}",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        found[ep.name] = PluginInfo(ep.name, obj, dist, _summary(obj))
    return found


def _summary(obj: Any) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


def refresh() -> None:
    """Forget discovered plugins so the next lookup reads the entry points again."""
    _cache.clear()
    _single.clear()
    _by_model_type.clear()


def _all(group: str) -> dict[str, PluginInfo]:
    merged = dict(_discover(group))
    merged.update(_runtime[group])
    return merged


# -- strategies --------------------------------------------------------------------------
def register_method(cls: type[Method], *, source: str = "<runtime>") -> type[Method]:
    """Register a method class (a strategy or a pipeline) in-process under ``cls.name``. Usable as a decorator.

    Example:
        >>> from surgery import Strategy, StrategyConfig
        >>> class NoopConfig(StrategyConfig):
        ...     pass
        >>> @register_method
        ... class Noop(Strategy):
        ...     '''Does nothing.'''
        ...     name = "noop-doc"
        ...     config_class = NoopConfig
        ...     def plan(self, model, data=None, context=None): return {}
        ...     def apply(self, model, plan): return []
        >>> get_method("noop-doc") is Noop
        True
    """
    _check_name(cls.name)
    _runtime[STRATEGY_GROUP][cls.name] = PluginInfo(cls.name, cls, source, _summary(cls))
    return cls


def _check_name(name: str) -> None:
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ValueError(f"invalid strategy name {name!r}: use letters, digits, '-', '_' or '.'")


def methods() -> dict[str, PluginInfo]:
    """All registered methods (strategies and pipelines) by name, with their source package and one line of help."""
    return dict(sorted(_all(STRATEGY_GROUP).items()))


def _static_summary(value: str) -> str | None:
    """The first docstring line of ``module:Class`` read from its source file, without importing the module."""
    module, _, attr = value.partition(":")
    parts = module.split(".")
    leaf = parts[-1]
    # find_spec of a dotted name runs every parent package's __init__ (which may import torch), so
    # look up at most the first two levels and walk the folders below them.
    base, rest = ".".join(parts[:2] if len(parts) > 2 else parts[:-1]), parts[2:-1]
    try:
        spec = importlib.util.find_spec(base) if base else None
        roots = [Path(r).joinpath(*rest) for r in (spec.submodule_search_locations or [])] if spec else []
        files = [Path(r) / f"{leaf}.py" for r in roots] + [Path(r) / leaf / "__init__.py" for r in roots]
        source = next(f for f in files if f.is_file())
        tree = ast.parse(source.read_text())
    except (ImportError, ValueError, StopIteration, OSError, SyntaxError):
        return None
    # A kept old name (``Old = New`` at module level) reads the class it names: installed metadata
    # may still point at the old name until the package is reinstalled.
    aliases = {target.id: node.value.id for node in tree.body if isinstance(node, ast.Assign)
               and isinstance(node.value, ast.Name) for target in node.targets if isinstance(target, ast.Name)}
    name = aliases.get(attr.strip(), attr.strip())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            doc = (ast.get_docstring(node) or "").strip()
            return doc.splitlines()[0] if doc else ""
    return None


def method_catalog() -> dict[str, PluginInfo]:
    """Every registered strategy with its package and one line of help, without importing plugins where possible.

    The help line is read from the class's source; ``obj`` is ``None`` for classes that were not
    imported (use :func:`get_method` for the class itself).

    Example:
        >>> method_catalog()["head-prune"].summary.startswith("Remove attention heads")
        True
    """
    if STRATEGY_GROUP in _cache:
        return methods()
    found: dict[str, PluginInfo] = {}
    for ep in metadata.entry_points(group=STRATEGY_GROUP):
        dist = ep.dist.name if ep.dist is not None else "<unknown>"
        if not _allowed(dist) or ep.name in found:
            continue
        summary = _static_summary(ep.value)
        if summary is None:
            return methods()  # a plugin that cannot be read statically: import them all
        found[ep.name] = PluginInfo(ep.name, None, dist, summary)
    found.update(_runtime[STRATEGY_GROUP])
    return dict(sorted(found.items()))


def method_names() -> list[str]:
    """The names of every registered strategy, read from the entry points without importing any plugin."""
    names = {ep.name for ep in metadata.entry_points(group=STRATEGY_GROUP)
             if _allowed(ep.dist.name if ep.dist is not None else "<unknown>")}
    return sorted(names | set(_runtime[STRATEGY_GROUP]))


def get_method(name: str) -> type[Method]:
    """The method class (a strategy or a pipeline) registered as ``name``.

    Raises:
        StrategyNotFoundError: with the installed names and how to install more.
    """
    info = _runtime[STRATEGY_GROUP].get(name) or _one_strategy(name)
    if info is None:  # answered from the entry-point names alone, before any plugin (and torch) is imported
        raise StrategyNotFoundError(
            f"unknown strategy {name!r}; installed strategies: {', '.join(method_names()) or 'none'}. Install "
            f"the package that provides it (it registers under the entry-point group {STRATEGY_GROUP!r})"
        )
    return info.obj


def _one_strategy(name: str) -> PluginInfo | None:
    """The method registered as ``name``, importing only its own entry point's module (not every method's)."""
    if STRATEGY_GROUP in _cache:
        return _cache[STRATEGY_GROUP].get(name)
    if name not in _single:
        _single[name] = _load(metadata.entry_points(group=STRATEGY_GROUP, name=name)).get(name)
    return _single[name]


# -- command-line commands ---------------------------------------------------------------
def commands() -> dict[str, PluginInfo]:
    """Every command plugin by entry-point name; ``obj`` is its function that adds commands to the typer app.

    A plugin whose module fails to import is skipped with a RuntimeWarning naming the entry point.

    Example:
        >>> commands()["experts"].source
        'encoder-surgery'
    """
    return dict(sorted(_all(COMMAND_GROUP).items()))


# -- encoder adapters --------------------------------------------------------------------
def register_adapter(cls: type[EncoderAdapter], *, name: str | None = None) -> type[EncoderAdapter]:
    """Register an anatomy adapter in-process for the ``config.model_type`` values it lists."""
    key = name or cls.__name__
    _runtime[ENCODER_GROUP][key] = PluginInfo(key, cls, "<runtime>", _summary(cls))
    _by_model_type.clear()
    return cls


def adapters() -> dict[str, type[EncoderAdapter]]:
    """Map every supported ``config.model_type`` to its adapter class."""
    return dict(_adapter_table())


def _adapter_table() -> dict[str, type[EncoderAdapter]]:
    # Built once (every surgery call asks for its model's adapter), again after register_adapter or refresh.
    if not _by_model_type:
        by_type = {model_type: info.obj for info in _all(ENCODER_GROUP).values()
                   for model_type in getattr(info.obj, "model_types", ())}
        _by_model_type.update(sorted(by_type.items()))
    return _by_model_type


def adapter_class_for(model_type: str) -> type[EncoderAdapter]:
    """The adapter class for a ``config.model_type``.

    Raises:
        UnsupportedModelError: naming the supported types and how to add an adapter.
    """
    table = _adapter_table()
    if model_type not in table:
        raise UnsupportedModelError(
            f"unsupported model type {model_type!r}; supported: {', '.join(table) or 'none'}. To add one, "
            f"subclass surgery.anatomy.EncoderAdapter and register it under the entry-point group {ENCODER_GROUP!r}"
        )
    return table[model_type]
