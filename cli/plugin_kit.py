"""What a command plugin builds its commands from: the public part of ``surgery.cli`` for plugins.

A package that adds commands through the ``surgery.commands`` entry point (:mod:`surgery.cli.plugins`)
imports from this module only; the other modules of ``surgery.cli`` may change between releases.
surgery's own ``surgery experts`` (:mod:`surgery.cli.experts`) is built from it the same way.

What is here: the run's state (``CliState``: ``--debug``, ``--quiet``) and its consoles; the shared
options (``Seed``, ``BatchSize``, ...) so a plugin's flags read like surgery's; ``--config``/``--set``
parsing; the one rule for output paths (:func:`decide_outputs`: nothing a user owns is overwritten
without ``--overwrite``); progress display and value formatting; and, imported on first use since
they load torch, the one input-preparation path (``prepare_inputs`` with ``DataFiles`` and
``DataOptions``). A :class:`~surgery.core.errors.SurgeryError` raised in a command becomes a
one-line error and exit status 2, as for surgery's own commands.

Example:
    >>> import typer
    >>> from typer.testing import CliRunner
    >>> app = typer.Typer()
    >>> @app.command()
    ... def widths(config: str, sets: list[str] | None = None) -> None:
    ...     stdout().print(strategy_settings(None, sets or ["ratio=0.5"]))
    >>> CliRunner().invoke(app, ["x"]).output
    "{'ratio': 0.5}\\n"
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from surgery.cli.console import CliState, note, stderr, stdout
from surgery.cli.inputs import read_model_config, strategy_settings
from surgery.cli.options import (
    BatchSize,
    LabelColumn,
    MaxLength,
    MaxTrain,
    Overwrite,
    Seed,
    TextColumn,
    TextPairColumn,
)
from surgery.cli.outputs import Outputs, decide_outputs
from surgery.cli.render import ProgressDisplay, format_value
from surgery.core.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from surgery.cli.prepare import DataFiles, DataOptions, prepare_inputs

# Loaded on first use: preparing inputs imports torch and transformers, which `surgery --help` must not pay for.
__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "DataFiles": "surgery.cli.prepare", "DataOptions": "surgery.cli.prepare", "prepare_inputs": "surgery.cli.prepare",
})

__all__ = [
    "BatchSize",
    "CliState",
    "DataFiles",
    "DataOptions",
    "LabelColumn",
    "MaxLength",
    "MaxTrain",
    "Outputs",
    "Overwrite",
    "ProgressDisplay",
    "Seed",
    "TextColumn",
    "TextPairColumn",
    "decide_outputs",
    "format_value",
    "note",
    "prepare_inputs",
    "read_model_config",
    "stderr",
    "stdout",
    "strategy_settings",
]
