"""The strategy contract: a pydantic config, ``plan`` (decide, read-only) and ``apply`` (do).

A plan is plain JSON. ``apply`` must be deterministic, need no data, and accept the plan exactly as
it comes back from ``json.loads`` (so integer dict keys arrive as strings): reloading a saved model
replays the recorded plans through this method.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError
from torch import nn

from surgery.errors import ConfigError
from surgery.progress import ProgressCallback, ProgressEvent, no_progress
from surgery.report import LayerChange

Plan = dict[str, Any]
Batch = Mapping[str, Any]
Data = Iterable[Batch]


class StrategyConfig(BaseModel):
    """Base class of strategy settings: unknown fields are rejected and instances are frozen.

    Example:
        >>> class MyConfig(StrategyConfig):
        ...     ratio: float = 0.5
        >>> MyConfig(ratio=0.25).ratio
        0.25
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


def validation_message(prefix: str, exc: ValidationError) -> str:
    """Turn a pydantic ValidationError into one line that names the field(s)."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "config"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        value = err.get("input")
        shown = "" if err["type"] == "missing" else f" (got {value!r:.60})"
        parts.append(f"{loc}: {msg}{shown}")
    return f"{prefix}: " + "; ".join(parts)


class Strategy(ABC):
    """Base class of every surgery strategy.

    Subclasses set ``name`` (the registry name), ``config_class`` and implement :meth:`plan` and
    :meth:`apply`. Settings are given either as a config object or as keyword arguments.

    Example:
        >>> from surgery.strategies.head_prune import HeadPruningStrategy
        >>> HeadPruningStrategy(heads={0: [1]}).config.heads
        {0: [1]}
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type[StrategyConfig]] = StrategyConfig
    #: Bump when the meaning of a plan changes; saved models record it.
    plan_version: ClassVar[int] = 1
    #: True when, inside a pipeline, training follows this step by design (new experts, a new prompt):
    #: the guard then reports the step's accuracy drop but neither recovers it nor warns about it.
    trained_after: ClassVar[bool] = False

    def __init__(self, config: StrategyConfig | Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        if config is not None and kwargs:
            raise ConfigError(f"{self.name}: pass either a config object or keyword settings, not both")
        if isinstance(config, self.config_class):
            self.config = config
        elif config is None or isinstance(config, Mapping):
            self.config = self.parse_config(dict(config or {}, **kwargs))
        else:
            raise ConfigError(
                f"{self.name}: config must be a {self.config_class.__name__} or a dict, got {type(config).__name__}"
            )
        self.progress: ProgressCallback = no_progress
        #: Figures gathered while planning (accuracy, usage ...) that the report carries.
        self.metrics: dict[str, Any] = {}

    @classmethod
    def parse_config(cls, values: Mapping[str, Any]) -> StrategyConfig:
        """Validate settings into ``config_class``, raising a one-line :class:`ConfigError`."""
        try:
            return cls.config_class.model_validate(dict(values))
        except ValidationError as exc:
            raise ConfigError(validation_message(f"invalid config for strategy {cls.name!r}", exc)) from None

    def emit(self, task: str, completed: int, total: int | None = None, **info: Any) -> None:
        """Report progress of long work to whoever is listening."""
        self.progress(ProgressEvent(task, completed, total, info))

    @abstractmethod
    def plan(self, model: nn.Module, data: Data | None = None) -> Plan:
        """Decide what to change. May read weights and data; must not modify the model."""

    @abstractmethod
    def apply(self, model: nn.Module, plan: Plan) -> list[LayerChange]:
        """Carry a plan out, in place. Deterministic; no data; ``plan`` is as parsed from JSON."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})"
