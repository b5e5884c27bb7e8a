"""Console plumbing shared by the ``surgery`` commands: global state, output streams, notes, quiet data loading.

Results go to stdout, progress, notes and warnings to stderr; consoles are created per call so that
redirected streams (tests, pipes) and the terminal width are picked up.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console
from rich.text import Text


@dataclass
class CliState:
    """Global options, shared with the error handler through the click context object."""

    debug: bool = False


def stdout() -> Console:
    """A console on stdout (results)."""
    return Console(highlight=False)


def stderr() -> Console:
    """A console on stderr (progress, notes, warnings)."""
    return Console(stderr=True, highlight=False)


def note(message: str) -> None:
    """Print ``note: message`` to stderr."""
    stderr().print(Text.assemble(("note: ", "bold blue"), message))


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
