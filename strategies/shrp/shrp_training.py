"""SHRP's training on the Hugging Face Trainer: the trainer, the schedule callbacks, the run arguments.

:class:`ShrpTrainer` adds the load-balance (and concentration) loss to surgery's trainer;
:class:`ProgressiveConversion` runs the layer-by-layer schedule; :class:`ProgressiveExpertDropping`
halves the allowed experts during stage 2; :class:`TeacherSnapshot` takes distillation's teacher.
All of them work from a user's own Trainer code too.
"""


from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import TrainerCallback, TrainingArguments

from surgery.core.errors import ConfigError
from surgery.strategies.shrp.config import ShrpConfig
from surgery.strategies.shrp.expert_attention import (
    ExpertAttentionLayer,
    balance_loss,
    concentration_loss,
    expert_layers,
)
from surgery.training import (
    EpochStats,
    SurgeryTrainer,
    accuracy,
    training_arguments,
)


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


def shrp_training_arguments(config: ShrpConfig, epochs: int, output_dir: str, **overrides: Any) -> TrainingArguments:
    """The Trainer settings of an SHRP run (no checkpoints; unused parameters found on purpose)."""
    settings: dict[str, Any] = {
        "epochs": epochs, "batch_size": config.batch_size, "learning_rate": config.learning_rate,
        "weight_decay": config.weight_decay, "warmup_ratio": config.warmup_ratio, "seed": config.seed,
        # Bypassed layers' experts and activated layers' originals get no gradient in a step.
        "ddp_find_unused_parameters": True, **overrides,
    }
    return training_arguments(output_dir, **settings)


