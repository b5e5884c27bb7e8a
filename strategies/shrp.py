"""``shrp``: the SHRP pipeline: progressive Expert Attention training, usage analysis, Top-1 pruning.

The pipeline (a :class:`~surgery.pipeline.PipelineStrategy`) records two ordinary steps, so a saved
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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch import nn
from transformers import PrinterCallback, TrainerCallback, TrainingArguments

from surgery.anatomy import adapter_for
from surgery.data import PaddingCollator, TaskData
from surgery.errors import ConfigError, DataError
from surgery.ops import check_indices
from surgery.pipeline import Pipeline, PipelineSession
from surgery.strategies.expert_attention import (
    ExpanderInit,
    ExpanderKind,
    ExpertAttentionLayer,
    ExpertAttentionStrategy,
    RouterGrad,
    RouterInput,
    balance_loss,
    concentration_loss,
    expert_layers,
)
from surgery.strategies.top1_prune import Top1PruningStrategy
from surgery.strategy import Data, StrategyConfig
from surgery.training import (
    DistillConfig,
    EpochStats,
    RecoveryConfig,
    SurgeryTrainer,
    accuracy,
    fit,
    recover,
    scratch_dir,
    train_columns,
)
from surgery.training import training_arguments as trainer_arguments

ExpertDropping = Literal["off", "halve"]


class ShrpConfig(StrategyConfig):
    """Settings of the ``shrp`` pipeline.

    Example:
        >>> ShrpConfig(layers=[5, 4, 3]).extra_epochs
        2
    """

    layers: list[int] | None = Field(default=None, description="layers to convert, in conversion order")
    num_layers: int | None = Field(default=None, ge=1, description="how many layers (when 'layers' is not given)")
    order: Literal["top-down", "bottom-up"] = Field(default="top-down",
                                                    description="conversion order when 'layers' is not given")
    finetune_epochs: int = Field(default=0, ge=0,
                                 description="plain fine-tuning epochs before the first conversion (stage 0), for "
                                             "an encoder not yet fine-tuned on the task, e.g. with a new head")
    extra_epochs: int = Field(default=2, ge=0, description="epochs after the last conversion (stage 2)")
    balance_weight: float = Field(default=0.1, ge=0.0, description="λ of the load-balance loss in stage 1")
    keep: int = Field(default=1, ge=1, description="experts kept per layer by Top-1 pruning")
    # "halve" makes the cut exact by construction (docs/shrp.md#safe-top-1-pruning); provisional until the
    # multi-task comparison (docs/results.md, scripts/compare_top1.py) has all its runs.
    expert_dropping: ExpertDropping = Field(
        default="halve", description="stage 2: 'halve' masks out the less-used half of each layer's experts step by "
                                     "step (running usage) until `keep` remain, so the cut changes nothing; 'off': "
                                     "the cut takes the most-used experts after training (needs extra_epochs >= 1)")
    dropping_end: float = Field(default=0.5, gt=0.0, le=1.0,
                                description="fraction of stage 2 after which only `keep` experts per layer are left")
    concentration_weight: float = Field(default=0.0, ge=0.0,
                                        description="stage 2: weight of the entropy of the batch-mean router "
                                                    "distribution (pushes each layer onto one expert)")
    recover_epochs: int = Field(default=0, ge=0,
                                description="epochs of distillation recovery after the Top-1 cut (teacher: the "
                                            "routed model just before the cut)")
    distill_alpha: float = Field(default=0.5, ge=0.0, le=1.0,
                                 description="stages 1-2: weight of the logit distillation (T²·KL) from the model as "
                                             "it was when conversion began; 1 - alpha weights the labels' CE (0: off)")
    distill_temperature: float = Field(default=2.0, gt=0.0, description="temperature of that distillation")
    distill_hidden_weight: float = Field(default=0.0, ge=0.0,
                                         description="weight of the per-layer hidden-state MSE to the same teacher")
    recover_learning_rate: float | None = Field(default=None, gt=0.0,
                                                description="learning rate of the recovery (default: learning_rate)")
    router_input: RouterInput = "cls"
    router_grad: RouterGrad = "straight-through"
    top_k: int = Field(default=1, ge=1)
    expander: ExpanderKind = "linear"
    expander_init: ExpanderInit = "output"
    expander_gain: float = Field(default=1.0, ge=0.0, description="initial γ of the Expander's LayerNorm "
                                 "(expert-attention's option; the embedding objective defaults to 0.1)")
    reinit_on_activate: bool = Field(default=True,
                                     description="initialise experts from the layer's fine-tuned heads at its epoch")
    learning_rate: float = Field(default=5e-5, gt=0.0)
    weight_decay: float = Field(default=0.01, ge=0.0)
    warmup_ratio: float = Field(default=0.0, ge=0.0, lt=1.0)
    batch_size: int = Field(default=32, ge=1)
    seed: int = 0
    eval_each_epoch: bool = Field(default=True, description="evaluation accuracy after every epoch")
    bench: bool = Field(default=True, description="measure params/FLOPs/throughput against the input model")
    bench_batch_size: int = Field(default=32, ge=1)
    bench_seq_len: int = Field(default=64, ge=1)
    bench_repeats: int = Field(default=5, ge=1)

    @model_validator(mode="after")
    def _stage2_needs_epochs(self) -> ShrpConfig:
        # Expert dropping is on by default; with no stage 2 it has nowhere to run and the cut is taken as before.
        if self.extra_epochs == 0 and self.concentration_weight > 0:
            raise ValueError("concentration_weight acts in stage 2; set extra_epochs >= 1")
        return self


# -- Trainer integration -----------------------------------------------------------------------
@dataclass
class ShrpTrainingState(EpochStats):
    """What :class:`ShrpTrainer` and :class:`ProgressiveConversion` share during training.

    The running loss/accuracy counters are :class:`surgery.training.EpochStats`'; SHRP adds the
    balance loss, the router usage and the per-epoch history.
    """

    balance_weight: float = 0.0
    concentration_weight: float = 0.0
    #: Distillation's teacher once conversion has begun (:class:`TeacherSnapshot` sets it).
    teacher: nn.Module | None = None
    balance_sum: float = 0.0
    usage: dict[int, list[int]] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)

    def reset_epoch(self) -> None:
        self.reset()
        self.balance_sum = 0.0
        self.usage = {}


class ShrpTrainer(SurgeryTrainer):
    """A :class:`~surgery.training.SurgeryTrainer` that adds SHRP's load-balance loss (weight set by the schedule).

    The task loss (and distillation, given a ``teacher``) comes from the base class.

    Use it with :class:`ProgressiveConversion` in your own training code, or let the ``shrp``
    strategy drive both.

    Example:
        >>> import inspect
        >>> "compute_loss" in ShrpTrainer.__dict__
        True
    """

    def __init__(self, *args: Any, shrp_state: ShrpTrainingState | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shrp_state = shrp_state or ShrpTrainingState()

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        state = self.shrp_state
        if self.teacher is None and state.teacher is not None:
            self.teacher = state.teacher.eval()
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                             num_items_in_batch=num_items_in_batch)
        if model.training:
            aux = balance_loss(model)
            if aux is not None and state.balance_weight > 0:
                loss = loss + state.balance_weight * aux.to(loss.dtype)
            conc = concentration_loss(model) if state.concentration_weight > 0 else None
            if conc is not None:
                loss = loss + state.concentration_weight * conc.to(loss.dtype)
            state.steps += 1
            state.loss_sum += float(loss.detach())
            state.balance_sum += float(aux.detach()) if aux is not None else 0.0
            labels = inputs.get("labels")
            logits = outputs["logits"] if isinstance(outputs, dict) else outputs[1]
            if labels is not None:
                state.correct += int((logits.detach().argmax(-1) == labels).sum())
                state.seen += int(labels.numel())
            for i, layer in expert_layers(_unwrap(model)):
                if layer.active and layer.last_choice is not None:
                    counts = torch.bincount(layer.last_choice.cpu(), minlength=layer.num_experts).tolist()
                    old = state.usage.get(i, [0] * layer.num_experts)
                    state.usage[i] = [a + b for a, b in zip(old, counts, strict=True)]
        return (loss, outputs) if return_outputs else loss


def _unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)


class ProgressiveConversion(TrainerCallback):
    """SHRP's schedule as a ``TrainerCallback``: one more layer per epoch, balance loss while converting.

    ``order`` lists the Expert Attention layers in conversion order; they must carry their original
    layers as bypasses (:meth:`ExpertAttentionLayer.attach_bypass`, or :func:`prepare_progressive`).
    The first ``delay`` epochs fine-tune the original model (stage 0); then epoch ``e`` (0-based)
    activates ``order[: e - delay + 1]``; the balance loss is on during the ``len(order)``
    conversion epochs (stage 1) and off afterwards (stage 2), where ``concentration_weight`` (if
    any) applies instead. ``stop_after=E`` ends training after epoch ``E`` (the ``shrp`` pipeline
    runs stage 2 as a second Trainer run); ``first_epoch`` numbers the epochs of such a later run.
    At the end of training the bypasses are released, so the model is exactly what a reload of its
    manifest builds.

    Example:
        >>> cb = ProgressiveConversion({}, order=[], state=ShrpTrainingState())
        >>> cb.order
        []
    """

    def __init__(self, layers: dict[int, ExpertAttentionLayer], order: list[int], state: ShrpTrainingState, *,
                 balance_weight: float = 0.1, reinit: bool = True, eval_loader: Any = None,
                 emit: Callable[..., None] | None = None, total_epochs: int | None = None, delay: int = 0,
                 concentration_weight: float = 0.0, first_epoch: int = 0, stop_after: int | None = None) -> None:
        self.layers, self.order, self.state = layers, list(order), state
        self.delay, self.first_epoch, self.stop_after = delay, first_epoch, stop_after
        self.concentration_weight = concentration_weight
        self.balance_weight, self.reinit, self.eval_loader = balance_weight, reinit, eval_loader
        self.emit = emit or (lambda *a, **k: None)
        self.total_epochs = total_epochs
        self.epoch = 0
        self.steps_per_epoch: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loader = kwargs.get("train_dataloader")
        self.steps_per_epoch = len(loader) if loader is not None and hasattr(loader, "__len__") else None
        self.total_epochs = self.total_epochs or int(args.num_train_epochs)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.epoch = self.first_epoch + round(state.epoch or 0)
        for i in self.order[: max(0, self.epoch - self.delay + 1)]:
            layer = self.layers[i]
            if not layer.active:
                layer.activate(reinit_from_bypass=self.reinit)
        self.state.balance_weight = self.balance_weight if self.stage == 1 else 0.0
        self.state.concentration_weight = self.concentration_weight if self.stage == 2 else 0.0
        self.state.reset_epoch()

    @property
    def stage(self) -> int:
        """0: fine-tuning before any conversion; 1: converting (balance loss on); 2: after the last conversion."""
        if self.epoch < self.delay:
            return 0
        return 1 if self.epoch - self.delay < len(self.order) else 2

    def _info(self) -> dict[str, Any]:
        s = self.state
        info: dict[str, Any] = {"loss": s.loss_sum / s.steps if s.steps else None,
                                "acc": s.correct / s.seen if s.seen else None,
                                "usage": {str(i): u for i, u in sorted(s.usage.items())},
                                "stage": self.stage,
                                "converted": sum(layer.active for layer in self.layers.values())}
        return info

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if args.process_index != 0:
            return
        done = self.state.steps
        self.emit(self._task(), done, self.steps_per_epoch, **self._info())

    def _task(self) -> str:
        return f"epoch {self.epoch + 1}/{self.total_epochs}"

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        info = self._info()
        if self.eval_loader is not None:
            info["eval_acc"] = accuracy(_unwrap(kwargs["model"]), self.eval_loader)
        info["epoch"] = self.epoch + 1
        self.state.history.append(info)
        if args.process_index == 0:
            self.emit(self._task(), self.steps_per_epoch or self.state.steps, self.steps_per_epoch, **info)
        if self.stop_after is not None and self.epoch + 1 >= self.stop_after:
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for layer in self.layers.values():
            if not layer.active:  # training ended before this layer's epoch: convert it anyway
                layer.activate(reinit_from_bypass=self.reinit)
            layer.release_bypass()


class TeacherSnapshot(TrainerCallback):
    """Distillation's teacher for SHRP: a frozen copy of the model taken when conversion begins.

    With stage 0 (``finetune_epochs``) the copy is taken after it, so the teacher is the fine-tuned
    model and never a fresh head; without stage 0 it is the input model. The copy is put in the
    shared :class:`ShrpTrainingState`, where :class:`ShrpTrainer` picks it up.

    Example:
        >>> TeacherSnapshot(ShrpTrainingState(), at_epoch=1).at_epoch
        1
    """

    def __init__(self, state: ShrpTrainingState, *, at_epoch: int) -> None:
        self.state, self.at_epoch = state, at_epoch

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.state.teacher is None and round(state.epoch or 0) >= self.at_epoch:
            # Bypassed layers still run their original, so the copy computes the unconverted model.
            self.state.teacher = copy.deepcopy(_unwrap(kwargs["model"])).eval()


def halving_sizes(num_experts: int, keep: int = 1) -> list[int]:
    """Experts left after each step of progressive dropping: halve (rounding up) down to ``keep``.

    Example:
        >>> halving_sizes(12)
        [6, 3, 2, 1]
    """
    sizes, n = [], num_experts
    while n > keep:
        n = max(keep, -(-n // 2))
        sizes.append(n)
    return sizes


class ProgressiveExpertDropping(TrainerCallback):
    """Stage 2's progressive expert dropping as a ``TrainerCallback``.

    Each routed layer loses the less-used half of its remaining experts at evenly spaced steps over
    the first ``end`` fraction of training, until ``keep`` are left; usage is the router's argmax
    counts on the training batches since the previous drop (ties: higher mean router probability).
    Dropped experts are masked out of the router (:meth:`ExpertAttentionLayer.restrict_experts`),
    so the surviving expert is trained on every input for the rest of the run, and the Top-1 cut
    that follows removes only experts the model can no longer pick: the pruned model is the model
    that was trained last. ``events`` records every drop.

    Example:
        >>> cb = ProgressiveExpertDropping({}, end=0.5)
        >>> cb.events
        []
    """

    def __init__(self, layers: dict[int, ExpertAttentionLayer], *, end: float = 0.5, keep: int = 1) -> None:
        self.layers, self.end, self.keep = layers, end, keep
        self.counts: dict[int, torch.Tensor] = {}
        self.mass: dict[int, torch.Tensor] = {}
        self.schedule: dict[int, int] = {}   # global step -> how many drops are done after it
        self.events: list[dict[str, Any]] = []
        self._hooks: list[Any] = []
        self._done = 0

    def _count(self, index: int) -> Callable[..., None]:
        def hook(module: ExpertAttentionLayer, args: Any, output: Any) -> None:
            if module.training and module.last_choice is not None:
                self.counts[index] += torch.bincount(module.last_choice.cpu(), minlength=module.num_experts)
                self.mass[index] += module.last_probs.detach().float().sum(0).cpu()
        return hook

    def _reset_window(self) -> None:
        for i, layer in self.layers.items():
            self.counts[i] = torch.zeros(layer.num_experts, dtype=torch.long)
            self.mass[i] = torch.zeros(layer.num_experts)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._reset_window()
        self._hooks = [layer.register_forward_hook(self._count(i)) for i, layer in self.layers.items()]
        drops = max((len(halving_sizes(int(layer.allowed.sum()), self.keep)) for layer in self.layers.values()),
                    default=0)
        total = max(1, int(state.max_steps))
        self.schedule = {max(1, round(total * self.end * (k + 1) / drops)): k + 1 for k in range(drops)}

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        target = self.schedule.get(int(state.global_step))
        while target is not None and self._done < target:
            self.drop(int(state.global_step))

    def drop(self, step: int) -> None:
        """One halving step on every layer that still has more than ``keep`` experts."""
        self._done += 1
        for i, layer in self.layers.items():
            allowed = [int(e) for e in torch.nonzero(layer.allowed).flatten()]
            if len(allowed) <= self.keep:
                continue
            n = max(self.keep, -(-len(allowed) // 2))
            counts, mass = self.counts[i], self.mass[i]
            ranked = sorted(allowed, key=lambda e: (-int(counts[e]), -float(mass[e]), e))[:n]
            layer.restrict_experts(sorted(ranked))
            self.events.append({"step": step, "layer": i, "kept": sorted(ranked),
                                "window_usage": [int(counts[e]) for e in allowed], "from": allowed})
        self._reset_window()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Training stopped before the schedule ended: finish dropping so the cut still changes nothing.
        while any(int(layer.allowed.sum()) > self.keep for layer in self.layers.values()):
            self.drop(int(state.global_step))
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def prepare_progressive(model: nn.Module, originals: dict[int, nn.Module]) -> dict[int, ExpertAttentionLayer]:
    """Attach each original layer as the bypass of its Expert Attention replacement (all bypassed).

    Example:
        >>> prepare_progressive(nn.Linear(2, 2), {})
        {}
    """
    layers = dict(expert_layers(model)) if originals else {}
    for i, original in originals.items():
        if i not in layers:
            raise ConfigError(f"layer {i} is not an Expert Attention layer; convert it before preparing the schedule")
        layers[i].attach_bypass(original)
    return {i: layers[i] for i in originals}


def training_arguments(config: ShrpConfig, epochs: int, output_dir: str, **overrides: Any) -> TrainingArguments:
    """The Trainer settings of an SHRP run (no checkpoints; unused parameters found on purpose)."""
    values: dict[str, Any] = dict(
        output_dir=output_dir, num_train_epochs=epochs, per_device_train_batch_size=config.batch_size,
        per_device_eval_batch_size=config.batch_size, learning_rate=config.learning_rate,
        weight_decay=config.weight_decay, warmup_steps=config.warmup_ratio, lr_scheduler_type="linear",
        save_strategy="no", eval_strategy="no", logging_strategy="no", report_to=[], seed=config.seed,
        data_seed=config.seed, disable_tqdm=True, remove_unused_columns=False,
        # Bypassed layers' experts and activated layers' originals get no gradient in a step.
        ddp_find_unused_parameters=True, use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
    )
    values.update(overrides)
    return TrainingArguments(**values)


# -- the pipeline ------------------------------------------------------------------------------
class ShrpStrategy(Pipeline):
    """SHRP end to end: convert, train progressively, analyse usage, prune to the Top-1 expert.

    ``data`` must be :class:`~surgery.data.TaskData` (train and eval splits with labels); the model
    a sequence classifier with as many labels as the data.

    Example:
        >>> ShrpStrategy(num_layers=2, extra_epochs=1).config.order
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
            from surgery.embedding.shrp import run_embedding_shrp

            return run_embedding_shrp(self, model, data, session)
        task: TaskData = data  # checked against `requires` by convert
        num_labels = int(getattr(model.config, "num_labels", 0))
        if num_labels != task.num_labels:
            raise DataError(f"{self.name}: the model has {num_labels} labels but the data has {task.num_labels} "
                            f"({task.label_names[:5]}); load the model with num_labels={task.num_labels}")
        cfg = self.config
        eval_loader = task.loader("eval", batch_size=cfg.batch_size)
        reference = copy.deepcopy(model) if cfg.bench else None
        start = time.perf_counter()
        session.metrics["data"] = dict(task.info, split_seed=task.split_seed, labels=task.label_names)
        session.metrics["accuracy_input"] = accuracy(model, eval_loader)
        layers = self.convert_layers(model, session)
        history = self.train(model, session, task, layers, session.metrics["layers"], eval_loader)
        history += self.train_stage2(model, session, task, layers, eval_loader)
        session.context.artefacts.pop("teacher", None)  # training's copy; not a result of the run
        session.metrics["history"] = history
        session.metrics["train_seconds"] = time.perf_counter() - start
        teacher = copy.deepcopy(model).eval() if cfg.recover_epochs > 0 else None
        self.cut(model, session, eval_loader)
        if teacher is not None:
            finetune_after_cut(model, teacher, task, cfg)
            session.metrics["accuracy_recovered"] = accuracy(model, eval_loader)
        if reference is not None:
            from surgery.bench import bench_models

            report = bench_models({"input": reference, "shrp": model}, batch_size=cfg.bench_batch_size,
                                  seq_len=cfg.bench_seq_len, repeats=cfg.bench_repeats, warmup=1)
            session.metrics["bench"] = report.model_dump(mode="json")

    def convert_layers(self, model: nn.Module, session: PipelineSession) -> dict[int, ExpertAttentionLayer]:
        """Record ``expert-attention`` on the target layers, each bypassed by its original until its epoch."""
        cfg = self.config
        adapter = adapter_for(model)
        order = self.conversion_order(adapter.num_layers)
        session.metrics["layers"] = order
        originals = {i: adapter.layers()[i] for i in order}
        session.step(ExpertAttentionStrategy(
            layers=order, router_input=cfg.router_input, router_grad=cfg.router_grad, top_k=cfg.top_k,
            expander=cfg.expander, expander_init=cfg.expander_init, expander_gain=cfg.expander_gain, seed=cfg.seed))
        return prepare_progressive(model, originals)

    def cut(self, model: nn.Module, session: PipelineSession, eval_loader: Any) -> None:
        """Usage analysis on the evaluation data, then the recorded ``top1-prune`` step, with accuracy around it."""
        # The counts are also persisted in the layers' buffers.
        for _, layer in expert_layers(model):
            layer.usage.zero_()
        metrics = session.metrics
        metrics["accuracy_moe"] = accuracy(model, eval_loader, progress=lambda c, n: session.emit("evaluate", c, n))
        prune = session.step(Top1PruningStrategy(keep=self.config.keep), data=eval_loader)
        metrics["usage"] = prune.metrics.get("usage")
        metrics["coverage"] = prune.metrics.get("coverage")
        metrics["accuracy_pruned"] = accuracy(model, eval_loader)

    def _trainer(self, model: nn.Module, task: TaskData, args: TrainingArguments, callbacks: list[TrainerCallback],
                 state: ShrpTrainingState) -> ShrpTrainer:
        cfg = self.config
        distill = DistillConfig(alpha=cfg.distill_alpha, temperature=cfg.distill_temperature,
                                hidden_weight=cfg.distill_hidden_weight)
        trainer = ShrpTrainer(model=model, args=args, train_dataset=train_columns(task),
                              data_collator=PaddingCollator(task.tokenizer), callbacks=callbacks, shrp_state=state,
                              distill=distill)
        # Progress reaches the caller through surgery's events; the Trainer's printer would also
        # write its raw log dicts to stdout.
        trainer.remove_callback(PrinterCallback)
        return trainer

    def total_epochs(self, num_converted: int) -> int:
        """Epochs of stages 0, 1 and 2 together."""
        return self.config.finetune_epochs + num_converted + self.config.extra_epochs

    def train(self, model: nn.Module, session: PipelineSession, task: TaskData,
              layers: dict[int, ExpertAttentionLayer], order: list[int], eval_loader: Any) -> list[dict[str, Any]]:
        """Stages 0 and 1 (stage 2 too when it has no epochs) on the HF Trainer; returns per-epoch figures.

        The learning rate decays linearly over all three stages; stage 2 is a second Trainer run
        (:meth:`train_stage2`) that continues the same schedule, so stage-2 variants can start from
        one stage-1 model.
        """
        cfg = self.config
        state = ShrpTrainingState()
        epochs = self.total_epochs(len(order))
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
            self._trainer(model, task, training_arguments(cfg, epochs, tmp), callbacks, state).train()
        model.eval()
        session.context.artefacts["teacher"] = state.teacher
        return state.history

    def train_stage2(self, model: nn.Module, session: PipelineSession, task: TaskData,
                     layers: dict[int, ExpertAttentionLayer], eval_loader: Any) -> list[dict[str, Any]]:
        """Stage 2 (``extra_epochs``): no balance loss; concentration pressure and expert dropping if set."""
        cfg = self.config
        if cfg.extra_epochs == 0:
            return []
        state = ShrpTrainingState(teacher=session.context.artefacts.get("teacher"))
        done = self.total_epochs(len(layers)) - cfg.extra_epochs
        callbacks: list[TrainerCallback] = [ProgressiveConversion(
            layers, list(layers), state, delay=cfg.finetune_epochs, first_epoch=done,
            concentration_weight=cfg.concentration_weight,
            eval_loader=eval_loader if cfg.eval_each_epoch else None, emit=session.emit,
            total_epochs=self.total_epochs(len(layers)))]
        dropping = None
        if cfg.expert_dropping == "halve":
            dropping = ProgressiveExpertDropping(layers, end=cfg.dropping_end, keep=cfg.keep)
            callbacks.append(dropping)
        # The rate where the one-run linear schedule would be at the start of stage 2, decaying to 0.
        lr = cfg.learning_rate * cfg.extra_epochs / self.total_epochs(len(layers))
        with tempfile.TemporaryDirectory(prefix="shrp-") as tmp:
            args = training_arguments(cfg, cfg.extra_epochs, tmp, learning_rate=lr, warmup_steps=0)
            self._trainer(model, task, args, callbacks, state).train()
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
        fit(model, task, trainer_arguments(tmp, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                                           seed=seed))
