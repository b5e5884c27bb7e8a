"""Package attributes imported on first use, so that ``import surgery`` and ``surgery --help`` stay cheap.

A package lists ``name -> module`` and installs the pair this module returns as its own
``__getattr__`` and ``__dir__`` (PEP 562); the first lookup imports the module and caches the value
in the package's namespace, so later lookups never come back here.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, MutableMapping
from importlib import import_module
from typing import Any


def lazy_exports(package: str, namespace: MutableMapping[str, Any], table: Mapping[str, str], *,
                 modules: Collection[str] = ()) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: each name in ``table`` is read from its module on first use.

    Names in ``modules`` are modules themselves (``surgery.strategies``), not attributes of one.

    Example:
        >>> ns: dict[str, Any] = {}
        >>> getattr_, dir_ = lazy_exports("demo", ns, {"dumps": "json", "json": "json"}, modules={"json"})
        >>> getattr_("dumps")([1]), getattr_("json").__name__, "dumps" in ns, dir_()
        ('[1]', 'json', True, ['dumps', 'json'])
    """

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = import_module(module) if name in modules else getattr(import_module(module), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *table})

    return __getattr__, __dir__
