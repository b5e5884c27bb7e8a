"""The record of surgery steps a model has been through, kept on the model and saved as JSON.

The steps live in a plain attribute of the model object (not a buffer), so they never enter the
state dict; :func:`surgery.save_pretrained` writes them to ``surgery.json``.
"""

from __future__ import annotations

import json
from typing import Any

from torch import nn

FORMAT = "surgery"
FORMAT_VERSION = 1
MANIFEST_NAME = "surgery.json"
_STEPS_ATTR = "_surgery_steps"
_SOURCE_ATTR = "_surgery_source_dir"


def steps_of(model: nn.Module) -> list[dict[str, Any]]:
    """The ordered surgery steps recorded on ``model`` (a copy)."""
    return json.loads(json.dumps(getattr(model, _STEPS_ATTR, [])))


def record_step(model: nn.Module, step: dict[str, Any]) -> None:
    """Append one step (strategy name, plan version, config, plan) to the model's record."""
    steps = getattr(model, _STEPS_ATTR, [])
    object.__setattr__(model, _STEPS_ATTR, [*steps, json.loads(json.dumps(step))])


def set_steps(model: nn.Module, steps: list[dict[str, Any]]) -> None:
    object.__setattr__(model, _STEPS_ATTR, json.loads(json.dumps(steps)))


def source_dir_of(model: nn.Module) -> str | None:
    """The directory the model was loaded from, if known."""
    explicit = getattr(model, _SOURCE_ATTR, None)
    if explicit:
        return str(explicit)
    name = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    return name or None


def set_source_dir(model: nn.Module, path: str) -> None:
    object.__setattr__(model, _SOURCE_ATTR, path)


def to_jsonable(value: Any) -> Any:
    """Round-trip through JSON, so in-memory plans have exactly the form a reload sees."""
    return json.loads(json.dumps(value))
