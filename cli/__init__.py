"""The ``surgery`` command line (typer + rich), installed as ``surgery.cli``.

The library never prints; everything that draws tables, progress bars or error lines lives here.
The console script ``surgery`` runs :func:`surgery.cli.app.main`; ``python -m surgery.cli`` does too.

Example:
    >>> from typer.testing import CliRunner
    >>> from surgery.cli import app
    >>> CliRunner().invoke(app, ["strategies", "--json"]).exit_code
    0
"""

from __future__ import annotations

from surgery.cli.app import app, main

__all__ = ["app", "main"]
