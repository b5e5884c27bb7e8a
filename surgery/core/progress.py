"""Progress events: the library reports long work as data, the CLI draws the bars."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProgressEvent:
    """One step of long-running work.

    ``task`` names the work ("calibration", "epoch 2"), ``completed``/``total`` count its steps and
    ``info`` carries live figures (loss, accuracy, expert usage) for display.
    """

    task: str
    completed: int
    total: int | None = None
    info: dict[str, Any] = field(default_factory=dict)


ProgressCallback = Callable[[ProgressEvent], None]


def no_progress(event: ProgressEvent) -> None:
    """The default callback: ignore every event."""
