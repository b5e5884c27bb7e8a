"""Pipelines: several recorded surgery steps with training in between, a kind of their own.

Some methods cannot decide their final plan before they have changed weights: SHRP converts layers
to Expert Attention, trains them, and only then knows which experts to keep. Such a method is a
:class:`Pipeline`, not a :class:`~surgery.core.strategy.Strategy`: it has no plan and nothing to apply.
Its :meth:`~Pipeline.run` performs ordinary strategies through a :class:`PipelineSession` (each one
planned, applied, recorded and guarded by :func:`surgery.core.run.perform_step`, the path ``convert``
takes) and trains the model in between. Reloading replays the recorded steps, never the pipeline,
so a saved model needs only the step strategies to rebuild.

Example:
    >>> from surgery.core.strategy import StrategyConfig
    >>> from surgery.strategies import HeadPruningStrategy
    >>> from surgery.testing import TinySpec, tiny_model
    >>> class TwoCuts(Pipeline):
    ...     name = "two-cuts"
    ...     config_class = StrategyConfig
    ...     def steps(self, model, data):
    ...         return ["head-prune", "head-prune"]
    ...     def run(self, model, data, session):
    ...         session.step(HeadPruningStrategy(heads={0: [0]}))
    ...         session.step(HeadPruningStrategy(heads={1: [0]}))
    >>> import surgery
    >>> report = surgery.convert(tiny_model(TinySpec("bert")), TwoCuts())
    >>> [step["strategy"] for step in report.plan["steps"]]
    ['head-prune', 'head-prune']
"""

from __future__ import annotations

import json
import time
from abc import abstractmethod
from typing import TYPE_CHECKING, Any

from torch import nn

from surgery.anatomy import adapter_for
from surgery.core.manifest import to_jsonable
from surgery.core.progress import ProgressCallback, no_progress
from surgery.core.report import SurgeryReport
from surgery.core.run import RunContext, count_params, perform_step
from surgery.core.strategy import Data, Method, Strategy
from surgery.orchestration.guard import guarded_step

if TYPE_CHECKING:
    from surgery.training import RecoveryConfig


class PipelineSession:
    """Runs and records the steps of one pipeline on one model, with the run's context.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> from surgery.strategies import HeadPruningStrategy
        >>> model = tiny_model(TinySpec("bert"))
        >>> session = PipelineSession(model)
        >>> report = session.step(HeadPruningStrategy(heads={0: [1]}))
        >>> [r.strategy for r in session.reports]
        ['head-prune']
    """

    def __init__(self, model: nn.Module, progress: ProgressCallback | None = None, *, task: Data | None = None,
                 recovery: RecoveryConfig | None = None, context: RunContext | None = None) -> None:
        self.model = model
        #: The pipeline's own run state: its figures end up in the report next to the steps'.
        self.context = context if context is not None else RunContext(progress or no_progress)
        if self.context.guard is None:  # a context made outside convert: every step is still guarded
            self.context.guard = guarded_step
        self.reports: list[SurgeryReport] = []
        #: The pipeline's labelled task data and recovery settings: the guard measures every step on
        #: ``task``'s evaluation split and recovers a step that loses more than ``recovery.max_drop``.
        self.task = task
        self.recovery = recovery

    @property
    def metrics(self) -> dict[str, Any]:
        """The pipeline's own figures (``report.metrics`` holds them next to each step's)."""
        return self.context.metrics

    def emit(self, task: str, completed: int, total: int | None = None, **info: Any) -> None:
        """Report progress of the pipeline's long work (training epochs, evaluation)."""
        self.context.emit(task, completed, total, **info)

    def step(self, strategy: Strategy, data: Data | None = None) -> SurgeryReport:
        """Plan, apply and record ``strategy`` on the session's model (the path ``convert`` takes), guarded."""
        guarded = self.task is not None or self.recovery is not None
        report = perform_step(self.model, strategy, data, self.context.child(), recovery=self.recovery,
                              guard_data=self.task if guarded else None, index=len(self.reports),
                              in_pipeline=True)
        self.reports.append(report)
        return report

    def merged_metrics(self) -> dict[str, Any]:
        """Metrics of every step under its strategy name, plus the pipeline's own."""
        merged: dict[str, Any] = {f"step{i}:{r.strategy}": r.metrics for i, r in enumerate(self.reports)}
        merged.update(self.metrics)
        return merged


class Pipeline(Method):
    """Base class of methods made of recorded steps and training in between.

    Subclasses implement :meth:`run` and :meth:`steps`; :meth:`preview` (``--dry-run``) returns the
    schedule, marked as such: the plans themselves are decided while the pipeline runs.
    """

    @abstractmethod
    def run(self, model: nn.Module, data: Data | None, session: PipelineSession) -> None:
        """Carry out the pipeline on ``model`` in place, recording each structural step via ``session``."""

    def steps(self, model: nn.Module, data: Any = None) -> list[str]:
        """The strategies the pipeline will record, in order (what a dry run lists)."""
        return []

    def schedule(self, model: nn.Module, data: Any = None) -> dict[str, Any]:
        """Pipeline-specific facts of the schedule (layers, epochs ...) for the dry run."""
        return {}

    def preview(self, model: nn.Module, data: Any = None) -> dict[str, Any]:
        adapter_for(model)
        return to_jsonable({"pipeline": self.name, "config": json.loads(self.config.model_dump_json()),
                            "steps": self.steps(model, data), **self.schedule(model, data),
                            "note": "a schedule, not a replayable plan: each step's plan is decided while the "
                                    "pipeline runs and is recorded in the saved model"})

    def perform(self, model: nn.Module, data: Any, context: RunContext, *,
                recovery: RecoveryConfig | None = None) -> SurgeryReport:
        start = time.perf_counter()
        adapter_for(model)
        data = self.check_data(data)
        before = count_params(model)
        session = PipelineSession(model, task=data, recovery=recovery, context=context)
        self.run(model, data, session)
        return SurgeryReport(
            strategy=self.name,
            config=json.loads(self.config.model_dump_json()),
            plan={"steps": [{"strategy": r.strategy, "plan": r.plan} for r in session.reports]},
            changes=[change for r in session.reports for change in r.changes],
            params_before=before,
            params_after=count_params(model),
            metrics=to_jsonable(session.merged_metrics()),
            seconds=time.perf_counter() - start,
            checks=[check for r in session.reports for check in r.checks],
            artefacts=context.artefacts,
        )

