"""FLOPs of one forward pass: matrix multiplications under torch's ``FlopCounterMode`` (2 per multiply-add).

Torch has no formula for the CPU flash-attention kernel that SDPA picks, so one is added here (the same
formula torch uses for the CUDA kernels). Element-wise work (softmax, GELU, LayerNorm) is not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count


def _cpu_sdpa_flop(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, out_shape: Any = None,
                   **kwargs: Any) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _extra_flop_formulas() -> dict[Any, Any]:
    # SDPA on CPU dispatches to a kernel torch's counter has no formula for; without this the
    # attention matmuls (which head pruning shrinks) would silently count as zero.
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    return {op: _cpu_sdpa_flop} if op is not None else {}


def count_flops(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> int:
    """FLOPs of one forward pass of ``model`` on ``inputs`` (matrix multiplications, 2 per multiply-add).

    Example:
        >>> from surgery.testing import TinySpec, tiny_model, tiny_inputs
        >>> spec = TinySpec("deberta-v2")
        >>> count_flops(tiny_model(spec), tiny_inputs(spec)) > 0
        True
    """
    counter = FlopCounterMode(display=False, custom_mapping=_extra_flop_formulas())
    # The counter's module tracker hooks the autograd graph of every module input that requires grad;
    # DeBERTa-v2 passes a parameter (its relative embeddings) as an input, which has no graph under
    # inference mode and crashed the count. Nothing is differentiated here, so grads are off meanwhile.
    frozen = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in frozen:
            p.requires_grad_(False)
        with torch.inference_mode(), counter:
            model(**inputs)
    finally:
        for p in frozen:
            p.requires_grad_(True)
    return int(counter.get_total_flops())
