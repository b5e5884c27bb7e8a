"""The ``surgery`` command line (typer + rich), installed as ``surgery.cli``.

The library never prints; everything that draws tables, progress bars or error lines lives here:
:mod:`surgery.cli.app` (the commands and the error handling), :mod:`surgery.cli.inputs` (command-line
input to library objects) and :mod:`surgery.cli.render` (rich rendering). The console script
``surgery`` runs :func:`surgery.cli.main`, which imports the commands and runs
:func:`surgery.cli.app.main`; ``python -m surgery.cli`` does too.

Example:
    >>> from typer.testing import CliRunner
    >>> from surgery.cli.app import app
    >>> CliRunner().invoke(app, ["strategies", "--json"]).exit_code
    0
"""

from __future__ import annotations

import signal
import sys


def main() -> None:
    """Entry point of the ``surgery`` console script: Ctrl-C or SIGTERM while importing ends in one line too."""
    try:
        from surgery.cli.app import main as run
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("error: interrupted (SIGINT) while starting; nothing was done", file=sys.stderr)
        sys.exit(130)
    run()
