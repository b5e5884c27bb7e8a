"""The two kinds of surgery method and their contract.

Every method (:class:`Method`) has a registry ``name``, a pydantic config, a declared data need
(``requires``) and two verbs that ``surgery.convert``/``--dry-run`` call without knowing the kind:
:meth:`~Method.perform` (do it, return a report) and :meth:`~Method.preview` (what it will do).

* A :class:`Strategy` is one replayable step: ``plan`` (decide, read-only) and ``apply`` (do). A
  plan is plain JSON. ``apply`` must be deterministic, need no data, and accept the plan exactly as
  it comes back from ``json.loads`` (so integer dict keys arrive as strings): reloading a saved
  model replays the recorded plans through this method.
* A pipeline (:class:`surgery.orchestration.pipeline.Pipeline`) runs several strategies as recorded steps with
  training in between; it has no plan of its own and is never replayed.

Run state (progress, metrics, artefacts) lives in a :class:`surgery.core.run.RunContext` made per run,
not on the method object: the same configured object can run twice and report independently.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from torch import nn

from surgery.core.errors import ConfigError, DataError
from surgery.core.report import LayerChange, SurgeryReport
from surgery.core.requirements import describe_data, require_training_data
from surgery.core.run import RunContext, perform_step, plan_step

if TYPE_CHECKING:
    from surgery.training import RecoveryConfig

Plan = dict[str, Any]
Batch = Mapping[str, Any]
Data = Iterable[Batch]
#: What a method needs as ``data``: nothing; model-input batches (calibration, importance scores);
#: or training data (labelled :class:`~surgery.data.task_data.TaskData` with an evaluation split, or, for a
#: method whose ``objectives`` include ``"embedding"``, unlabelled sentence-embedding texts).
DataNeed = Literal["none", "batches", "task-data"]


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


class Method(ABC):
    """Base class of both kinds of surgery method: :class:`Strategy` and a pipeline (surgery.orchestration.pipeline).

    Subclasses set ``name`` (the registry name) and ``config_class``. Settings are given either as a
    config object or as keyword arguments. ``requires`` declares the data the method needs, and
    :meth:`check_data` (called once by ``convert``) enforces it with a one-line error.

    Example:
        >>> from surgery.strategies.pruning.head_prune import HeadPruningStrategy
        >>> HeadPruningStrategy(heads={0: [1]}).config.heads
        {0: [1]}
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type[StrategyConfig]] = StrategyConfig
    requires: ClassVar[DataNeed] = "none"
    #: The training objectives the method supports (``"embedding"``: unlabelled texts distilled).
    objectives: ClassVar[tuple[str, ...]] = ("task",)

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

    @classmethod
    def parse_config(cls, values: Mapping[str, Any]) -> StrategyConfig:
        """Validate settings into ``config_class``, raising a one-line :class:`ConfigError`."""
        try:
            return cls.config_class.model_validate(dict(values))
        except ValidationError as exc:
            raise ConfigError(validation_message(f"invalid config for strategy {cls.name!r}", exc)) from None

    def data_need(self) -> DataNeed:
        """What this configured method needs as data (``requires``, unless a setting changes it)."""
        return self.requires

    def check_data(self, data: Any) -> Any:
        """``data`` if it meets :meth:`data_need`, else a one-line :class:`DataError` saying what to pass."""
        need = self.data_need()
        if need == "none" or (data is None and need == "batches"):  # batches are optional (a default is used)
            return data
        if need == "batches":  # any iterable of model inputs: TaskData, unlabelled TextData, a DataLoader
            if data is None or isinstance(data, (str, bytes, Mapping)) or not isinstance(data, Iterable):
                raise DataError(f"{self.name}: data must be TaskData or an iterable of model-input batches, got "
                                f"{describe_data(data)}")
            return data
        return require_training_data(data, self.name, objectives=self.objectives, need_eval=True)

    @abstractmethod
    def perform(self, model: nn.Module, data: Any, context: RunContext, *,
                recovery: RecoveryConfig | None = None) -> SurgeryReport:
        """Carry the method out on ``model`` in place and report; run state goes to ``context``."""

    @abstractmethod
    def preview(self, model: nn.Module, data: Any = None) -> dict[str, Any]:
        """What :meth:`perform` will do, as JSON (``--dry-run``); the model is not changed."""


class Strategy(Method):
    """Base class of a one-step surgery strategy: :meth:`plan` then :meth:`apply`, replayed on reload.

    Subclasses implement :meth:`plan` and :meth:`apply`. ``plan`` may take a ``context``
    (:class:`~surgery.core.run.RunContext`) to report progress and metrics.

    Example:
        >>> from surgery.strategies.pruning.head_prune import HeadPruningStrategy
        >>> HeadPruningStrategy(heads={0: [1]}).config.heads
        {0: [1]}
    """

    #: Bump when the meaning of a plan changes; saved models record it.
    plan_version: ClassVar[int] = 1
    #: True when, inside a pipeline, training follows this step by design (new experts, a new prompt):
    #: the guard then reports the step's accuracy drop but neither recovers it nor warns about it.
    trained_after: ClassVar[bool] = False

    @abstractmethod
    def plan(self, model: nn.Module, data: Data | None = None, context: RunContext | None = None) -> Plan:
        """Decide what to change. May read weights and data; must not modify the model."""

    @abstractmethod
    def apply(self, model: nn.Module, plan: Plan) -> list[LayerChange]:
        """Carry a plan out, in place. Deterministic; no data; ``plan`` is as parsed from JSON."""

    def perform(self, model: nn.Module, data: Any, context: RunContext, *,
                recovery: RecoveryConfig | None = None) -> SurgeryReport:
        if recovery is not None:
            guard_data = require_training_data(data, "recovery")
        else:
            # Given a reference, the step is measured against it wherever the data allows (the guard decides).
            guard_data = data if context.teacher is not None else None
        return perform_step(model, self, data, context, recovery=recovery, guard_data=guard_data)

    def preview(self, model: nn.Module, data: Any = None) -> dict[str, Any]:
        """The step exactly as it would be recorded in the manifest (strategy, version, config, plan)."""
        return {"strategy": self.name, "plan_version": self.plan_version,
                "config": json.loads(self.config.model_dump_json()),
                "plan": plan_step(model, self, data, RunContext())}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})"
