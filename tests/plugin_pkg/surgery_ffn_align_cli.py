"""The command of surgery-ffn-align: ``surgery ffn-align-check MODEL_DIR`` (entry-point group ``surgery.commands``).

A module of its own that imports only typer: every ``surgery`` call, ``--help`` included, loads the
commands of every installed plugin, so torch, surgery's models and the strategy are imported inside
the command, when it runs.
"""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add ``ffn-align-check`` to the ``surgery`` command line."""

    @app.command("ffn-align-check")
    def ffn_align_check(
        model_dir: Annotated[str, typer.Argument(help="Model directory, or an embedded name such as minilm-l6.")],
        multiple: Annotated[int, typer.Option(min=1, help="Round each FFN width down to a multiple of this.")] = 64,
    ) -> None:
        """Show the FFN width of each layer and the width ffn-align would leave (nothing is changed)."""
        # Imported when the command runs, not when `surgery --help` lists it: they import torch.
        from surgery_ffn_align import FFNAlignStrategy

        import surgery
        from surgery.persist.assets import resolve_model_path

        model = surgery.from_pretrained(resolve_model_path(model_dir))
        plan = surgery.plan(model, FFNAlignStrategy(multiple=multiple))
        for layer in surgery.inspect(model).layers:
            cut = len(plan["neurons"].get(str(layer.index), []))
            typer.echo(f"layer {layer.index}: FFN width {layer.ffn_width} -> {layer.ffn_width - cut}")
