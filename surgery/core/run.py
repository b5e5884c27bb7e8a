"""One surgery run: its context (progress, metrics, artefacts) and the plan → apply → record path.

Both ``surgery.convert`` and a pipeline's :class:`~surgery.orchestration.pipeline.PipelineSession` carry a step
out through :func:`perform_step`, so a step inside a pipeline is planned, applied, recorded in the
manifest and guarded exactly like a top-level one. Run state never lives on a strategy object: a
fresh :class:`RunContext` is made for every run, handed to the strategy, and what it gathered comes
back in the :class:`~surgery.core.report.SurgeryReport`.

It is part of the base (:mod:`surgery.core`): it knows no method and does not train. A step that asks
for measurement or recovery runs under ``context.guard``, which the entry verbs and pipelines
(:mod:`surgery.orchestration`) set to :func:`surgery.orchestration.guard.guarded_step`.

Example:
    >>> from surgery.strategies import HeadPruningStrategy
    >>> from surgery.testing import TinySpec, tiny_model
    >>> model = tiny_model(TinySpec("bert"))
    >>> context = RunContext()
    >>> report = perform_step(model, HeadPruningStrategy(heads={0: [1]}), None, context)
    >>> report.strategy, [c.after for c in report.changes]
    ('head-prune', [3])
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import nn

from surgery.core.errors import ConfigError, PlanError
from surgery.core.manifest import record_step, to_jsonable
from surgery.core.progress import ProgressCallback, ProgressEvent, no_progress
from surgery.core.report import ParamCount, SurgeryReport

if TYPE_CHECKING:
    from surgery.core.strategy import Data, Plan, Strategy
    from surgery.training import RecoveryConfig

#: Runs a step (the callable) between two measurements and recovers it (surgery.orchestration.guard.guarded_step).
StepGuard = Callable[..., tuple[SurgeryReport, Any]]

@dataclass
class RunContext:
    """The state of one run: where progress goes, the figures gathered, and intermediate artefacts.

    ``metrics`` must hold JSON-friendly values: they become ``report.metrics``. ``artefacts`` holds
    objects a caller may want after the run but that are not figures (DoE's per-task expert, a
    tuned prompt); they are handed back in memory, never serialised.

    Example:
        >>> context = RunContext()
        >>> context.metrics["accuracy"] = 0.9
        >>> context.emit("calibration", 1, 4)
        >>> context.metrics
        {'accuracy': 0.9}
    """

    progress: ProgressCallback = no_progress
    metrics: dict[str, Any] = field(default_factory=dict)
    artefacts: dict[str, Any] = field(default_factory=dict)
    #: The reference model that recovery distils from and the guard measures against (surgery.orchestration.reference);
    #: None: a copy of the model before each step.
    teacher: nn.Module | None = None
    #: The guard a step asking for recovery or measurement runs under. The entry verbs and pipelines
    #: (surgery.orchestration) set it; the base cannot import it, since it trains.
    guard: StepGuard | None = None

    def emit(self, task: str, completed: int, total: int | None = None, **info: Any) -> None:
        """Report progress of long work to whoever is listening."""
        self.progress(ProgressEvent(task, completed, total, info))

    def child(self) -> RunContext:
        """A fresh context for a sub-step, reporting progress to the same place, with the same reference."""
        return RunContext(self.progress, teacher=self.teacher, guard=self.guard)


def count_parameters(module: nn.Module) -> int:
    """Number of distinct parameters (shared tensors, e.g. tied embeddings, counted once).

    Example:
        >>> count_parameters(nn.Linear(4, 3))
        15
    """
    seen: set[int] = set()
    total = 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def count_params(model: nn.Module) -> ParamCount:
    """Parameters of ``model`` with and without embeddings (every ``nn.Embedding`` counts as one).

    Example:
        >>> from transformers import BertConfig, BertModel
        >>> cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
        ...                  num_attention_heads=4, intermediate_size=37)
        >>> p = count_params(BertModel(cfg))
        >>> p.total > p.without_embeddings
        True
    """
    total = count_parameters(model)
    seen: set[int] = set()
    emb = 0
    for module in model.modules():
        if isinstance(module, nn.Embedding) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            emb += module.weight.numel()
    return ParamCount(total=total, without_embeddings=total - emb)


def plan_step(model: nn.Module, strategy: Strategy, data: Data | None, context: RunContext) -> Plan:
    """``strategy``'s plan for ``model`` as plain JSON (the model is not changed)."""
    data = strategy.check_data(data)
    result = strategy.plan(model, data, context)
    try:
        return to_jsonable(result)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"strategy {strategy.name!r} produced a plan that is not JSON: {exc}") from None


def apply_step(model: nn.Module, strategy: Strategy, plan: Plan, context: RunContext, *,
               params_before: ParamCount | None = None) -> SurgeryReport:
    """Apply ``plan``, record it in the model's manifest, and report (metrics from ``context``)."""
    if not isinstance(plan, dict):
        raise PlanError(f"apply_plan: plan must be a mapping (from surgery.plan or a JSON file), got "
                        f"{type(plan).__name__}")
    start = time.perf_counter()
    before = params_before or count_params(model)
    try:
        plan = to_jsonable(plan)
    except (TypeError, ValueError) as exc:
        raise PlanError(f"apply_plan: the plan is not JSON-serialisable: {exc}") from None
    changes = strategy.apply(model, plan)
    config = json.loads(strategy.config.model_dump_json())
    record_step(model, {"strategy": strategy.name, "plan_version": strategy.plan_version, "config": config,
                        "plan": plan})
    return SurgeryReport(strategy=strategy.name, config=config, plan=plan, changes=changes, params_before=before,
                         params_after=count_params(model), metrics=to_jsonable(context.metrics),
                         seconds=time.perf_counter() - start, artefacts=context.artefacts)


def perform_step(model: nn.Module, strategy: Strategy, data: Data | None, context: RunContext, *,
                 recovery: RecoveryConfig | None = None, guard_data: Any = None, index: int = 0,
                 in_pipeline: bool = False) -> SurgeryReport:
    """Plan, apply and record ``strategy`` on ``model``; guarded when ``recovery`` or ``guard_data`` asks.

    ``guard_data`` is the labelled task the guard measures on (and recovers with); outside a
    pipeline it is ``data`` itself.
    """
    start = time.perf_counter()
    before = count_params(model)

    def run() -> SurgeryReport:
        return apply_step(model, strategy, plan_step(model, strategy, data, context), context, params_before=before)

    if recovery is None and guard_data is None:
        report = run()
    elif context.guard is None:
        raise ConfigError(f"{strategy.name}: a guarded step (recovery or accuracy checks) needs RunContext.guard; "
                          "run it through surgery.convert or a Pipeline, which set it")
    else:
        report, _ = context.guard(model, strategy, run, index=index, data=guard_data, recovery=recovery,
                                 in_pipeline=in_pipeline, progress=context.progress, reference=context.teacher)
    report.seconds = time.perf_counter() - start
    return report
