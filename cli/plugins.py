"""Commands that packages add to ``surgery``: the entry-point group ``surgery.commands``.

It works like llm's ``register_commands`` hook. An entry point names a function that takes the
``surgery`` typer app and adds its commands to it::

    [project.entry-points."surgery.commands"]
    my-method = "my_package.cli:register"

surgery's own ``experts`` command registers the same way (see ``pyproject.toml``). Every
``surgery`` call, ``--help`` included, imports each command plugin's module, so that module must
stay light: import torch, transformers and the method inside the command's body. A plugin that
fails to import, fails while registering, or takes a command name that is already used is skipped
with one warning line naming its entry point; the other commands keep working.
``SURGERY_PLUGINS`` restricts which packages may add commands, as it does for strategies.

Example:
    >>> import typer
    >>> app = typer.Typer()
    >>> add_plugin_commands(app)
    []
    >>> [group.name for group in app.registered_groups]
    ['experts']
"""

from __future__ import annotations

import warnings
from collections import Counter

import typer
from typer.main import get_command_name

from surgery.core import registry


def command_names(app: typer.Typer) -> list[str]:
    """The names of the commands and command groups registered on ``app`` (where they are known).

    Example:
        >>> app = typer.Typer()
        >>> @app.command()
        ... def show_widths() -> None: ...
        >>> command_names(app)
        ['show-widths']
    """
    names = [c.name or get_command_name(c.callback.__name__) for c in app.registered_commands if c.callback]
    for group in app.registered_groups:
        # A group's name is given to add_typer, or to the sub-app's Typer(name=...); unset values are placeholders.
        given = [group.name, group.typer_instance.info.name if group.typer_instance else None]
        names.extend([name for name in given if isinstance(name, str)][:1])
    return names


def add_plugin_commands(app: typer.Typer) -> list[str]:
    """Let every installed command plugin add its commands to ``app``; returns one line per plugin skipped."""
    with warnings.catch_warnings(record=True) as caught:  # a plugin that fails to import
        warnings.simplefilter("always")
        plugins = registry.commands()
    problems = [" ".join(str(w.message).split()) for w in caught]
    for name, info in plugins.items():
        taken = command_names(app)
        commands, groups = list(app.registered_commands), list(app.registered_groups)
        try:
            info.obj(app)
            added = Counter(command_names(app)) - Counter(taken)
            clash = sorted(set(added) & set(taken))
            if clash:
                raise ValueError(f"command name {', '.join(map(repr, clash))} is already used")
        except Exception as exc:  # a broken plugin must not take the command line down
            app.registered_commands[:], app.registered_groups[:] = commands, groups
            detail = " ".join(str(exc).split()) or type(exc).__name__
            problems.append(f"surgery command plugin {name!r} from {info.source} failed to register and is "
                            f"skipped: {detail}")
    return problems
