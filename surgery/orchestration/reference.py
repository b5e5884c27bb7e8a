"""The reference of a run: the model that recovery distils from and that accuracy is measured against.

By default it is the input model itself (a copy taken before each step). A model that was already
surgered can name the model it came from instead (``surgery.convert(..., teacher=original)``,
``surgery apply --teacher ORIGINAL``), so that a chain of steps is distilled from and reported
against the original, not against the previous step's output. The reference must read the same
token ids and produce hidden states of the same width: same family, hidden size and vocabulary.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from surgery.core.errors import ConfigError
from surgery.core.manifest import source_dir_of
from surgery.core.report import INPUT_MODEL


def config_mismatch(config: Any, reference: Any) -> str | None:
    """What makes ``reference`` (a model config) unfit to stand for the original of ``config``'s model; None if fit.

    Example:
        >>> from surgery.testing import TinySpec, tiny_config
        >>> config_mismatch(tiny_config(TinySpec("bert")), tiny_config(TinySpec("bert", heads=2)))
        "its hidden size is 16 but the model's is 32"
    """
    for what, attr in (("family", "model_type"), ("hidden size", "hidden_size"), ("vocabulary", "vocab_size")):
        mine, theirs = getattr(config, attr, None), getattr(reference, attr, None)
        if mine != theirs:
            return f"its {what} is {theirs} but the model's is {mine}"
    return None


def check_reference(model: nn.Module, teacher: nn.Module, flag: str = "teacher") -> None:
    """Refuse a reference of another family, hidden size, vocabulary, class or label count, in one line.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> check_reference(tiny_model(TinySpec("bert")), tiny_model(TinySpec("bert")))
        >>> check_reference(tiny_model(TinySpec("bert")), tiny_model(TinySpec("roberta")))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: teacher: its family is roberta but the model's is bert; ...
    """
    if not isinstance(teacher, nn.Module) or getattr(teacher, "config", None) is None:
        raise ConfigError(f"{flag}: pass the original model (a transformers encoder), got {type(teacher).__name__}")
    problem = config_mismatch(model.config, teacher.config)  # type: ignore[arg-type]
    if problem is None and type(teacher).__name__ != type(model).__name__:
        problem = f"it is a {type(teacher).__name__} but the model is a {type(model).__name__}"
    labels = (getattr(model.config, "num_labels", None), getattr(teacher.config, "num_labels", None))
    if problem is None and type(model).__name__.endswith("ForSequenceClassification") and labels[0] != labels[1]:
        problem = f"it has {labels[1]} labels but the model has {labels[0]}"
    if problem is not None:
        raise ConfigError(f"{flag}: {problem}; the reference must be the model this one was cut from (same family, "
                          "hidden size, vocabulary and task head)")


def reference_name(teacher: nn.Module | None) -> str:
    """How a report names the reference: the directory the teacher was loaded from, or ``"input model"``.

    Example:
        >>> reference_name(None)
        'input model'
    """
    if teacher is None:
        return INPUT_MODEL
    return source_dir_of(teacher) or f"{type(teacher).__name__} passed as teacher"
