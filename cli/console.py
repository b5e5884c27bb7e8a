"""Console plumbing shared by the ``surgery`` commands: global state, output streams, notes, quiet data loading.

Results go to stdout, progress, notes and warnings to stderr; consoles are created per call so that
redirected streams (tests, pipes) and the terminal width are picked up.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console
from rich.text import Text

from surgery.core.distributed import is_main_process


@dataclass
class CliState:
    """Global options, shared with the error handler through the click context object."""

    debug: bool = False
    allow_pickle: bool = False


#: Width of the output when it is not a terminal (a file, a pipe, a CI log) and COLUMNS is unset:
#: nothing there wraps lines, so tables keep every column instead of being cut to rich's default 80.
REDIRECTED_WIDTH = 500


def _width(stream: TextIO) -> int | None:
    if os.environ.get("COLUMNS") or (hasattr(stream, "isatty") and stream.isatty()):
        return None  # rich reads the terminal or COLUMNS
    return REDIRECTED_WIDTH


def stdout() -> Console:
    """A console on stdout (results).

    Example:
        >>> stdout().width >= 80
        True
    """
    return Console(highlight=False, width=_width(sys.stdout))


def stderr() -> Console:
    """A console on stderr (progress, notes, warnings)."""
    return Console(stderr=True, highlight=False, width=_width(sys.stderr))


def note(message: str) -> None:
    """Print ``note: message`` to stderr, on one line whatever the width (a note is grep-able progress).

    Under torchrun only the main process notes: the others would repeat every line.
    """
    if not is_main_process():
        return
    stderr().print(Text.assemble(("note: ", "bold blue"), message), soft_wrap=True)


@contextmanager
def quiet_datasets(debug: bool) -> Iterator[None]:
    """No ``datasets`` map/filter progress bars unless --debug (imported only when data is read)."""
    import datasets

    bars = datasets.utils.logging.is_progress_bar_enabled()
    if not debug:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if bars:
            datasets.enable_progress_bars()
