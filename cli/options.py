"""Command-line options shared by several commands (one definition, one help text).

Example:
    >>> from typer.testing import CliRunner
    >>> app = typer.Typer()
    >>> @app.command()
    ... def show(text_column: TextColumn = "text") -> None:
    ...     print(text_column)
    >>> CliRunner().invoke(app, ["--text-column", "sentence"]).output
    'sentence\\n'
"""

from __future__ import annotations

from typing import Annotated

import typer

from surgery.persist.config_values import MAX_BATCH

#: Upper bounds of counts, so that a typo (an extra zero or six) is refused in one line instead of running for days
#: (MAX_BATCH is the library's, shared with the Python configs).
MAX_ROUNDS = 10_000
MAX_EPOCHS = 1_000
MAX_TEXTS = 1_000_000

TextColumn = Annotated[str, typer.Option(help="Column holding the text.")]
TextPairColumn = Annotated[str | None, typer.Option(help="Column holding the second text of a pair.")]
LabelColumn = Annotated[str, typer.Option(help="Column holding the label.")]
MaxLength = Annotated[int, typer.Option(min=1, help="Tokens per text (longer texts are truncated).")]
MaxLengthAuto = Annotated[int | None, typer.Option(
    "--max-length", min=1, help="Tokens per text (longer texts are truncated); default: the model's own limit, "
    "capped by the 99th percentile of the data's token lengths (rounded up to a multiple of 8).")]
BatchSize = Annotated[int, typer.Option(min=1, max=MAX_BATCH, help="Batch size of the data loaders.")]
Seed = Annotated[int, typer.Option(help="Seed of the evaluation split(s), new heads and the strategy.")]
MaxTrain = Annotated[int | None, typer.Option(min=1, help="Use at most N training examples (per task).")]
EvalData = Annotated[str | None, typer.Option("--eval-data", help="Evaluation data; default: a seeded 10% split of "
                                              "--data.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out (or result file) that "
                                         "surgery wrote and nobody changed since (its manifest says so).")]
Int8Fp32 = Annotated[list[str] | None, typer.Option(
    "--int8-fp32", help="With --runtime onnxruntime-int8: keep this part of every layer in fp32 (attention, ffn, "
    "ffn-up, ffn-down; repeatable): mixed precision when full int8 moves the outputs too far.")]
Calibration = Annotated[str | None, typer.Option(
    "--calibration", help="With an int8 runtime (onnxruntime-int8, openvino-int8): texts like the ones the model "
    "will serve (.txt, one per line, or a table's --text-column; labels ignored); the activations are smoothed on "
    "them before quantization (SmoothQuant), which keeps int8 closer to fp32 (openvino-int8 also calibrates on "
    "them and needs them).")]
CalibrationTexts = Annotated[int, typer.Option(min=1, max=MAX_TEXTS, help="With --calibration: how many texts to "
                                               "calibrate on (a seeded sample).")]
SmoothAlpha = Annotated[float, typer.Option(min=0.0, max=1.0, help="With --calibration: SmoothQuant's migration "
                                            "strength (0 leaves activations alone, 1 flattens them fully).")]
