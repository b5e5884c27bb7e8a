"""``doe``: Decomposition of Experts (Yang et al.), as a pipeline of recorded steps.

1. ``soft-prompt`` step: 20 soft tokens; prompt tuning of the full model (MLM or classifier mode),
   giving the reference validation accuracy ``s``.
2. Attribution (eq. 2-3) of every unit of the module set on ``instances`` training instances, with
   ``P`` the gold class logit (the verbalizer word at ``[MASK]`` in MLM mode).
3. Binary search (:func:`surgery.strategies.doe.rate_search.binary_search_grid`) over the pruned fraction p on
   {0, 0.05, ..., 1}: each probe prunes the lowest p of all units of a copy of the tuned model,
   re-tunes the prompt starting from the full model's prompt (knowledge condensation; switch off
   with ``condensation=False``) and accepts if ``s - s' <= margin``.
4. ``zero-recovery-prune`` step with the accepted units on the model itself; the condensed prompt
   (and head) of the accepted probe are copied in. Reloading replays steps 1 and 4.

:func:`run_doe` runs it and hands the results back as data, a :class:`DoEResult`: the report (its
metrics), the task expert (removed units, prompt, head) ready for an
:class:`~surgery.strategies.doe.unplug.UnplugRuntime`, and the prompt-tuned full model's prompt (and head).
:func:`build_runtime` does that for several tasks.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field
from torch import nn

from surgery.core.errors import ConfigError, DataError
from surgery.core.progress import ProgressCallback
from surgery.core.report import SurgeryReport
from surgery.core.strategy import Data, StrategyConfig
from surgery.orchestration.api import convert
from surgery.orchestration.pipeline import Pipeline, PipelineSession
from surgery.scoring.importance import model_device
from surgery.strategies.doe.prompt_tuning import (
    PromptTask,
    evaluate,
    head_state,
    make_task,
    prepared,
    train,
    trainable,
    with_prompt_mask,
)
from surgery.strategies.doe.rate_search import binary_search_grid, pruning_grid
from surgery.strategies.doe.soft_prompt import SoftPromptStrategy, prompt_of
from surgery.strategies.doe.unplug import TaskExpert, UnplugRuntime
from surgery.strategies.doe.zero_recovery_prune import ZeroRecoveryPruningStrategy, lowest_module_units, module_scores

if TYPE_CHECKING:  # surgery.training imports transformers' Trainer, which doe itself never needs
    from surgery.training import RecoveryConfig


class DoEConfig(StrategyConfig):
    """Settings of ``doe`` (defaults from DoE §5.1 where the paper gives them).

    Example:
        >>> DoEConfig().margin, DoEConfig().max_probes, DoEConfig().prompt_length
        (1.0, 5, 20)
    """

    mode: Literal["auto", "mlm", "classifier"] = Field(
        default="auto", description="mlm (MLM head + verbalizer) or classifier (prompt + head); auto picks")
    task_name: str | None = Field(default=None, description="DoE Table 3 template/verbalizer preset (e.g. sst2)")
    template: str | None = Field(default=None, description="MLM template with {text} and <mask>")
    verbalizer: list[str] | None = Field(default=None, description="MLM: one word per label, in label order")
    prompt_length: int = Field(default=20, ge=1)
    epochs: int = Field(default=3, ge=1, description="prompt-tuning epochs of the full model")
    condense_epochs: int = Field(default=1, ge=1, description="prompt re-tuning epochs per probe")
    lr: float = Field(default=3e-2, gt=0, description="soft-prompt learning rate")
    head_lr: float = Field(default=2e-3, gt=0, description="classifier-mode head learning rate")
    batch_size: int = Field(default=32, ge=1)
    instances: int = Field(default=20, ge=1, description="training instances for attribution (paper: 20)")
    importance: Literal["attribution", "activation", "gradient", "random"] = "attribution"
    module_set: Literal["ffn", "attention", "dense", "all"] = "ffn"
    margin: float = Field(default=1.0, ge=0, description="psi: accepted accuracy drop in points")
    max_probes: int = Field(default=5, ge=1)
    grid_step: float = Field(default=0.05, gt=0, le=1)
    condensation: bool = Field(default=True, description="re-tune the prompt at each probe")
    min_keep: int = Field(default=1, ge=0, description="units that always stay per group and layer")
    seed: int = 0


class DoEPipeline(Pipeline):
    """Decomposition of Experts: prompt tuning, attribution, binary search with condensation.

    ``data`` must be a :class:`surgery.data.task_data.TaskData` with an evaluation split (the CLI passes
    one). Progress events: ``prompt-tuning`` per epoch (loss, accuracy), ``attribution``,
    ``search`` per probe (p, accuracy, accepted).

    Example:
        >>> DoEPipeline(epochs=1).config.module_set
        'ffn'
    """

    name = "doe"
    config_class = DoEConfig
    config: DoEConfig
    requires = "task-data"

    # -- pieces, public so benchmarks can run the paper's ablations with the same code ------
    def task_for(self, model: nn.Module, data: Any) -> PromptTask:
        return make_task(model, mode=self.config.mode, tokenizer=getattr(data, "tokenizer", None),
                         label_names=getattr(data, "label_names", None), template=self.config.template,
                         verbalizer=self.config.verbalizer, task_name=self.config.task_name)

    def tune(self, model: nn.Module, task: PromptTask, data: Any, epochs: int, label: str,
             emit: Callable[..., None] | None = None) -> list[dict[str, float]]:
        """Prompt-tune ``model`` in place (prompt, + head in classifier mode); keeps the best epoch.

        ``emit(task, completed, total, **info)`` receives one progress event per epoch.
        """
        groups = trainable(model, task, lr=self.config.lr, head_lr=self.config.head_lr)

        def on_epoch(epoch: int, loss: float, acc: float | None) -> None:
            if emit is not None:
                emit(label, epoch, epochs, loss=round(loss, 4), accuracy=None if acc is None else round(acc, 2))

        history = train(model, task, data, groups, epochs=epochs, batch_size=self.config.batch_size,
                        seed=self.config.seed, eval_data=data.loader("eval", batch_size=64), on_epoch=on_epoch)
        for p in model.parameters():
            p.requires_grad_(False)
        return history

    def scores(self, model: nn.Module, task: PromptTask, data: Any, kind: str | None = None
               ) -> dict[tuple[int, str], torch.Tensor]:
        """Unit importance on the first ``instances`` training instances (one batch, one backward)."""
        loader = data.loader("train", batch_size=self.config.instances, shuffle=True, seed=self.config.seed)
        batches = prepared(loader, task, model_device(model), max_batches=1)
        return module_scores(model, self.config.module_set, batches, kind=kind or self.config.importance,
                             objective=task.objective, forward=task.forward, token_mask=with_prompt_mask(model, task),
                             seed=self.config.seed)

    def localized(self, model: nn.Module, scores: Mapping[tuple[int, str], torch.Tensor], p: float
                  ) -> tuple[nn.Module, dict[str, dict[str, list[int]]]]:
        """A pruned copy of ``model`` without the lowest ``p`` of the units, and the removal map."""
        remove = lowest_module_units(scores, p, min_keep=self.config.min_keep)
        candidate = copy.deepcopy(model)
        ZeroRecoveryPruningStrategy(module_set=self.config.module_set, remove=remove).apply(
            candidate, {"module_set": self.config.module_set, "remove": remove})
        return candidate, remove

    # -- the pipeline -----------------------------------------------------------------------
    def run(self, model: nn.Module, data: Data | None, session: PipelineSession) -> None:
        task = self.task_for(model, data)
        torch.manual_seed(self.config.seed)
        if prompt_of(model) is None:
            session.step(SoftPromptStrategy(length=self.config.prompt_length, seed=self.config.seed))
        history = self.tune(model, task, data, self.config.epochs, "prompt-tuning", session.emit)
        eval_loader = data.loader("eval", batch_size=64)
        full_acc = evaluate(model, task, eval_loader)
        # Exactly what tuning trained: the prompt and, in classifier mode, the head as the adapter
        # defines it (a BERT pooler included, which lives inside the base model).
        tuned = {n: p.detach().clone() for n, p in model.named_parameters() if "surgery_prompt" in n}
        if task.mode == "classifier":
            tuned.update(head_state(model))
        session.emit("attribution", 0, 1)
        scores = self.scores(model, task, data)
        session.emit("attribution", 1, 1)
        # Only the latest accepted probe is kept: accepted values only grow during the search.
        kept: dict[float, tuple[nn.Module, dict[str, dict[str, list[int]]], float]] = {}
        probes = [0]

        def accept(p: float) -> tuple[bool, dict[str, Any]]:
            candidate, remove = self.localized(model, scores, p)
            if self.config.condensation:
                self.tune(candidate, task, data, self.config.condense_epochs, f"condensation p={p:.2f}", session.emit)
            acc = evaluate(candidate, task, eval_loader)
            ok = full_acc - acc <= self.config.margin
            probes[0] += 1
            session.emit("search", probes[0], self.config.max_probes, p=p, accuracy=round(acc, 2), accepted=ok)
            if ok:
                kept.clear()
                kept[p] = (candidate, remove, acc)
            return ok, {"accuracy": acc}

        result = binary_search_grid(accept, pruning_grid(self.config.grid_step), max_probes=self.config.max_probes)
        best = result.best if result.best is not None and result.best > 0 else 0.0
        accuracy = full_acc
        remove: dict[str, dict[str, list[int]]] = {}
        if best > 0:
            candidate, remove, accuracy = kept[best]
            session.step(ZeroRecoveryPruningStrategy(module_set=self.config.module_set, remove=remove))
            with torch.no_grad():  # the condensed prompt (and head) of the accepted probe
                own = dict(model.named_parameters())
                for name, p in candidate.named_parameters():
                    if name in own and own[name].shape == p.shape:
                        own[name].copy_(p)
        total = sum(len(s) for s in scores.values())
        removed = sum(len(v) for m in remove.values() for v in m.values())
        # In-memory results for the caller (run_doe): the run's artefacts, handed back in the report.
        session.context.artefacts["tuned"] = tuned
        session.context.artefacts["expert"] = TaskExpert.from_model(
            self.config.task_name or "task", model, remove, with_head=task.mode == "classifier",
            meta={"mode": task.mode, "module_set": self.config.module_set, "pruning_rate": best,
                  "accuracy": accuracy})
        session.metrics.update({
            "mode": task.mode,
            "prompt_history": history,
            "full_accuracy": full_acc,
            "pruning_rate": best,
            "units_removed": removed,
            "units_total": total,
            "accuracy": accuracy,
            "search": {"best": result.best, "upper": result.upper, "exact": result.exact,
                       "probes": [{"p": pr.value, "accepted": pr.accepted, **pr.info} for pr in result.probes]},
        })


@dataclass
class DoEResult:
    """What one ``doe`` run hands back, as data: its report, its task expert and the prompt-tuned full model.

    ``report.metrics`` holds the figures (``full_accuracy``, ``accuracy``, ``pruning_rate`` ...);
    ``expert`` (removed units, condensed prompt, head) plugs into an
    :class:`~surgery.strategies.doe.unplug.UnplugRuntime`; ``tuned`` is the prompt (and, in classifier
    mode, the head) of the prompt-tuned *full* model before the search, for comparisons. See
    :func:`run_doe` for an example.
    """

    report: SurgeryReport
    expert: TaskExpert
    tuned: dict[str, torch.Tensor]

    def restore_tuned(self, model: nn.Module) -> None:
        """Copy the prompt-tuned full model's prompt (and head) into ``model`` (same structure, not pruned)."""
        own = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in self.tuned.items():
                own[name].copy_(value)


def run_doe(model: nn.Module, data: Data, config: DoEConfig | Mapping[str, Any] | None = None, *,
            name: str | None = None, progress: ProgressCallback | None = None,
            recovery: RecoveryConfig | None = None) -> DoEResult:
    """Run ``doe`` on ``model`` in place (``surgery.convert``) and return its results as a :class:`DoEResult`.

    The expert is named ``name`` (default: the ``task_name`` setting, else ``"task"``) and records the
    data's label names in its metadata.

    Example:
        >>> import datasets
        >>> from surgery.data.task_data import TaskData
        >>> from surgery.testing import TinySpec, tiny_model
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[2, 5 + i % 2, 3] for i in range(8)],
        ...                                    "labels": [i % 2 for i in range(8)]})
        >>> data = TaskData(train=rows, eval=rows, label_names=["neg", "pos"], batch_size=8)
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"), num_labels=2)
        >>> result = run_doe(model, data, {"epochs": 1, "prompt_length": 4, "max_probes": 1}, name="toy")
        >>> result.expert.name, result.expert.meta["labels"], result.expert.prompt.shape[0]
        ('toy', ['neg', 'pos'], 4)
        >>> sorted(result.report.metrics)[:3]
        ['accuracy', 'full_accuracy', 'mode']
    """
    report = convert(model, DoEPipeline(config), data=data, progress=progress, recovery=recovery)
    artefacts = report.artefacts
    expert: TaskExpert = artefacts["expert"]
    if name is not None:
        expert.name = name
    labels = getattr(data, "label_names", None)
    if labels is not None:
        expert.meta["labels"] = list(labels)
    return DoEResult(report=report, expert=expert, tuned=artefacts["tuned"])


def runtime_config(config: DoEConfig | Mapping[str, Any] | None = None) -> DoEConfig:
    """The ``doe`` settings every task of a runtime shares; ``task_name`` is refused (each task is named by its key).

    Example:
        >>> runtime_config({"epochs": 2}).epochs
        2
        >>> runtime_config({"task_name": "sst2"})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: task_name: each task is named by its --task NAME=FILE ...
    """
    parsed = config if isinstance(config, DoEConfig) else DoEPipeline.parse_config(dict(config or {}))
    if parsed.task_name is not None:
        raise ConfigError("task_name: each task is named by its --task NAME=FILE (in Python, its key in "
                          "build_runtime's tasks); remove the setting")
    return parsed


def check_tasks(model: nn.Module, tasks: Mapping[str, Any], config: DoEConfig) -> None:
    """Refuse tasks that one runtime cannot hold: in classifier mode every expert's head has the model's shape."""
    if not tasks:
        return
    first = next(iter(tasks.values()))
    if DoEPipeline(config).task_for(model, first).mode != "classifier":
        return
    counts = {name: getattr(data, "num_labels", None) for name, data in tasks.items()}
    if len(set(counts.values())) > 1:
        raise DataError(f"tasks have different numbers of labels {counts}; in classifier mode every expert's "
                        "head has the full model's shape, so build one runtime per label count")


def build_runtime(model: nn.Module, tasks: Mapping[str, Any], config: DoEConfig | Mapping[str, Any] | None = None,
                  progress: ProgressCallback | None = None) -> tuple[UnplugRuntime, dict[str, dict[str, Any]]]:
    """Multi-task DoE: run ``doe`` per task on copies of ``model``; one runtime holds every expert.

    ``tasks`` maps a task name to its :class:`surgery.data.task_data.TaskData`; each name is also that task's
    ``task_name`` (its MLM template preset). The full ``model`` is not changed; returns the runtime
    and each task's DoE metrics. The settings and tasks are checked before any training
    (:func:`runtime_config`, :func:`check_tasks`).
    """
    shared = runtime_config(config)
    check_tasks(model, tasks, shared)
    runtime = UnplugRuntime(model)
    metrics: dict[str, dict[str, Any]] = {}
    for name, data in tasks.items():
        # Each task's work shows under its own name ("sst2: prompt-tuning"), not merged into one bar.
        result = run_doe(copy.deepcopy(model), data, shared.model_copy(update={"task_name": name}), name=name,
                         progress=None if progress is None else _prefixed(progress, name))
        runtime.add(result.expert)
        metrics[name] = result.report.metrics
    return runtime, metrics


def _prefixed(progress: ProgressCallback, name: str) -> ProgressCallback:
    return lambda event: progress(dataclasses.replace(event, task=f"{name}: {event.task}"))
