"""Recovery after surgery: a short distillation run from the model before surgery (the teacher).

Recovery changes weights only: the plan that made the student stays as it was recorded, so a saved
model still rebuilds by replay and loads the recovered weights strictly.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field
from torch import nn

from surgery.anatomy import adapter_for
from surgery.core.errors import ConfigError
from surgery.core.manifest import steps_of
from surgery.core.progress import ProgressCallback, ProgressEvent, no_progress
from surgery.core.requirements import require_training_data
from surgery.data.task_data import TaskData
from surgery.training.distill import DistillConfig, default_layer_map
from surgery.training.refit import RefitResult, refit_projections, task_calibration_batches
from surgery.training.task_accuracy import accuracy
from surgery.training.trainer import EpochHistory, EpochStats, TimeLimit, fit, scratch_dir, training_arguments


class RecoveryConfig(DistillConfig):
    """Settings of a recovery run (distillation settings plus budget and optimiser).

    ``max_drop`` (accuracy points) is the guard's threshold: a step that loses more is recovered
    (and reported if the loss remains). Without it, a direct ``convert(..., recovery=...)`` always
    recovers, and a pipeline only measures its steps.

    Example:
        >>> RecoveryConfig(epochs=2, max_drop=1.0).temperature
        2.0
    """

    epochs: int = Field(default=1, ge=0, description="recovery budget in epochs (0: measure only)")
    max_drop: float | None = Field(default=None, ge=0.0, description="accuracy points a step may lose")
    learning_rate: float = Field(default=5e-5, gt=0.0)
    weight_decay: float = Field(default=0.01, ge=0.0)
    warmup_ratio: float = Field(default=0.0, ge=0.0, lt=1.0)
    batch_size: int = Field(default=32, ge=1)
    micro_batch: int | None = Field(default=None, ge=1, description="the most rows one forward and backward may take: "
                                    "each step's batch runs in equal micro-batches whose gradients accumulate "
                                    "(bounded memory on long sequences); None: the whole batch at once")
    seed: int = 0
    refit: bool = Field(default=False, description="before training, re-solve every cut output projection by "
                                                   "least squares against the teacher (surgery.training.refit)")
    refit_batches: int = Field(default=32, ge=1, description="training batches the refit reads")
    max_steps: int | None = Field(default=None, ge=1, description="stop after this many optimiser steps (a "
                                  "budget that ends inside an epoch); None: whole epochs")
    max_seconds: float | None = Field(default=None, ge=0.0, description="wall-clock seconds the run may take "
                                      "from its start (refit and teacher caching included): training stops at the "
                                      "first step that ends past them (surgery.training.trainer.TimeLimit); None: "
                                      "no limit")
    bf16: bool = Field(default=False, description="the Trainer's bf16 mixed precision: only where the device "
                       "multiplies bf16 natively (surgery.compress.training_tier.bf16_training decides)")
    keep_best: bool = Field(default=False, description="at the end, restore the parameters of the epoch that "
                            "measured best on the eval split (needs one)")
    patience: int | None = Field(default=None, ge=1, description="stop once this many epochs in a row measured "
                                 "below the best on the eval split (needs one); None: run every epoch")
    masked_copies: int = Field(default=0, ge=0, description="copies of the training rows with tokens masked, "
                               "labelled by the teacher's outputs on them (a tokenizer with a mask token; a task's "
                               "logit distillation needs cache_teacher too); 0: the rows as they are")
    mask_rate: float = Field(default=0.15, gt=0.0, lt=1.0, description="share of a masked copy's tokens masked")
    cache_teacher: bool = Field(default=True, description="compute the teacher's logits (the embedding objective: "
                                "its sentence embeddings) once per run rather than at every step (where no "
                                "hidden-state term reads its layers)")
    # The embedding objective's neighbour term (surgery.embedding.objective.neighbour_loss); a task
    # recovery refuses it rather than ignore it.
    similarity_weight: float = Field(default=0.0, ge=0.0, description="embedding objective only: weight of the "
                                     "in-batch neighbour KL (0: off)")
    similarity_temperature: float = Field(default=0.05, gt=0.0, description="embedding objective only: "
                                          "temperature of the neighbour KL")

    def distill_config(self) -> DistillConfig:
        return DistillConfig(**{k: getattr(self, k) for k in DistillConfig.model_fields})


class RecoveryResult(BaseModel):
    """What a recovery run did: accuracy (fractions) before and after, epochs, per-epoch history, any refit."""

    epochs: int
    steps: int
    accuracy_before: float | None = None
    accuracy_after: float | None = None
    accuracy_refit: float | None = None  # after the least-squares refit, before any training
    seconds: float = 0.0
    hidden_weight: float = 0.0  # the hidden-state MSE weight the run used (the embedding objective defaults to 1)
    layer_map: dict[int, int] | None = None
    history: list[dict[str, Any]] = Field(default_factory=list)
    refit: RefitResult | None = None
    best_epoch: int | None = None  # the epoch whose parameters were kept (``keep_best``)
    stopped_early: bool = False  # ``patience`` ended the run before its budget
    time_limit_reached: bool = False  # ``max_seconds`` ended the run before its steps


def refit_before_training(model: nn.Module, teacher: nn.Module, data: Any,
                          config: RecoveryConfig) -> RefitResult | None:
    """The least-squares refit that ``config.refit`` asks for, on ``data``'s training batches (else None)."""
    if not config.refit:
        return None
    return refit_projections(model, teacher, task_calibration_batches(data, config.refit_batches,
                                                                 batch_size=config.batch_size))


def time_limit(config: RecoveryConfig) -> TimeLimit | None:
    """The run's wall-clock limit from now (None without ``max_seconds``): build it where the run starts.

    Example:
        >>> time_limit(RecoveryConfig()) is None, time_limit(RecoveryConfig(max_seconds=60)).seconds
        (True, 60.0)
    """
    return None if config.max_seconds is None else TimeLimit(config.max_seconds)


def recovery_arguments(output_dir: str, config: RecoveryConfig) -> Any:
    """The Trainer settings of a recovery run (budget and optimiser from ``config``).

    Example:
        >>> recovery_arguments("/tmp/x", RecoveryConfig(epochs=2, learning_rate=1e-4)).learning_rate
        0.0001
    """
    extra = {"max_steps": config.max_steps} if config.max_steps is not None else {}
    return training_arguments(output_dir, epochs=config.epochs, batch_size=config.batch_size,
                              learning_rate=config.learning_rate, weight_decay=config.weight_decay,
                              warmup_ratio=config.warmup_ratio, seed=config.seed, bf16=config.bf16,
                              micro_batch=config.micro_batch, **extra)


def require_labelled(data: Any, who: str) -> TaskData:
    """``data`` as TaskData with labels (training needs them), or a one-line DataError.

    Unlabelled sentence-embedding texts (:class:`surgery.embedding.TextData`) pass too: they bring
    their own objective (distillation of the sentence embeddings), which :func:`recover` runs.
    """
    return require_training_data(data, who)


def recover(model: nn.Module, teacher: nn.Module, task: TaskData, config: RecoveryConfig | None = None, *,
            progress: ProgressCallback | None = None, **settings: Any) -> RecoveryResult:
    """Distil ``teacher`` (the model before surgery) into ``model`` in place for ``config.epochs`` epochs.

    The loss is ``(1 - alpha)·CE + alpha·T²·KL`` on the logits, plus ``hidden_weight`` times the
    MSE of mapped hidden states (the default map follows the ``layer-drop`` steps the student took
    since the teacher). Accuracy on ``task.eval`` is measured before and after when it exists.

    Example:
        >>> import copy, datasets
        >>> from surgery.testing import TinySpec, tiny_model
        >>> from surgery.data.task_data import TaskData
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"))
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[2, 5, 3], [2, 6, 7, 3]], "labels": [0, 2]})
        >>> result = recover(model, copy.deepcopy(model), TaskData(rows, rows, ["a", "b", "c"]), epochs=1)
        >>> result.epochs, result.steps
        (1, 1)
    """
    cfg = config or RecoveryConfig(**settings)
    if getattr(task, "objective", "task") == "embedding":  # unlabelled texts bring their own objective
        return task.recover(model, teacher, cfg, progress=progress)  # type: ignore[attr-defined]
    task = require_labelled(task, "recovery")
    if cfg.similarity_weight > 0:
        raise ConfigError("recovery: similarity_weight is a term of the embedding objective (sentence embeddings); "
                          "set it to 0 for a task model, or recover on unlabelled texts")
    labels = (getattr(model.config, "num_labels", None), getattr(teacher.config, "num_labels", None))
    if labels[0] != labels[1]:
        raise ConfigError(f"recovery: the model has {labels[0]} labels but the teacher has {labels[1]}; the teacher "
                          "must be the same classifier before surgery")
    emit = progress or no_progress
    start = time.perf_counter()
    limit = time_limit(cfg)
    distill = cfg.distill_config()
    if distill.hidden_weight > 0 and distill.layer_map is None:
        layer_map = default_layer_map(adapter_for(model).num_layers, adapter_for(teacher).num_layers,
                                      steps_of(model)[len(steps_of(teacher)):])
        distill = distill.model_copy(update={"layer_map": layer_map})
    eval_loader = task.loader("eval", batch_size=cfg.batch_size) if task.eval is not None else None
    before = accuracy(model, eval_loader) if eval_loader is not None else None
    refit = refit_before_training(model, teacher, task, cfg)
    after_refit = accuracy(model, eval_loader) if refit is not None and eval_loader is not None else None
    if (cfg.keep_best or cfg.patience is not None) and eval_loader is None:
        raise ConfigError("recovery: keep_best and patience measure each epoch on the eval split, and the data has "
                          "none; give held-out examples or turn them off")
    history = EpochHistory(EpochStats(), evaluate=None if eval_loader is None else lambda m: accuracy(m, eval_loader),
                           emit=lambda task_, c, n, **info: emit(ProgressEvent(task_, c, n, info)), label="recovery",
                           keep_best=list(model.parameters()) if cfg.keep_best else None, patience=cfg.patience)
    steps = 0
    if cfg.epochs > 0:
        with scratch_dir("surgery-recover-") as tmp:
            args = recovery_arguments(tmp, cfg)
            steps = fit(model, task, args, teacher=teacher, distill=distill, history=history,
                        cache_teacher=cfg.cache_teacher, masked=cfg.masked_copies, mask_rate=cfg.mask_rate,
                        callbacks=[limit] if limit is not None else []).steps
    after = history.history[-1]["accuracy"] if history.history and eval_loader is not None else before
    if cfg.keep_best and history.best is not None:
        after = history.best[0]
    if cfg.epochs == 0 and after_refit is not None:
        after = after_refit
    return RecoveryResult(epochs=cfg.epochs, steps=steps, accuracy_before=before, accuracy_after=after,
                          accuracy_refit=after_refit, hidden_weight=distill.hidden_weight,
                          seconds=time.perf_counter() - start, layer_map=distill.layer_map, history=history.history,
                          refit=refit, best_epoch=history.best_epoch if cfg.keep_best else None,
                          stopped_early=history.stopped_early,
                          time_limit_reached=limit is not None and limit.reached)
