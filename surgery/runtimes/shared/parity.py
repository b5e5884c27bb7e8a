"""The reference every runtime's artefact is checked against: fp32 PyTorch on one padded batch.

Example:
    >>> from surgery.testing import TinySpec, tiny_model
    >>> ref = reference_batch(tiny_model(TinySpec("bert", task="seq-cls")))
    >>> ref.output, ref.task, tuple(ref.expected.shape)
    ('logits', 'seq-cls', (4, 3))
    >>> agreement_of(ref.expected, ref.expected, ref.inputs["attention_mask"])
    {'max_abs_diff': 0.0, 'mean_cosine': 1.0, 'min_cosine': 1.0}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from surgery.runtimes.shared.graph_export import SingleOutput, agreement, export_target, input_names, parity_inputs
from surgery.runtimes.shared.runtime import fp32_copy


@dataclass
class Reference:
    """The fp32 module to convert (task head resolved), its output name, inputs and expected output."""

    module: nn.Module
    wrapper: nn.Module
    output: str
    task: str
    names: list[str]
    inputs: dict[str, torch.Tensor]
    expected: torch.Tensor


def reference_batch(model: nn.Module, task: str = "auto", *, batch: int = 4, seq: int = 32,
                    tokenizer: Any = None) -> Reference:
    """An fp32 copy of ``model``'s ``task`` target, a right-padded ``batch x seq`` batch and its fp32 output."""
    target, output, task = export_target(model, task)
    module = fp32_copy(target)
    names = input_names(module)
    wrapper = SingleOutput(module, output, names).eval()
    inputs = parity_inputs(module.config, names, batch=batch, seq=seq, tokenizer=tokenizer)
    with torch.no_grad():
        expected = wrapper(**inputs).detach().float()
    return Reference(module, wrapper, output, task, names, inputs, expected)


def agreement_of(expected: torch.Tensor, got: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    """``max_abs_diff``, ``mean_cosine`` and ``min_cosine`` (per example) of ``got`` against ``expected``.

    Per-token outputs (``[batch, seq, ...]``) are compared on real tokens only (``mask``), as
    :func:`surgery.runtimes.shared.graph_export.agreement` does: padded positions are read by nothing downstream.
    """
    found = agreement(expected, got, mask)
    return {"max_abs_diff": found.max_abs_diff, "mean_cosine": float(found.mean_cosine or 0.0),
            "min_cosine": found.min_cosine}
