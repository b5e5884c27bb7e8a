"""The ``surgery`` command line (typer + rich), installed as ``surgery.cli``.

The library never prints; everything that draws tables, progress bars or error lines lives here:
:mod:`surgery.cli.app` (the commands and the error handling), :mod:`surgery.cli.inputs` (command-line
input to library objects) and :mod:`surgery.cli.render` (rich rendering). The console script
``surgery`` runs :func:`surgery.cli.app.main`; ``python -m surgery.cli`` does too.

Example:
    >>> from typer.testing import CliRunner
    >>> from surgery.cli.app import app
    >>> CliRunner().invoke(app, ["strategies", "--json"]).exit_code
    0
"""
