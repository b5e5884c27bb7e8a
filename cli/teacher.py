"""``surgery apply --teacher ORIGINAL``: the original model a surgered input was cut from, as the run's reference.

Recovery distils from it and the report's accuracy or embedding fidelity is measured against it
(:mod:`surgery.orchestration.reference`), so the second step of a chain is held to the model the user started
from, not to the first step's output. It is loaded like MODEL (same objective, same class choice)
and must have the same family, hidden size, vocabulary and task head.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from surgery.cli.console import CliState, note
from surgery.core.errors import ConfigError, OutputPathError
from surgery.persist.assets import MODELS, resolve_model_path
from surgery.persist.atomic import check_separate

if TYPE_CHECKING:
    from torch import nn

    from surgery.cli.prepare import Inputs


def teacher_path(teacher: str | None, source: Path, out: Path | None, *, has_data: bool) -> Path | None:
    """``--teacher`` resolved (a directory or an embedded name), kept apart from ``--out`` and checked to fit
    MODEL (in ``source``) by its config alone, before any weights are read; None when not given.

    Example:
        >>> teacher_path(None, Path("."), None, has_data=False) is None
        True
        >>> teacher_path("minilm-l6", Path("."), None, has_data=False)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: --teacher needs --data: ...
    """
    if teacher is None:
        return None
    if not has_data:
        raise ConfigError("--teacher needs --data: recovery distils from the original and the evaluation measures "
                          "against it on that data")
    path = resolve_model_path(teacher)
    if out is not None:
        try:
            check_separate(path, out, flag="--out")
        except OutputPathError as exc:
            raise OutputPathError(f"{exc} (it holds the --teacher model)") from None
    from surgery.cli.inputs import read_model_config
    from surgery.orchestration.reference import config_mismatch

    problem = config_mismatch(read_model_config(source), read_model_config(path))
    if problem is not None:
        raise ConfigError(f"--teacher {path}: {problem}; the reference must be the model MODEL was cut from")
    return path


def reference_label(teacher: str, path: Path) -> str:
    """How the report names the reference: an embedded name as given, else the resolved directory.

    Example:
        >>> reference_label("minilm-l6", Path("/site/model")), reference_label("./orig", Path("/work/orig"))
        ('minilm-l6', '/work/orig')
    """
    return teacher if teacher in MODELS else str(path)


def load_teacher(state: CliState, path: Path, inputs: Inputs, data: Any) -> nn.Module:
    """The original model at ``path``, loaded like MODEL was, checked to fit it (one-line ConfigError otherwise)."""
    from surgery.cli.inputs import load_model, read_model_config
    from surgery.orchestration.reference import check_reference
    from surgery.persist.task_heads import new_head_keys

    flag = f"--teacher {path}"
    loaded = load_model(path, read_model_config(path), None if inputs.is_embedding else data,
                        allow_pickle=state.allow_pickle)
    if new_head_keys(loaded.model):
        raise ConfigError(f"{flag} has no classification head for these labels; pass the fine-tuned classifier the "
                          "model was cut from")
    check_reference(inputs.model, loaded.model, flag=flag)
    loaded.model.eval()
    note(f"reference: {path} (recovery distils from it, accuracy and fidelity are measured against it)")
    return loaded.model
