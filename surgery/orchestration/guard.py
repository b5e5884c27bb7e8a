"""The guard against silent loss: measure every structural step, recover a step that loses too much.

A step is measured on the evaluation split of the task data (for sequence classifiers) before and
after it is applied. With a :class:`~surgery.training.RecoveryConfig`, a copy of the model before
the step is kept as the teacher, and recovery (distillation) runs

* after a direct ``convert`` step always, or only when the drop exceeds ``max_drop`` if set;
* inside a pipeline only when the drop exceeds ``max_drop`` (the pipeline trains on its own), and
  never after a step marked ``trained_after`` (fresh experts, a new prompt), whose drop is only
  recorded.

A loss that remains above ``max_drop`` is recorded in the report (``report.warnings``); the CLI
prints it and ``surgery apply --strict`` exits 3.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import nn

from surgery.core.progress import ProgressCallback
from surgery.core.report import StepCheck, SurgeryReport

if TYPE_CHECKING:
    from surgery.core.strategy import Strategy
    from surgery.training import RecoveryConfig


def measurable(model: nn.Module, data: Any) -> bool:
    """Whether the guard can measure ``model`` on ``data``: a sequence classifier and labelled eval data."""
    from surgery.data.task_data import TaskData

    return (isinstance(data, TaskData) and data.eval is not None and "labels" in data.eval.column_names
            and type(model).__name__.endswith("ForSequenceClassification"))


def _points(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else round(100.0 * (before - after), 4)


def guarded_step(model: nn.Module, strategy: Strategy, do_step: Callable[[], SurgeryReport], *, index: int,
                 data: Any, recovery: RecoveryConfig | None, in_pipeline: bool,
                 progress: ProgressCallback | None = None,
                 reference: nn.Module | None = None) -> tuple[SurgeryReport, StepCheck | None]:
    """Run ``do_step`` (which applies ``strategy`` to ``model``) between two measurements; recover if asked.

    With a ``reference`` (the original model a surgered input came from), "before" is the
    reference's accuracy and recovery distils from the reference, so the drop is the loss against
    the original; without one, both are the model's own state before the step.

    Returns the step's report and the guard's check (None when nothing could be measured or recovered).

    Example:
        >>> import datasets, surgery
        >>> from surgery.data.task_data import TaskData
        >>> from surgery.strategies import HeadPruningStrategy
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"))
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[2, 5, 3], [2, 6, 7, 3]], "labels": [0, 2]})
        >>> strategy = HeadPruningStrategy(heads={0: [0]})
        >>> _, check = guarded_step(model, strategy, lambda: surgery.convert(model, strategy), index=0,
        ...                         data=TaskData(rows, rows, ["a", "b", "c"]), recovery=None, in_pipeline=True)
        >>> check.strategy, check.exceeded
        ('head-prune', False)
    """
    # Imported here so that convert (which sets this guard on every run) loads transformers' Trainer
    # only for a step that is measured or recovered.
    from surgery.data.task_data import TaskData
    from surgery.training import accuracy, recover

    can_measure = measurable(model, data)
    max_drop = recovery.max_drop if recovery is not None else None
    trained_after = in_pipeline and strategy.trained_after
    may_recover = (recovery is not None and (recovery.epochs > 0 or recovery.refit) and isinstance(data, TaskData)
                   and not trained_after and (not in_pipeline or max_drop is not None))
    if not can_measure and not may_recover:
        return do_step(), None
    loader = data.loader("eval", batch_size=getattr(recovery, "batch_size", 32)) if can_measure else None
    teacher = (reference if reference is not None else copy.deepcopy(model)) if may_recover else None
    before = accuracy(model if reference is None else reference, loader) if loader is not None else None
    report = do_step()
    after = accuracy(model, loader) if loader is not None else None
    drop = _points(before, after)
    result = None
    if teacher is not None and (max_drop is None or drop is None or drop > max_drop):
        assert recovery is not None
        result = recover(model, teacher, data, recovery, progress=progress)
    final = result.accuracy_after if result is not None else after
    remaining = _points(before, final)
    exceeded = max_drop is not None and not trained_after and remaining is not None and remaining > max_drop
    check = StepCheck(step=index, strategy=strategy.name, accuracy_before=before, accuracy_after=after, drop=drop,
                      recovery=result.model_dump(mode="json") if result is not None else None,
                      accuracy_final=final, remaining_drop=remaining, max_drop=max_drop,
                      trained_after=trained_after, exceeded=exceeded)
    report.checks = [check]
    return report, check
