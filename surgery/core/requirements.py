"""What training data must look like, checked in one place with one-line errors.

``surgery.convert`` checks a method's declared need (:meth:`surgery.core.strategy.Method.check_data`),
recovery checks its data (:func:`surgery.training.require_labelled`), and both end here. Only
attributes are read (duck typing), so this module imports nothing heavy.

Example:
    >>> describe_data(None), describe_data([1])
    ('no data', 'list')
    >>> require_training_data(None, "recovery")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    surgery.core.errors.DataError: recovery trains the model and needs labelled task data ...; got no data
"""

from __future__ import annotations

from typing import Any

from surgery.core.errors import DataError


def describe_data(data: Any) -> str:
    """A short name of what ``data`` is, for error messages."""
    return "no data" if data is None else type(data).__name__


def require_training_data(data: Any, who: str, *, objectives: tuple[str, ...] = ("task", "embedding"),
                          need_eval: bool = False) -> Any:
    """``data`` if ``who`` can train on it, else a one-line :class:`DataError` saying what to pass.

    Labelled task data (``train`` with a ``labels`` column, ``eval`` when ``need_eval``) always
    qualifies; data that brings another objective (unlabelled sentence-embedding texts) qualifies
    when ``objectives`` names it.
    """
    objective = getattr(data, "objective", "task")
    if objective != "task":
        if objective not in objectives:
            raise DataError(f"{who} cannot train with the {objective} objective; supported: {', '.join(objectives)}")
        return data
    example = "--data train.csv [--eval-data dev.csv]" if need_eval else "--data train.csv"
    if not all(hasattr(data, a) for a in ("train", "eval", "label_names")) or (
            not need_eval and "labels" not in data.train.column_names):
        raise DataError(f"{who} trains the model and needs labelled task data (surgery.data.task_data.TaskData, e.g. "
                        f"{example}); got {describe_data(data)}")
    if "labels" not in data.train.column_names:
        raise DataError(f"{who}: the training data has no labels; name the label column with --label-column")
    if need_eval and data.eval is None:
        raise DataError(f"{who}: needs evaluation data; pass --eval-data or an eval fraction")
    return data
