"""The training tier: distillation from the original, as many epochs as the time left allows.

The epoch time is estimated from one timed training step (the student's forward and backward and
the teacher's forward on one batch) times the steps of an epoch, with the Trainer's overhead on top;
the number of epochs is what fits the seconds left, never more than ``max_epochs``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn

from surgery.core.progress import ProgressCallback
from surgery.scoring.importance import batches_on, model_device
from surgery.training import RecoveryConfig, RecoveryResult, recover

#: The HF Trainer's cost over a bare step (data loading, optimiser, logging, evaluation each epoch).
TRAINER_OVERHEAD = 1.3


def seconds_per_epoch(student: nn.Module, teacher: nn.Module, data: Any, batch_size: int) -> float:
    """Estimated seconds of one distillation epoch of ``student`` from ``teacher`` over ``data``'s training split.

    Example:
        >>> import copy, datasets
        >>> from surgery.data.task_data import TaskData
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"))
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[2, 5, 3]] * 8, "labels": [0, 1] * 4})
        >>> seconds_per_epoch(model, copy.deepcopy(model), TaskData(rows, rows, ["a", "b", "c"]), 4) > 0
        True
    """
    loader = data.loader("train", batch_size=batch_size)
    batch = next(batches_on(loader, model_device(student)))
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    was = student.training
    student.train()
    try:
        elapsed = []
        for _ in range(2):  # the first step pays for allocations; the second is the one that counts
            start = time.perf_counter()
            with torch.no_grad():
                teacher(**inputs)
            out = student(**inputs)
            main = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
            main.float().square().mean().backward()
            elapsed.append(time.perf_counter() - start)
    finally:
        student.zero_grad(set_to_none=True)
        student.train(was)
    return elapsed[-1] * len(loader) * TRAINER_OVERHEAD


def epochs_that_fit(seconds_left: float, epoch_seconds: float, max_epochs: int) -> int:
    """Whole epochs that fit in ``seconds_left`` (0 when not even one does).

    Example:
        >>> epochs_that_fit(100.0, 30.0, 5), epochs_that_fit(20.0, 30.0, 5), epochs_that_fit(1e9, 1.0, 3)
        (3, 0, 3)
    """
    if epoch_seconds <= 0 or seconds_left <= 0:
        return 0
    return max(0, min(max_epochs, math.floor(seconds_left / epoch_seconds)))


def distil(student: nn.Module, teacher: nn.Module, data: Any, *, epochs: int, batch_size: int, seed: int = 0,
           progress: ProgressCallback | None = None) -> RecoveryResult:
    """Distil the original into the cut model for ``epochs`` (surgery's recovery, HF Trainer)."""
    config = RecoveryConfig(epochs=epochs, batch_size=batch_size, seed=seed)
    return recover(student, teacher, data, config, progress=progress)
