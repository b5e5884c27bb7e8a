"""One training stack for every strategy that trains: the HF Trainer with distillation, one accuracy, one collator.

* :class:`SurgeryTrainer` (a ``transformers.Trainer``): task CE on class logits, plus logit KL at a
  temperature (×T²) and optional mapped hidden-state MSE against a frozen teacher.
* :func:`recover`: distil the model before surgery into the model after it, in place.
* :func:`accuracy`: the accuracy every strategy, guard and benchmark reports.
* :class:`PaddingCollator`: the batch collator (tokenizer padding, or zeros without a tokenizer).
"""

from __future__ import annotations

from surgery.data.task_data import PaddingCollator
from surgery.training.distill import (
    DistillConfig,
    default_layer_map,
    distillation_loss,
    hidden_state_loss,
    recording_layer_outputs,
)
from surgery.training.recover import RecoveryConfig, RecoveryResult, recover, require_labelled
from surgery.training.task_accuracy import accuracy
from surgery.training.trainer import (
    EpochHistory,
    EpochStats,
    SurgeryTrainer,
    device_of,
    fit,
    scratch_dir,
    train_columns,
    training_arguments,
)

__all__ = [
    "DistillConfig",
    "EpochHistory",
    "EpochStats",
    "PaddingCollator",
    "RecoveryConfig",
    "RecoveryResult",
    "SurgeryTrainer",
    "accuracy",
    "default_layer_map",
    "device_of",
    "distillation_loss",
    "fit",
    "hidden_state_loss",
    "recording_layer_outputs",
    "recover",
    "require_labelled",
    "scratch_dir",
    "train_columns",
    "training_arguments",
]
