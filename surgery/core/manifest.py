"""The record of surgery steps a model has been through, kept on the model and saved as JSON.

The steps live in a plain attribute of the model object (not a buffer), so they never enter the
state dict; :func:`surgery.save_pretrained` writes them to ``surgery.json``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from surgery.core.errors import ConfigError, ModelLoadError

if TYPE_CHECKING:
    from torch import nn

FORMAT = "surgery"
FORMAT_VERSION = 1
MANIFEST_NAME = "surgery.json"
_STEPS_ATTR = "_surgery_steps"
_SOURCE_ATTR = "_surgery_source_dir"
_INT8_FLOAT_ATTR = "_surgery_int8_float"
#: How an op group is spelled in an int8 precision map: ``layer.3.ffn-down``, or ``classifier``
#: (:func:`surgery.runtimes.shared.weight_products.precision_groups` lists a model's groups).
PRECISION_GROUP_PATTERN = r"^(layer\.[0-9]+\.(attention|ffn-up|ffn-down)|classifier)$"


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


def int8_float_of(model: nn.Module) -> list[str]:
    """The op groups an int8 export of ``model`` leaves in float (its recorded precision map; empty: all int8).

    Example:
        >>> from torch import nn
        >>> model = nn.Linear(2, 2)
        >>> set_int8_float(model, ["layer.1.ffn-down", "classifier"])
        >>> int8_float_of(model)
        ['classifier', 'layer.1.ffn-down']
    """
    return list(getattr(model, _INT8_FLOAT_ATTR, []))


def set_int8_float(model: nn.Module, groups: Sequence[str]) -> None:
    """Record the op groups an int8 export of ``model`` leaves in float; saved in ``surgery.json``, replayed on load."""
    bad = [g for g in groups if not re.match(PRECISION_GROUP_PATTERN, g)]
    if bad:
        raise ConfigError(f"int8 precision map: {bad[0]!r} is not an op group (layer.N.attention, layer.N.ffn-up, "
                          "layer.N.ffn-down or classifier)")
    object.__setattr__(model, _INT8_FLOAT_ATTR, sorted(set(groups)))


def to_jsonable(value: Any) -> Any:
    """Round-trip through JSON, so in-memory plans have exactly the form a reload sees."""
    return json.loads(json.dumps(value))


# transformers' built-in attention implementations; anything else (a hub kernel name, a dotted path)
# could fetch or run code, so a manifest may only name these.
ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
_CLASS_NAME = r"^[A-Za-z][A-Za-z0-9]*$"


class ManifestStep(BaseModel):
    """One recorded step: the strategy's registry name, its plan version, config and plan."""

    model_config = ConfigDict(extra="allow")

    strategy: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    plan_version: int = Field(default=1, ge=1, strict=True)
    config: dict[str, Any] = Field(default_factory=dict)
    plan: dict[str, Any] = Field(default_factory=dict)


class Manifest(BaseModel):
    """The content of ``surgery.json``; every field a reload reads is checked here, in one place.

    Example:
        >>> Manifest.model_validate({"format": "surgery", "format_version": 1, "steps": []}).steps
        []
        >>> parse_manifest({"format": "surgery", "format_version": 1, "steps": ["x"]}, "m/surgery.json")
        Traceback (most recent call last):
        ...
        surgery.core.errors.ModelLoadError: m/surgery.json is not a valid surgery manifest: steps.0: Input should be \
a valid dictionary or instance of ManifestStep (got 'x'); re-save the model, or fix the file by hand
    """

    model_config = ConfigDict(extra="allow")

    format: Literal["surgery"]
    format_version: int = Field(ge=1, le=FORMAT_VERSION, strict=True)
    versions: dict[str, str] = Field(default_factory=dict)
    model_class: str | None = Field(default=None, pattern=_CLASS_NAME)
    model_type: str | None = None
    attn_implementation: Literal[ATTENTION_IMPLEMENTATIONS] | None = None  # type: ignore[valid-type]
    # The floating dtype of the saved weights; the model is rebuilt in it
    # (see surgery.persist.model_io.from_pretrained).
    dtype: Literal["float32", "float16", "bfloat16", "float64"] | None = None
    steps: list[ManifestStep]
    # Op groups an int8 export leaves in float (compress's precision search chose them); every export replays them.
    int8_float: list[Annotated[str, StringConstraints(pattern=PRECISION_GROUP_PATTERN)]] = Field(default_factory=list)


def _one_line_errors(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        where = ".".join(str(x) for x in err["loc"]) or "manifest"
        shown = "" if err["type"] == "missing" else f" (got {err.get('input')!r:.40})"
        parts.append(f"{where}: {err['msg']}{shown}")
    return " ".join("; ".join(parts).split())


def parse_manifest(raw: Any, where: str | Path) -> Manifest:
    """Validate the parsed JSON of ``surgery.json`` (``where`` names the file in messages)."""
    if isinstance(raw, dict) and isinstance(raw.get("format_version"), int) and not isinstance(
            raw["format_version"], bool) and raw["format_version"] > FORMAT_VERSION:
        raise ModelLoadError(f"{where} has format_version {raw['format_version']}, newer than this surgery supports "
                             f"({FORMAT_VERSION}); upgrade encoder-surgery")
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        raise ModelLoadError(f"{where} is not a valid surgery manifest: {_one_line_errors(exc)}; re-save the model, "
                             "or fix the file by hand") from None
