"""The one accuracy measure every strategy, guard and benchmark uses."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from surgery.scoring.importance import batches_on, model_device

Prepare = Callable[[Mapping[str, torch.Tensor]], dict[str, torch.Tensor]]
ClassLogits = Callable[[Any, Mapping[str, torch.Tensor]], torch.Tensor]


@torch.no_grad()
def example_correct(model: nn.Module, loader: Iterable[Mapping[str, Any]], *,
                    progress: Callable[[int, int | None], None] | None = None,
                    prepare: Prepare | None = None, class_logits: ClassLogits | None = None) -> torch.Tensor:
    """Whether ``model`` labels each example of ``loader`` right: a bool tensor, one entry per example in order.

    The per-example form of :func:`accuracy` (same arguments): a paired comparison of two models on
    the same examples, or a bootstrap over them, needs the examples, not only their mean.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model, tiny_task_data
        >>> loader = tiny_task_data(4).loader()
        >>> example_correct(tiny_model(TinySpec("bert", task="seq-cls")), loader).shape
        torch.Size([4])
    """
    was_training = model.training
    model.eval()
    found: list[torch.Tensor] = []
    n_batches = len(loader) if hasattr(loader, "__len__") else None
    try:
        for n, batch in enumerate(batches_on(loader, model_device(model))):
            if prepare is not None:
                batch = prepare(batch)
            outputs = model(**{k: v for k, v in batch.items() if k != "labels"})
            logits = class_logits(outputs, batch) if class_logits is not None else outputs.logits
            found.append((logits.argmax(-1) == batch["labels"]).flatten().cpu())
            if progress is not None:
                progress(n + 1, n_batches)
    finally:
        model.train(was_training)
    return torch.cat(found) if found else torch.zeros(0, dtype=torch.bool)


def accuracy(model: nn.Module, loader: Iterable[Mapping[str, Any]], *,
             progress: Callable[[int, int | None], None] | None = None,
             prepare: Prepare | None = None, class_logits: ClassLogits | None = None) -> float:
    """Accuracy (a fraction in [0, 1]) of a classifier over a loader of labelled batches.

    ``prepare`` rewrites each batch before the forward pass (a prompt template) and
    ``class_logits`` picks the ``[B, classes]`` logits from the outputs (a verbalizer); by default
    the batch goes in as it is and ``outputs.logits`` is used. NaN for an empty loader.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model, tiny_task_data
        >>> loader = tiny_task_data(4).loader()
        >>> 0.0 <= accuracy(tiny_model(TinySpec("bert", task="seq-cls")), loader) <= 1.0
        True
    """
    correct = example_correct(model, loader, progress=progress, prepare=prepare, class_logits=class_logits)
    return float(correct.float().mean()) if correct.numel() else float("nan")
