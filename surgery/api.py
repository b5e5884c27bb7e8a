"""The entry verbs: ``convert`` a model with a strategy, ``plan`` without applying, ``inspect``."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from torch import nn

from surgery.anatomy import adapter_for
from surgery.errors import ConfigError
from surgery.manifest import record_step, steps_of, to_jsonable
from surgery.ops import count_parameters
from surgery.pipeline import PipelineSession, PipelineStrategy
from surgery.progress import ProgressCallback, no_progress
from surgery.report import LayerAnatomy, ModelAnatomy, ParamCount, StepSummary, SurgeryReport
from surgery.strategy import Data, Plan, Strategy

if TYPE_CHECKING:
    from surgery.training import RecoveryConfig


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


def plan(model: nn.Module, strategy: Strategy, *, data: Data | None = None) -> Plan:
    """Ask ``strategy`` for its plan on ``model`` without changing the model (a dry run).

    Example:
        >>> from transformers import BertConfig, BertModel
        >>> from surgery.strategies.head_prune import HeadPruningStrategy
        >>> cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
        ...                  num_attention_heads=4, intermediate_size=37)
        >>> plan(BertModel(cfg), HeadPruningStrategy(heads={0: [1]}))["heads"]
        {'0': [1]}
    """
    adapter_for(model)  # fail early, with the supported families, on an unknown model
    result = strategy.plan(model, data)
    try:
        return to_jsonable(result)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"strategy {strategy.name!r} produced a plan that is not JSON: {exc}") from None


def apply_plan(
    model: nn.Module, strategy: Strategy, plan: Plan, *, params_before: ParamCount | None = None
) -> SurgeryReport:
    """Apply a given plan (from :func:`plan`, a file or by hand) and record it on the model.

    This is the same path ``convert`` and reloading take.
    """
    start = time.perf_counter()
    before = params_before or count_params(model)
    plan = to_jsonable(plan)
    changes = strategy.apply(model, plan)
    config = json.loads(strategy.config.model_dump_json())
    record_step(
        model,
        {"strategy": strategy.name, "plan_version": strategy.plan_version, "config": config, "plan": plan},
    )
    return SurgeryReport(
        strategy=strategy.name,
        config=config,
        plan=plan,
        changes=changes,
        params_before=before,
        params_after=count_params(model),
        metrics=to_jsonable(strategy.metrics),
        seconds=time.perf_counter() - start,
    )


def convert(
    model: nn.Module,
    strategy: Strategy,
    *,
    data: Data | None = None,
    progress: ProgressCallback | None = None,
    recovery: RecoveryConfig | None = None,
) -> SurgeryReport:
    """Plan and apply ``strategy`` on ``model`` in place, and report what changed.

    Args:
        model: a Hugging Face encoder of a supported family, bare or with a task head.
        strategy: a configured strategy, e.g. ``HeadPruningStrategy(heads={0: [1, 2]})``.
        data: an iterable of model-input dicts (``input_ids``, ``attention_mask``, ``labels``
            where a loss is needed); a torch ``DataLoader`` works. Only planning reads it.
        progress: called with :class:`~surgery.progress.ProgressEvent` during long work.
        recovery: distillation after surgery (:class:`surgery.training.RecoveryConfig`), with the
            model before the step as teacher; needs labelled :class:`~surgery.data.TaskData`. A
            direct step recovers always (or, with ``max_drop``, when it loses more); a pipeline's
            steps are guarded (see :mod:`surgery.guard`). Recovery changes weights only: the
            recorded plan stays the same, so the saved model still replays.

    Example:
        >>> from transformers import BertConfig, BertModel
        >>> from surgery.strategies.head_prune import HeadPruningStrategy
        >>> cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
        ...                  num_attention_heads=4, intermediate_size=37)
        >>> model = BertModel(cfg)
        >>> report = convert(model, HeadPruningStrategy(heads={0: [1, 2]}))
        >>> [c.after for c in report.changes]
        [2]
    """
    start = time.perf_counter()
    strategy.progress = progress or no_progress
    before = count_params(model)
    if isinstance(strategy, PipelineStrategy):
        return _run_pipeline(model, strategy, data, progress, before, start, recovery)

    def run() -> SurgeryReport:
        return apply_plan(model, strategy, plan(model, strategy, data=data), params_before=before)

    if recovery is None:
        report = run()
    else:
        from surgery.guard import guarded_step
        from surgery.training import require_labelled

        report, _ = guarded_step(model, strategy, run, index=0, data=require_labelled(data, "recovery"),
                                 recovery=recovery, in_pipeline=False, progress=progress)
    report.seconds = time.perf_counter() - start
    return report


def _run_pipeline(
    model: nn.Module,
    strategy: PipelineStrategy,
    data: Data | None,
    progress: ProgressCallback | None,
    before: ParamCount,
    start: float,
    recovery: RecoveryConfig | None = None,
) -> SurgeryReport:
    adapter_for(model)
    session = PipelineSession(model, progress, task=data, recovery=recovery)
    strategy.run(model, data, session)
    return SurgeryReport(
        strategy=strategy.name,
        config=json.loads(strategy.config.model_dump_json()),
        plan={"steps": [{"strategy": r.strategy, "plan": r.plan} for r in session.reports]},
        changes=[change for r in session.reports for change in r.changes],
        params_before=before,
        params_after=count_params(model),
        metrics=to_jsonable(strategy.merged_metrics(session)),
        seconds=time.perf_counter() - start,
        checks=[check for r in session.reports for check in r.checks],
    )


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
