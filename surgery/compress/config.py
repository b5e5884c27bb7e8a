"""``CompressConfig``: every setting of ``surgery compress``, validated once, in one place.

The CLI builds it from its flags, the Python API takes it (``surgery.compress(model, data,
CompressConfig(speedup=2, runtime="openvino-int8"))``), and the report carries it under the same
field names (``CompressReport.config``), so a run says exactly what it was asked. Unknown fields are
refused; a bad value is one line naming the field (:meth:`CompressConfig.build`).

Example:
    >>> config = CompressConfig(speedup=2, runtime="torch")
    >>> config.target.describe(), config.runtime, config.against_runtime
    ('--speedup 2', 'torch', 'torch')
    >>> CompressConfig.build(speedup=2, runtimes="torch")
    Traceback (most recent call last):
    ...
    surgery.core.errors.ConfigError: compress: runtimes: unknown field (got 'torch')
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from surgery.compress.compress_report import DropTarget, SpeedupTarget, Target
from surgery.core.errors import ConfigError, as_field_error
from surgery.core.strategy import validation_message
from surgery.persist.config_values import MAX_BATCH

#: ``--runtime auto``: time the unchanged model on every runtime available here and search on those that can reach
#: the target.
AUTO = "auto"


class CompressConfig(BaseModel):
    """The settings of one ``compress`` run (the data and the model are the call's arguments).

    Example:
        >>> CompressConfig(max_drop=1.0, runtime="auto", budget_minutes=20).target.describe()
        '--max-drop 1'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    speedup: float | None = Field(default=None, description="measured times faster than the reference to reach "
                                  "(the most accurate candidate that is wins)")
    max_drop: float | None = Field(default=None, ge=0.0, le=100.0, description="points of accuracy (or 100 x mean "
                                   "cosine) it may lose: the target alone, or the guard of a speedup")
    runtime: str = Field(default="torch", description="where the model will run: a registered runtime name, or "
                         "'auto' (the fastest runtime available here that meets the target)")
    against_runtime: str = Field(default="torch", description="what speedups are against: the original on this "
                                 "runtime (default PyTorch fp32)")
    budget_minutes: float | None = Field(default=None, gt=0.0, description="wall-clock minutes for the whole job; "
                                         "the recovery tiers (block-wise reconstruction, distillation) get the time "
                                         "left, each estimated first. None: the refit tier only")
    train: bool = Field(default=True, description="False keeps to the refit tier whatever the budget")
    objective: Literal["task", "embedding"] | None = Field(default=None, description="default: from the data")
    batch_size: int | None = Field(default=None, ge=1, le=MAX_BATCH, description="batch size to time (default: the "
                                   "data's; at most the CLI's bound)")
    seq_len: int | None = Field(default=None, ge=1, description="tokens per sequence to time (default: the data's)")
    threads: int | None = Field(default=None, ge=1, description="CPU threads every runtime is held to")
    lengths: Literal["fixed", "data"] = Field(default="fixed", description="the lengths times are measured at: "
                                              "fixed (every sequence seq_len tokens, default the data's mean "
                                              "padded length) or data (batches of the data's own texts, each "
                                              "padded to its own longest, as a server pads)")
    stock: bool = Field(default=False, description="keep to what a stock transformers config can say")
    seed: int = Field(default=0, description="seed of the training tier")
    workers: int | None = Field(default=None, ge=1, description="processes candidates are built and judged in "
                                "(timing stays in one); default: one per available core up to 4, one for a tiny "
                                "model; each worker gets cores // workers threads")
    max_cut: float = Field(default=4.0, gt=1.0, description="--runtime auto: the largest structural cut (its "
                           "speedup in one runtime) searched for; a runtime whose unchanged ratio times this cannot "
                           "reach --speedup is not searched")

    @field_validator("speedup")
    @classmethod
    def _speedup(cls, value: float | None) -> float | None:
        if value is not None and not (value > 1.0 and math.isfinite(value)):
            raise ValueError("must be more than 1 and finite (times faster than the original)")
        return value

    @field_validator("runtime")
    @classmethod
    def _runtime(cls, value: str) -> str:
        from surgery.runtimes.runtime_registry import check_runtime_name

        with as_field_error("runtime "):  # pydantic names the field; the message says the choices
            return check_runtime_name(value, also=(AUTO,))

    @field_validator("against_runtime")
    @classmethod
    def _against(cls, value: str) -> str:
        from surgery.runtimes.runtime_registry import check_runtime_name

        with as_field_error("runtime "):
            return check_runtime_name(value)

    @model_validator(mode="after")
    def _lengths(self) -> CompressConfig:
        if self.lengths == "data" and self.seq_len is not None:
            raise ValueError("seq_len fixes every sequence's length; with lengths 'data' the lengths are the "
                             "data's own (cut where the data is read): drop seq_len")
        return self

    @model_validator(mode="after")
    def _target(self) -> CompressConfig:
        if self.speedup is None and self.max_drop is None:
            raise ValueError("give a target: speedup (times faster than the original) or max_drop (points of "
                             "accuracy or fidelity it may lose)")
        return self

    @classmethod
    def build(cls, **settings: Any) -> CompressConfig:
        """The config of ``settings``, or a one-line :class:`ConfigError` naming the field and what is wrong.

        ``target`` (a :class:`SpeedupTarget` or :class:`DropTarget`) is accepted in place of ``speedup``
        and ``max_drop``.
        """
        target = settings.pop("target", None)
        if target is not None:
            if not isinstance(target, SpeedupTarget | DropTarget):
                raise ConfigError("compress: target must be SpeedupTarget(speedup=X) or DropTarget(max_drop=P)")
            settings = {**target.model_dump(), **settings}
        try:
            return cls(**settings)
        except ValidationError as exc:
            raise ConfigError(validation_message("compress", exc).replace("Value error, ", "")) from None

    @property
    def target(self) -> Target:
        """The target as the search reads it."""
        if self.speedup is not None:
            return SpeedupTarget(speedup=self.speedup, max_drop=self.max_drop)
        assert self.max_drop is not None  # the validator requires one of the two
        return DropTarget(max_drop=self.max_drop)

    @property
    def auto(self) -> bool:
        """Whether the runtime is chosen by measurement (``runtime='auto'``)."""
        return self.runtime == AUTO
