"""A half-precision model that answers in fp32, so that callers compare every runtime's outputs like with like.

Example:
    >>> import torch
    >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
    >>> spec = TinySpec("bert")
    >>> half = Float32Outputs(tiny_model(spec).to(torch.bfloat16))
    >>> half(**tiny_inputs(spec)).last_hidden_state.dtype, half.config.model_type
    (torch.float32, 'bert')
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Float32Outputs(nn.Module):
    """A half-precision model whose floating outputs come back as fp32 (``torch-bf16``, ``torch-fp16`` serve it)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, **inputs: Any) -> Any:
        out = self.model(**inputs)
        for key, value in out.items():
            if torch.is_tensor(value) and value.is_floating_point():
                out[key] = value.float()
        return out
