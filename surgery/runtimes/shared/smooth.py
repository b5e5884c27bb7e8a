"""Activation smoothing before dynamic int8 (SmoothQuant): move activation outliers into the weights.

ONNX Runtime's dynamic quantization gives every weight product's input one int8 scale per tensor,
computed at run time from the largest value in the batch. Encoders of the BERT family carry a few
hidden channels whose activations are far larger than the rest (on all-MiniLM-L6-v2 the largest
input channel of an FFN-up projection peaks at 9 to 15 times the median channel, channel 99 among the
largest before every attention and FFN-up projection), so those channels set the scale and the
others keep only a few bits. Simulated one source at a time on MiniLM, int8 weights alone keep mean
cosine 0.9995 to the fp32 embeddings and int8 activations alone 0.9925
(experiments/int8/probe_int8_error_sources.py, experiments/int8/results/int8_error_sources.json).

SmoothQuant (Xiao et al., 2023, "SmoothQuant: Accurate and Efficient Post-Training Quantization for
Large Language Models", section 4) divides each input channel ``j`` by
``s_j = max|X_j| ** alpha / max|W_:,j| ** (1 - alpha)`` and multiplies the weight's column ``j`` by
``s_j``: ``(X / s) (s W)`` is the same product in exact arithmetic, but the activations are flatter
and the weights, quantized per output channel, absorb the difference. In a post-LayerNorm encoder
the LayerNorm that could absorb ``1 / s`` also feeds the residual branch, so the division stays an
explicit elementwise ``Mul`` in front of each product input (2.39x against 2.45x over PyTorch fp32
for plain int8 on MiniLM, one thread; experiments/int8/results/int8_smoothing.md).

:func:`smooth_linears` measures ``max|X_j|`` on calibration batches and wraps each attention and
FFN projection in a :class:`SmoothedLinear`, in place; :func:`surgery.runtimes.onnx.export_onnx` applies it
to its own copy of the model when given ``calibration`` batches with ``int8``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import torch
from pydantic import BaseModel, Field
from torch import nn

from surgery.core.errors import ConfigError
from surgery.runtimes.shared.names import CALIBRATION_TEXTS, SMOOTH_ALPHA

#: SmoothQuant's migration strength (defined torch-free in :mod:`surgery.runtimes.shared.names` for the CLI).
DEFAULT_ALPHA = SMOOTH_ALPHA


class SmoothingInfo(BaseModel):
    """How the activations were smoothed before int8; recorded in ``surgery-onnx.json``."""

    alpha: float = Field(description="migration strength: 0 leaves activations as they are, 1 flattens them fully")
    modules: int = Field(description="weight products whose input was smoothed")
    calibration_batches: int
    calibration_tokens: int = Field(description="non-padding tokens the activation ranges were measured on")
    outlier_ratio: float = Field(description="largest over products of max|X| / median channel max|X| before "
                                             "smoothing: how uneven the activations were")


class SmoothedLinear(nn.Module):
    """``linear(x / scale)`` with ``linear``'s input columns multiplied by ``scale``: the same function.

    Example:
        >>> layer = nn.Linear(4, 3)
        >>> smoothed = SmoothedLinear(layer, torch.tensor([1.0, 2.0, 4.0, 0.5]))
        >>> x = torch.randn(2, 4)
        >>> torch.allclose(smoothed(x), layer(x), atol=1e-6)
        True
    """

    def __init__(self, linear: nn.Linear, scale: torch.Tensor) -> None:
        super().__init__()
        if scale.shape != (linear.in_features,) or not bool((scale > 0).all()):
            raise ConfigError(f"smoothing scale must be {linear.in_features} positive values, got shape "
                              f"{tuple(scale.shape)}")
        self.linear = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None,
                                device=linear.weight.device, dtype=linear.weight.dtype)
        with torch.no_grad():
            self.linear.weight.copy_(linear.weight * scale.to(linear.weight))
            if linear.bias is not None:
                self.linear.bias.copy_(linear.bias)
        self.register_buffer("inv_scale", (1.0 / scale).to(linear.weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x * self.inv_scale)


def smoothing_scale(activation_max: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's per-input-channel scale; 1 where a channel never fires or has no weight.

    Example:
        >>> smoothing_scale(torch.tensor([8.0, 2.0, 0.0]), torch.ones(3, 3), alpha=0.5)
        tensor([2.8284, 1.4142, 1.0000])
    """
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"smoothing alpha must be between 0 and 1, got {alpha}")
    weight_max = weight.detach().abs().amax(dim=0).float()
    act = activation_max.float()
    scale = act.pow(alpha) / weight_max.pow(1.0 - alpha)
    usable = (act > 0) & (weight_max > 0) & torch.isfinite(scale) & (scale > 0)
    return torch.where(usable, scale, torch.ones_like(scale))


def activation_ranges(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]],
                      modules: Mapping[str, nn.Linear]) -> tuple[dict[str, torch.Tensor], int, int]:
    """Per input channel, the largest ``|x|`` each of ``modules`` sees on ``batches``; and the batch
    and non-padding token counts. ``model`` runs in eval mode without gradients."""
    ranges: dict[str, torch.Tensor] = {}

    def record(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...], torch.Tensor], None]:
        def hook(_module: nn.Module, inputs: tuple[torch.Tensor, ...], _output: torch.Tensor) -> None:
            x = inputs[0].detach()
            peak = x.reshape(-1, x.shape[-1]).abs().amax(dim=0).float()
            ranges[name] = torch.maximum(ranges[name], peak) if name in ranges else peak
        return hook

    hooks = [module.register_forward_hook(record(name)) for name, module in modules.items()]
    was_training = model.training
    model.eval()
    count = tokens = 0
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for batch in batches:
                inputs = {k: v.to(device) for k, v in batch.items() if k != "labels"}
                model(**inputs)
                count += 1
                mask = inputs.get("attention_mask")
                tokens += int(mask.sum()) if mask is not None else int(inputs["input_ids"].numel())
    finally:
        for handle in hooks:
            handle.remove()
        model.train(was_training)
    return ranges, count, tokens


def smooth_linears(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], *,
                   alpha: float = DEFAULT_ALPHA, skip: Collection[str] = ()) -> SmoothingInfo:
    """Smooth the inputs of every attention and FFN projection of ``model`` in place (see the module doc).

    Every supported family and every surgered structure (uneven heads, pruned FFNs) is covered
    (:func:`surgery.runtimes.shared.weight_products.product_groups`). Products that read the same input (q, k and v)
    share one scale, so ONNX Runtime still quantizes that input once. Modules named in ``skip``
    (qualified names, e.g. products kept in fp32) are left alone. The model computes the same
    function afterwards, up to float rounding.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert", layers=1)).eval()
        >>> batch = {"input_ids": torch.randint(5, 90, (2, 7))}
        >>> before = model(**batch).last_hidden_state
        >>> info = smooth_linears(model, [batch], alpha=0.85)
        >>> info.modules, torch.allclose(model(**batch).last_hidden_state, before, atol=1e-5)
        (6, True)
    """
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"smoothing alpha must be between 0 and 1, got {alpha}")
    from surgery.runtimes.shared.weight_products import product_groups

    groups = [[n for n in group.names if n not in skip] for group in product_groups(model)]
    # A product with no weights (an FFN pruned to width 0 has empty up and down projections) has no
    # channel to scale and nothing int8 could gain; its zero-sized input would also defeat the ranges.
    groups = [group for group in groups if group and all(model.get_submodule(n).weight.numel() for n in group)]
    modules = {name: model.get_submodule(name) for group in groups for name in group}
    ranges, count, tokens = activation_ranges(model, batches, modules)
    if count == 0:
        raise ConfigError("smoothing needs at least one calibration batch; got none")
    ratio = 0.0
    for group in groups:
        peak = torch.stack([ranges[name] for name in group]).amax(dim=0)
        ratio = max(ratio, float(peak.max() / peak.median().clamp(min=1e-12)))
        weight = torch.cat([modules[name].weight for name in group])  # rows of all members, same columns
        scale = smoothing_scale(peak, weight, alpha)
        for name in group:
            parent, _, child = name.rpartition(".")
            holder = model.get_submodule(parent) if parent else model
            setattr(holder, child, SmoothedLinear(modules[name], scale))
    return SmoothingInfo(alpha=alpha, modules=len(modules), calibration_batches=count, calibration_tokens=tokens,
                         outlier_ratio=ratio)


def text_calibration_batches(texts: Sequence[str], tokenizer: Any, *, max_texts: int = CALIBRATION_TEXTS,
                        max_length: int = 128, batch_size: int = 32, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Up to ``max_texts`` of ``texts`` (a seeded sample), tokenized into padded batches for :func:`smooth_linears`.

    Example:
        >>> from transformers import BertTokenizer
        >>> tok = BertTokenizer(vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"])})
        >>> [b["input_ids"].shape[0] for b in text_calibration_batches(["a"] * 70, tok, max_texts=40, batch_size=32)]
        [32, 8]
    """
    if max_texts < 1:
        raise ConfigError(f"calibration needs at least 1 text, got max_texts={max_texts}")
    chosen = list(texts)
    random.Random(seed).shuffle(chosen)
    chosen = chosen[:max_texts]
    if not chosen:
        raise ConfigError("calibration needs at least one text; the calibration data has none")
    return [dict(tokenizer(chosen[i:i + batch_size], padding=True, truncation=True, max_length=max_length,
                           return_tensors="pt")) for i in range(0, len(chosen), batch_size)]
