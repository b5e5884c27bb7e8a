"""The entry verbs: ``convert`` a model with a strategy, ``plan`` without applying, ``inspect``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from surgery.anatomy import adapter_for
from surgery.core.errors import ConfigError, PlanError
from surgery.core.manifest import steps_of
from surgery.core.progress import ProgressCallback, no_progress
from surgery.core.report import LayerAnatomy, ModelAnatomy, ParamCount, StepSummary, SurgeryReport
from surgery.core.run import RunContext, apply_step, count_parameters, count_params, plan_step
from surgery.core.strategy import Data, Method, Plan, Strategy
from surgery.orchestration.guard import guarded_step
from surgery.orchestration.reference import check_reference, reference_name

__all__ = ["apply_plan", "check_model_and_method", "convert", "count_params", "inspect", "plan", "preview"]

if TYPE_CHECKING:
    from surgery.training import RecoveryConfig


def check_model_and_method(model: Any, strategy: Any, what: str) -> None:
    """Refuse arguments of the wrong type with a one-line error that says what to pass instead.

    Example:
        >>> from transformers import BertConfig, BertModel
        >>> cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
        ...                  num_attention_heads=4, intermediate_size=37)
        >>> check_model_and_method(BertModel(cfg), "head-prune", "convert")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: convert: strategy must be a Strategy object, got the str 'head-prune'; ...
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{what}: model must be a torch nn.Module (a transformers encoder), got "
                          f"{type(model).__name__}")
    if not isinstance(strategy, Method):
        shown = f"the {type(strategy).__name__} {strategy!r:.40}" if isinstance(strategy, str) else \
            type(strategy).__name__
        raise ConfigError(f"{what}: strategy must be a Strategy object, got {shown}; build one by name with "
                          "surgery.get_method('head-prune')(ratio=0.5), or import its class")


def plan(model: nn.Module, strategy: Method, *, data: Data | None = None) -> Plan:
    """Ask ``strategy`` for its plan on ``model`` without changing the model (a dry run).

    Example:
        >>> from transformers import BertConfig, BertModel
        >>> from surgery.strategies.pruning.head_prune import HeadPruningStrategy
        >>> cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
        ...                  num_attention_heads=4, intermediate_size=37)
        >>> plan(BertModel(cfg), HeadPruningStrategy(heads={0: [1]}))["heads"]
        {'0': [1]}
    """
    check_model_and_method(model, strategy, "plan")
    adapter_for(model)  # fail early, with the supported families, on an unknown model
    if not isinstance(strategy, Strategy):
        # A pipeline decides its steps' plans while it trains; its schedule is what can be shown.
        return strategy.preview(model, data)
    return plan_step(model, strategy, data, RunContext())


def preview(model: nn.Module, strategy: Method, *, data: Data | None = None) -> dict[str, Any]:
    """What ``convert`` would do, as JSON, without changing the model (``surgery apply --dry-run``).

    A strategy's preview is the step exactly as the manifest would record it; a pipeline's is its
    schedule, marked as not replayable.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> from surgery.strategies import HeadPruningStrategy, ShrpPipeline
        >>> model = tiny_model(TinySpec("bert"))
        >>> preview(model, HeadPruningStrategy(heads={0: [1]}))["plan"]
        {'heads': {'0': [1]}}
        >>> preview(model, ShrpPipeline(num_layers=1))["steps"]
        ['expert-attention', 'top1-prune']
    """
    check_model_and_method(model, strategy, "preview")
    adapter_for(model)
    return strategy.preview(model, data)


def apply_plan(
    model: nn.Module, strategy: Strategy, plan: Plan, *, params_before: ParamCount | None = None
) -> SurgeryReport:
    """Apply a given plan (from :func:`plan`, a file or by hand) and record it on the model.

    This is the same path ``convert`` and reloading take.
    """
    check_model_and_method(model, strategy, "apply_plan")
    if not isinstance(strategy, Strategy):
        raise PlanError(f"{strategy.name} is a pipeline: its steps are recorded as separate strategies and replayed "
                        "one by one; there is no plan to apply for the pipeline itself")
    return apply_step(model, strategy, plan, RunContext(), params_before=params_before)


def convert(
    model: nn.Module,
    strategy: Method,
    *,
    data: Data | None = None,
    progress: ProgressCallback | None = None,
    recovery: RecoveryConfig | None = None,
    teacher: nn.Module | None = None,
) -> SurgeryReport:
    """Plan and apply ``strategy`` on ``model`` in place, and report what changed.

    Args:
        model: a Hugging Face encoder of a supported family, bare or with a task head.
        strategy: a configured strategy, e.g. ``HeadPruningStrategy(heads={0: [1, 2]})``.
        data: an iterable of model-input dicts (``input_ids``, ``attention_mask``, ``labels``
            where a loss is needed); a torch ``DataLoader`` works. Only planning reads it.
        progress: called with :class:`~surgery.core.progress.ProgressEvent` during long work.
        recovery: distillation after surgery (:class:`surgery.training.RecoveryConfig`), with the
            model before the step as teacher; needs labelled :class:`~surgery.data.task_data.TaskData`. A
            direct step recovers always (or, with ``max_drop``, when it loses more); a pipeline's
            steps are guarded (see :mod:`surgery.orchestration.guard`). Recovery changes weights only: the
            recorded plan stays the same, so the saved model still replays.
        teacher: the reference when ``model`` was already surgered: the original it was cut from
            (same family, hidden size and vocabulary). Recovery distils from it instead of from the
            model before the step, and the guard measures the drop against its accuracy, so a chain
            of steps is held to the original; ``report.reference`` names it (default ``"input model"``).

    Example:
        >>> from transformers import BertConfig, BertModel
        >>> from surgery.strategies.pruning.head_prune import HeadPruningStrategy
        >>> cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
        ...                  num_attention_heads=4, intermediate_size=37)
        >>> model = BertModel(cfg)
        >>> report = convert(model, HeadPruningStrategy(heads={0: [1, 2]}))
        >>> [c.after for c in report.changes]
        [2]
    """
    check_model_and_method(model, strategy, "convert")
    adapter_for(model)
    if teacher is not None:
        check_reference(model, teacher)
    context = RunContext(progress or no_progress, teacher=teacher, guard=guarded_step)
    # Polymorphic: a strategy plans, applies and records one step; a pipeline runs its steps and trains.
    report = strategy.perform(model, data, context, recovery=recovery)
    report.reference = reference_name(teacher)
    return report


def _layer_anatomy(adapter: Any, index: int) -> LayerAnatomy:
    parts = adapter.layer(index)
    summary = getattr(parts.module, "anatomy_summary", None)
    params = count_parameters(parts.module)
    if parts.attention is None and callable(summary):
        info = dict(summary())
        kind = str(info.pop("kind", type(parts.module).__name__))
        return LayerAnatomy(
            index=index,
            kind=kind,
            heads=info.pop("heads", None),
            head_dim=info.pop("head_dim", None),
            ffn_width=info.pop("ffn_width", None),
            params=params,
            details=info,
        )
    return LayerAnatomy(
        index=index,
        heads=parts.attention.num_heads if parts.attention else None,
        head_dim=parts.attention.head_dim if parts.attention else None,
        ffn_width=parts.ffn.width if parts.ffn else None,
        params=params,
    )


def inspect(model: nn.Module) -> ModelAnatomy:
    """The model's anatomy: per-layer heads, head dim, FFN width, parameters and recorded steps.

    Example:
        >>> from transformers import BertConfig, BertModel
        >>> cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
        ...                  num_attention_heads=4, intermediate_size=37)
        >>> [layer.heads for layer in inspect(BertModel(cfg)).layers]
        [4, 4]
    """
    adapter = adapter_for(model)
    return ModelAnatomy(
        model_type=model.config.model_type,
        model_class=type(model).__name__,
        hidden_size=adapter.hidden_size,
        num_layers=adapter.num_layers,
        layers=[_layer_anatomy(adapter, i) for i in range(adapter.num_layers)],
        params=count_params(model),
        steps=[StepSummary(strategy=s["strategy"], config=s["config"]) for s in steps_of(model)],
    )
