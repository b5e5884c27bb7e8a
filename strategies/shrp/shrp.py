"""``shrp``: the SHRP pipeline: progressive Expert Attention training, usage analysis, Top-1 pruning.

The pipeline (a :class:`~surgery.orchestration.pipeline.Pipeline`) records two ordinary steps, so a saved
model replays ``expert-attention`` and then ``top1-prune`` and never needs this module to reload:

1. ``expert-attention`` converts **all** target layers up front, so every parameter that training
   will touch exists when the optimizer is built. Each converted layer carries its original layer
   as a *bypass* and runs it until the layer's epoch (progressive conversion); at that epoch the
   experts are re-initialised from the bypass's then fine-tuned heads and take over.
2. Training runs on the Hugging Face :class:`~transformers.Trainer`: :class:`ShrpTrainer` adds the
   load-balance loss and :class:`ProgressiveConversion` (a ``TrainerCallback``) runs the schedule,
   so both also work from a user's own Trainer code. Optional stage 0 (``finetune_epochs``)
   fine-tunes the original model first, for an encoder that has not seen the task; stage 1
   (balance loss on) covers the conversion epochs, stage 2 (off) the ``extra_epochs`` after the
   last conversion.
3. At the end of training the bypasses are dropped: the model is exactly what the manifest
   rebuilds. (A bypass never enters the state dict, so even a mid-schedule save holds the
   converted layers only; Trainer checkpoints are therefore switched off here.)
4. A calibration pass on the evaluation data counts expert usage; ``top1-prune`` keeps the most
   used expert(s) per layer.

DDP: a bypassed layer's experts, and an activated layer's dropped original, get no gradient in a
step, so the Trainer runs with ``ddp_find_unused_parameters=True`` on purpose (experts of one
layer are one stacked parameter, so routing itself never leaves a parameter unused).
"""

from __future__ import annotations

import copy
import tempfile
import time
import warnings
from typing import Any

from torch import nn
from transformers import PrinterCallback, TrainerCallback, TrainingArguments

from surgery.anatomy import adapter_for
from surgery.anatomy.slicing import check_indices
from surgery.core.errors import ConfigError, DataError
from surgery.core.strategy import Data
from surgery.data.task_data import PaddingCollator, TaskData
from surgery.orchestration.pipeline import Pipeline, PipelineSession
from surgery.strategies.shrp.config import DEEP_CONVERSION_SETTINGS, ShrpConfig
from surgery.strategies.shrp.embedding_shrp import run_embedding_shrp
from surgery.strategies.shrp.expert_attention import (
    ExpertAttentionLayer,
    ExpertAttentionStrategy,
    expert_layers,
)
from surgery.strategies.shrp.shrp_training import (
    ProgressiveConversion,
    ProgressiveExpertDropping,
    ShrpTrainer,
    ShrpTrainingState,
    TeacherSnapshot,
    prepare_progressive,
    shrp_training_arguments,
)
from surgery.strategies.shrp.top1_prune import Top1PruningStrategy
from surgery.training import (
    DistillConfig,
    RecoveryConfig,
    accuracy,
    device_of,
    fit,
    recover,
    scratch_dir,
    train_columns,
    training_arguments,
)

# -- the pipeline ------------------------------------------------------------------------------
#: Below this many training examples SHRP's conversion is data-starved: on the project's suite
#: (3 tasks x 3 seeds, docs/results.md) SHRP-3/6 kept 90.3 % of the fine-tuned accuracy on average with
#: 600 examples, against 99.0 % with 2,000, while head+FFN pruning with distillation kept 96.5-101.9 % at 600.
SMALL_TRAINING_SET = 2000


def training_set_warning(examples: int) -> str | None:
    """One line when ``examples`` training examples are fewer than SHRP's suite needed, else None.

    Example:
        >>> training_set_warning(5000) is None
        True
        >>> training_set_warning(600)[:34]
        'shrp: only 600 training examples; '
    """
    if examples >= SMALL_TRAINING_SET:
        return None
    return (f"shrp: only {examples} training examples; each converted layer is re-learnt from them, and on the "
            f"project's suite SHRP-3/6 kept 90% of the fine-tuned accuracy with 600 examples against 99% with "
            f"{SMALL_TRAINING_SET:,} (docs/results.md). Use more labelled data, or head-prune + ffn-prune with "
            "recovery, which kept 96-102% with 600")


class ShrpPipeline(Pipeline):
    """SHRP end to end: convert, train progressively, analyse usage, prune to the Top-1 expert.

    ``data`` must be :class:`~surgery.data.task_data.TaskData` (train and eval splits with labels); the model
    a sequence classifier with as many labels as the data.

    Example:
        >>> ShrpPipeline(num_layers=2, extra_epochs=1).config.order
        'top-down'
    """

    name = "shrp"
    config_class = ShrpConfig
    config: ShrpConfig
    requires = "task-data"
    objectives = ("task", "embedding")

    def conversion_order(self, num_layers: int) -> list[int]:
        """The target layers in conversion order."""
        if self.config.layers is not None:
            order = list(self.config.layers)
            check_indices(order, num_layers, f"{self.name}: layers")
            if len(set(order)) != len(order):
                raise ConfigError(f"{self.name}: layers must be distinct, got {order}")
            return order
        n = self.config.num_layers or max(1, num_layers // 2)
        if n > num_layers:
            raise ConfigError(f"{self.name}: num_layers={n} but the model has only {num_layers} layers")
        top_down = list(range(num_layers - 1, num_layers - 1 - n, -1))
        return top_down if self.config.order == "top-down" else list(range(n))

    def steps(self, model: nn.Module, data: Any = None) -> list[str]:
        return ["expert-attention", "top1-prune"]

    def schedule(self, model: nn.Module, data: Any = None) -> dict[str, Any]:
        order = self.conversion_order(adapter_for(model).num_layers)
        return {"layers": order, "epochs": self.total_epochs(len(order)),
                "between": "progressive training (stages 0-2), then usage analysis on the evaluation data"}

    def run(self, model: nn.Module, data: Data | None, session: PipelineSession) -> None:
        if getattr(data, "objective", "task") == "embedding":  # unlabelled texts: distil sentence embeddings
            return run_embedding_shrp(self, model, data, session)
        task: TaskData = data  # checked against `requires` by convert
        num_labels = int(getattr(model.config, "num_labels", 0))
        if num_labels != task.num_labels:
            raise DataError(f"{self.name}: the model has {num_labels} labels but the data has {task.num_labels} "
                            f"({task.label_names[:5]}); load the model with num_labels={task.num_labels}")
        total = adapter_for(model).num_layers
        requested = self.config
        resolved = requested.for_depth(len(self.conversion_order(total)), total)
        if resolved is not requested:  # the report's config stays what the user asked; metrics say what ran
            session.metrics["deep_conversion_settings"] = {
                k: getattr(resolved, k) for k in DEEP_CONVERSION_SETTINGS if k not in requested.model_fields_set}
        # The resolved settings travel as an argument: run state never lives on the method object.
        self.run_task(model, task, session, resolved)

    def settings(self, cfg: ShrpConfig | None) -> ShrpConfig:
        """``cfg`` (settings resolved for one run) or, when a stage is called on its own, the configured ones."""
        return cfg if cfg is not None else self.config

    def run_task(self, model: nn.Module, task: TaskData, session: PipelineSession,
                 cfg: ShrpConfig | None = None) -> None:
        """The task objective's run with ``cfg``, the settings already resolved for the conversion depth."""
        cfg = self.settings(cfg)
        eval_loader = task.loader("eval", batch_size=cfg.batch_size)
        reference = copy.deepcopy(model) if cfg.bench else None
        start = time.perf_counter()
        session.metrics["data"] = dict(task.info, split_seed=task.split_seed, labels=task.label_names)
        small = training_set_warning(len(task.train))
        if small is not None:  # a report field for the caller, and one line for an interactive user
            session.metrics["data_warning"] = small
            warnings.warn(small, UserWarning, stacklevel=2)
        session.metrics["accuracy_input"] = accuracy(model, eval_loader)
        layers = self.convert_layers(model, session, cfg)
        history = self.train(model, session, task, layers, session.metrics["layers"], eval_loader, cfg)
        history += self.train_stage2(model, session, task, layers, eval_loader, cfg)
        session.context.artefacts.pop("teacher", None)  # training's copy; not a result of the run
        session.metrics["history"] = history
        session.metrics["train_seconds"] = time.perf_counter() - start
        teacher = copy.deepcopy(model).eval() if cfg.recover_epochs > 0 else None
        self.cut(model, session, eval_loader, cfg)
        if teacher is not None:
            finetune_after_cut(model, teacher, task, cfg)
            session.metrics["accuracy_recovered"] = accuracy(model, eval_loader)
        if reference is not None:
            from surgery.measure.bench import bench_models

            report = bench_models({"input": reference, "shrp": model}, batch_size=cfg.bench_batch_size,
                                  seq_len=cfg.bench_seq_len, repeats=cfg.bench_repeats, warmup=1)
            session.metrics["bench"] = report.model_dump(mode="json")

    def convert_layers(self, model: nn.Module, session: PipelineSession,
                       cfg: ShrpConfig | None = None) -> dict[int, ExpertAttentionLayer]:
        """Record ``expert-attention`` on the target layers, each bypassed by its original until its epoch."""
        cfg = self.settings(cfg)
        adapter = adapter_for(model)
        order = self.conversion_order(adapter.num_layers)
        session.metrics["layers"] = order
        originals = {i: adapter.layers()[i] for i in order}
        session.step(ExpertAttentionStrategy(
            layers=order, router_input=cfg.router_input, router_grad=cfg.router_grad, top_k=cfg.top_k,
            expander=cfg.expander, expander_init=cfg.expander_init, expander_gain=cfg.expander_gain, seed=cfg.seed))
        return prepare_progressive(model, originals)

    def cut(self, model: nn.Module, session: PipelineSession, eval_loader: Any, cfg: ShrpConfig | None = None) -> None:
        """Usage analysis on the evaluation data, then the recorded ``top1-prune`` step, with accuracy around it."""
        # The counts are also persisted in the layers' buffers.
        for _, layer in expert_layers(model):
            layer.usage.zero_()
        metrics = session.metrics
        metrics["accuracy_moe"] = accuracy(model, eval_loader, progress=lambda c, n: session.emit("evaluate", c, n))
        prune = session.step(Top1PruningStrategy(keep=self.settings(cfg).keep), data=eval_loader)
        metrics["usage"] = prune.metrics.get("usage")
        metrics["coverage"] = prune.metrics.get("coverage")
        metrics["accuracy_pruned"] = accuracy(model, eval_loader)

    def _trainer(self, model: nn.Module, task: TaskData, args: TrainingArguments, callbacks: list[TrainerCallback],
                 state: ShrpTrainingState, cfg: ShrpConfig) -> ShrpTrainer:
        distill = DistillConfig(alpha=cfg.distill_alpha, temperature=cfg.distill_temperature,
                                hidden_weight=cfg.distill_hidden_weight)
        trainer = ShrpTrainer(model=model, args=args, train_dataset=train_columns(task),
                              data_collator=PaddingCollator(task.tokenizer), callbacks=callbacks, shrp_state=state,
                              distill=distill)
        # Progress reaches the caller through surgery's events; the Trainer's printer would also
        # write its raw log dicts to stdout.
        trainer.remove_callback(PrinterCallback)
        return trainer

    def total_epochs(self, num_converted: int, cfg: ShrpConfig | None = None) -> int:
        """Epochs of stages 0, 1 and 2 together."""
        cfg = self.settings(cfg)
        return cfg.finetune_epochs + num_converted + cfg.extra_epochs

    def train(self, model: nn.Module, session: PipelineSession, task: TaskData,
              layers: dict[int, ExpertAttentionLayer], order: list[int], eval_loader: Any,
              cfg: ShrpConfig | None = None) -> list[dict[str, Any]]:
        """Stages 0 and 1 (stage 2 too when it has no epochs) on the HF Trainer; returns per-epoch figures.

        The learning rate decays linearly over all three stages; stage 2 is a second Trainer run
        (:meth:`train_stage2`) that continues the same schedule, so stage-2 variants can start from
        one stage-1 model.
        """
        cfg = self.settings(cfg)
        state = ShrpTrainingState()
        epochs = self.total_epochs(len(order), cfg)
        stop = cfg.finetune_epochs + len(order) if cfg.extra_epochs else None
        callback = ProgressiveConversion(layers, order, state, balance_weight=cfg.balance_weight,
                                         delay=cfg.finetune_epochs, stop_after=stop,
                                         reinit=cfg.reinit_on_activate,
                                         eval_loader=eval_loader if cfg.eval_each_epoch else None,
                                         emit=session.emit, total_epochs=epochs)
        callbacks: list[TrainerCallback] = [callback]
        if cfg.distill_alpha > 0 or cfg.distill_hidden_weight > 0:
            # Before the conversion callback in the list: the copy is taken before a layer switches over.
            callbacks.insert(0, TeacherSnapshot(state, at_epoch=cfg.finetune_epochs))
        with tempfile.TemporaryDirectory(prefix="shrp-") as tmp:
            self._trainer(model, task, shrp_training_arguments(cfg, epochs, tmp), callbacks, state, cfg).train()
        model.eval()
        home = device_of(model)
        if state.teacher is not None and home is not None:
            # Copied from the model during training, on the Trainer's device (a GPU where there is one), and perhaps
            # never handed to the trainer (a run that stops as the copy is taken): it goes where the model went back.
            state.teacher.to(home)
        session.context.artefacts["teacher"] = state.teacher
        return state.history

    def train_stage2(self, model: nn.Module, session: PipelineSession, task: TaskData,
                     layers: dict[int, ExpertAttentionLayer], eval_loader: Any,
                     cfg: ShrpConfig | None = None) -> list[dict[str, Any]]:
        """Stage 2 (``extra_epochs``): no balance loss; concentration pressure and expert dropping if set."""
        cfg = self.settings(cfg)
        if cfg.extra_epochs == 0:
            return []
        state = ShrpTrainingState(teacher=session.context.artefacts.get("teacher"))
        done = self.total_epochs(len(layers), cfg) - cfg.extra_epochs
        callbacks: list[TrainerCallback] = [ProgressiveConversion(
            layers, list(layers), state, delay=cfg.finetune_epochs, first_epoch=done,
            concentration_weight=cfg.concentration_weight,
            eval_loader=eval_loader if cfg.eval_each_epoch else None, emit=session.emit,
            total_epochs=self.total_epochs(len(layers), cfg))]
        dropping = None
        if cfg.expert_dropping == "halve":
            dropping = ProgressiveExpertDropping(layers, end=cfg.dropping_end, keep=cfg.keep)
            callbacks.append(dropping)
        # The rate where the one-run linear schedule would be at the start of stage 2, decaying to 0.
        lr = cfg.learning_rate * cfg.extra_epochs / self.total_epochs(len(layers), cfg)
        with tempfile.TemporaryDirectory(prefix="shrp-") as tmp:
            args = shrp_training_arguments(cfg, cfg.extra_epochs, tmp, learning_rate=lr, warmup_steps=0)
            self._trainer(model, task, args, callbacks, state, cfg).train()
        model.eval()
        if dropping is not None:
            session.metrics["expert_drops"] = dropping.events
        return state.history


def finetune_after_cut(model: nn.Module, teacher: nn.Module, task: TaskData, config: ShrpConfig) -> None:
    """Recovery after the Top-1 cut: ``config.recover_epochs`` of distillation from ``teacher`` (the routed model).

    Example:
        >>> import copy, datasets
        >>> from surgery.testing import TinySpec, tiny_model
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[2, 5, 3]] * 4, "labels": [0, 1, 2, 0]})
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"))
        >>> finetune_after_cut(model, copy.deepcopy(model), TaskData(rows, rows, ["a", "b", "c"]),
        ...                    ShrpConfig(recover_epochs=1))
    """
    recover(model, teacher, task, RecoveryConfig(
        epochs=config.recover_epochs, learning_rate=config.recover_learning_rate or config.learning_rate,
        batch_size=config.batch_size, seed=config.seed))


def finetune(model: nn.Module, task: TaskData, *, epochs: int, learning_rate: float, seed: int = 0,
             batch_size: int = 32) -> None:
    """Plain cross-entropy fine-tuning of a sequence classifier on the HF Trainer (linear decay, no checkpoints).

    Example:
        >>> import datasets
        >>> from surgery.testing import TinySpec, tiny_model
        >>> rows = datasets.Dataset.from_dict({"input_ids": [[2, 5, 3]] * 4, "labels": [0, 1, 2, 0]})
        >>> model = tiny_model(TinySpec("bert", task="seq-cls"))
        >>> finetune(model, TaskData(rows, rows, ["a", "b", "c"]), epochs=1, learning_rate=1e-3)
    """
    with scratch_dir("surgery-finetune-") as tmp:
        fit(model, task, training_arguments(tmp, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                                           seed=seed))
