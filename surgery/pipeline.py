"""Pipeline strategies: several recorded surgery steps with training in between.

Some methods cannot decide their final plan before they have changed weights: SHRP converts layers
to Expert Attention, trains them, and only then knows which experts to keep. Such a method is a
:class:`PipelineStrategy`. Its :meth:`~PipelineStrategy.run` performs ordinary strategies through
a :class:`PipelineSession` (each one planned, applied and recorded in the manifest exactly like a
top-level ``convert``) and trains the model in between. Reloading replays the recorded steps, never
the pipeline itself, so a saved model needs only the step strategies to rebuild.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Any

from torch import nn

from surgery.errors import PlanError
from surgery.progress import ProgressCallback, no_progress
from surgery.report import LayerChange, SurgeryReport
from surgery.strategy import Data, Plan, Strategy

if TYPE_CHECKING:
    from surgery.training import RecoveryConfig


class PipelineSession:
    """Runs and records the steps of one pipeline on one model.

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
                 recovery: RecoveryConfig | None = None) -> None:
        self.model = model
        self.progress = progress or no_progress
        self.reports: list[SurgeryReport] = []
        #: The pipeline's labelled task data and recovery settings: the guard measures every step on
        #: ``task``'s evaluation split and recovers a step that loses more than ``recovery.max_drop``.
        self.task = task
        self.recovery = recovery

    def step(self, strategy: Strategy, data: Data | None = None) -> SurgeryReport:
        """Plan, apply and record ``strategy`` on the session's model (the path ``convert`` takes), guarded."""
        from surgery.api import convert

        def run() -> SurgeryReport:
            return convert(self.model, strategy, data=data, progress=self.progress)

        if self.task is None and self.recovery is None:
            report = run()
        else:
            from surgery.guard import guarded_step

            report, _ = guarded_step(self.model, strategy, run, index=len(self.reports), data=self.task,
                                     recovery=self.recovery, in_pipeline=True, progress=self.progress)
        self.reports.append(report)
        return report


class PipelineStrategy(Strategy):
    """Base class of strategies made of recorded steps and training in between.

    Subclasses implement :meth:`run`; :meth:`plan` returns a description of the steps it will take
    (what ``--dry-run`` shows). ``surgery.convert`` calls ``run`` and merges the step reports.
    """

    @abstractmethod
    def run(self, model: nn.Module, data: Data | None, session: PipelineSession) -> None:
        """Carry out the pipeline on ``model`` in place, recording each structural step via ``session``."""

    def plan(self, model: nn.Module, data: Data | None = None) -> Plan:
        """The pipeline's schedule (which steps, in which order); the real plans come from its steps."""
        return {"pipeline": self.name, "config": self.config.model_dump(mode="json")}

    def apply(self, model: nn.Module, plan: Plan) -> list[LayerChange]:
        raise PlanError(
            f"{self.name} is a pipeline: its steps are recorded as separate strategies and replayed one by one; "
            "there is nothing to apply for the pipeline itself"
        )

    def merged_metrics(self, session: PipelineSession) -> dict[str, Any]:
        """Metrics of every step under its strategy name, plus the pipeline's own ``self.metrics``."""
        merged: dict[str, Any] = {f"step{i}:{r.strategy}": r.metrics for i, r in enumerate(session.reports)}
        merged.update(self.metrics)
        return merged
