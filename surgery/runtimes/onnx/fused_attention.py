"""Fused attention in exported graphs: each layer's attention core as one ``com.microsoft`` ``MultiHeadAttention``.

``torch.onnx.export(dynamo=True)`` decomposes attention into MatMul, Softmax and the Reshape/Transpose
nodes around them, and ONNX Runtime's attention fusion (``fusion_attention.py`` in its transformers
optimizer) only matches the fixed pattern of uniform-head TorchScript graphs, so it never fires on
them, least of all with heads pruned unevenly. This module makes the exporter write the fused
operator directly instead of hoping for a pattern match:

* transformers routes every family that uses its attention interface (``ALL_ATTENTION_FUNCTIONS``)
  through ``config._attn_implementation``; during export only, :func:`fused_attention` registers
  :func:`attention_forward` under :data:`IMPLEMENTATION` and switches the exported copy to it. The
  function receives each layer's ``q, k, v`` after the projections (and after a family's rotary
  embedding), with the layer's own head count in their shape, and hands back the heads' output
  before the output projection, so uneven heads need no bookkeeping at all;
* while ``torch.onnx.export`` traces, :func:`multi_head_attention` emits the contrib operator with
  ``torch.onnx.ops.symbolic`` (the exporter's documented way to write an operator of another
  domain); outside an export it computes the same thing with ``scaled_dot_product_attention``;
* the model's own mask (padding, and ModernBERT's sliding window) enters as the operator's additive
  ``attention_bias`` (``[batch, 1, seq, seq]``), built by transformers' ``eager_mask``.

The q/k/v and output projections stay MatMuls outside the operator, so dynamic int8 still quantizes
them and activation smoothing still wraps them; the operator itself runs in fp32. Layers whose
attention does not go through the interface (MPNet and DeBERTa-v2 compute their position terms
inside their own attention modules; SHRP's routed expert layers call ``scaled_dot_product_attention``
themselves) are exported as before, and :func:`fused_attention` reports which layers those are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field
from torch import nn

#: The name :func:`attention_forward` is registered under in transformers' attention interfaces.
IMPLEMENTATION = "surgery_fused_mha"
#: The ONNX Runtime contrib operator every fused layer becomes.
FUSED_OP = "MultiHeadAttention"
FUSED_DOMAIN = "com.microsoft"


class FusedAttentionInfo(BaseModel):
    """Which layers' attention became one fused operator; recorded in ``surgery-onnx.json``."""

    operator: str = Field(default=f"{FUSED_DOMAIN}.{FUSED_OP}")
    layers: list[int] = Field(description="encoder layers whose attention is one fused operator")
    num_heads: list[int] = Field(description="the num_heads attribute of each fused layer's operator, in order")
    unfused_layers: list[int] = Field(default_factory=list, description="layers exported as MatMul + Softmax")
    reason: str | None = Field(default=None, description="why the unfused layers are not fused")


def multi_head_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
                         num_heads: int, scale: float) -> torch.Tensor:
    """Attention over ``[batch, seq, heads * head_dim]`` projections with an additive ``bias``.

    While ``torch.onnx.export`` traces, this is one ``com.microsoft.MultiHeadAttention`` node with
    ``num_heads`` and ``scale`` attributes; otherwise the same function in PyTorch.

    Example:
        >>> q = torch.randn(2, 5, 8)
        >>> multi_head_attention(q, q, q, None, num_heads=2, scale=0.5).shape
        torch.Size([2, 5, 8])
    """
    batch, seq = query.shape[0], query.shape[1]
    if torch.onnx.is_in_onnx_export():
        inputs = (query, key, value) if bias is None else (query, key, value, None, None, bias)
        return torch.onnx.ops.symbolic(
            f"{FUSED_DOMAIN}::{FUSED_OP}", inputs, {"num_heads": int(num_heads), "scale": float(scale)},
            dtype=query.dtype, shape=(batch, seq, value.shape[2]), version=1)

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(batch, t.shape[1], num_heads, -1).transpose(1, 2)

    out = F.scaled_dot_product_attention(heads(query), heads(key), heads(value), attn_mask=bias, scale=scale)
    return out.transpose(1, 2).reshape(batch, seq, -1)


class _Recorder:
    """The attention modules the interface was called by during one trace, with their head counts."""

    def __init__(self) -> None:
        self.calls: dict[int, int] = {}

    def __call__(self, module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                 **_: Any) -> tuple[torch.Tensor, None]:
        self.calls[id(module)] = int(query.shape[1])
        return attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout)


def attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      **_: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface signature: ``q, k, v`` are ``[batch, heads, seq, head_dim]``.

    Returns ``[batch, seq, heads, head_dim]`` (what the families reshape into the output projection's
    input) and no attention weights. Keyword arguments a family adds (ModernBERT's ``sliding_window``)
    are already in ``attention_mask``, which the registered ``eager_mask`` built.

    Example:
        >>> q = torch.randn(1, 3, 4, 2)
        >>> attention_forward(nn.Identity(), q, q, q, None)[0].shape
        torch.Size([1, 4, 3, 2])
    """
    if dropout and module.training:
        raise ValueError("fused attention is for inference; call model.eval() before exporting")
    batch, heads, seq, head_dim = query.shape
    if key.shape[1] != heads:
        raise ValueError(f"fused attention needs as many key heads as query heads, got {key.shape[1]} and {heads}")

    def flat(t: torch.Tensor) -> torch.Tensor:
        return t.transpose(1, 2).reshape(batch, t.shape[2], heads * t.shape[3])

    bias = None
    if attention_mask is not None:
        bias = attention_mask
        if bias.dtype == torch.bool:  # an sdpa-style mask: True = attend
            bias = torch.zeros(bias.shape, dtype=query.dtype, device=bias.device).masked_fill(
                ~bias, torch.finfo(query.dtype).min)
        # The operator takes [batch or 1, heads or 1, seq, kv_seq]; padding-only masks arrive as [.., 1, kv_seq].
        bias = bias.to(query.dtype).expand(bias.shape[0], bias.shape[1], seq, key.shape[2])
    scale = float(scaling) if scaling is not None else head_dim**-0.5
    out = multi_head_attention(flat(query), flat(key), flat(value), bias, heads, scale)
    return out.view(batch, seq, heads, -1), None


def _register(recorder: _Recorder) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(IMPLEMENTATION, recorder)
    # An implementation without a mask function gets no mask at all; eager_mask is the additive
    # [batch, 1, seq, kv_seq] float mask the operator's attention_bias takes.
    AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)


def _configs(model: nn.Module) -> list[Any]:
    """Every distinct config object the model's modules hold (attention modules keep their own reference)."""
    found: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            found.setdefault(id(config), config)
    return list(found.values())


@contextmanager
def fused_attention(model: nn.Module) -> Iterator[_Recorder]:
    """Route ``model``'s attention through :func:`attention_forward` for the block, then restore it.

    Yields the recorder whose ``calls`` map ``id(attention module)`` to its head count, filled by the
    forward passes (or the export trace) inside the block; :func:`fusion_info` turns it into layers.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert", heads=4)).eval()
        >>> ids = torch.tensor([[2, 7, 9, 0]]); mask = torch.tensor([[1, 1, 1, 0]])
        >>> before = model(input_ids=ids, attention_mask=mask).last_hidden_state
        >>> with fused_attention(model) as recorder:
        ...     after = model(input_ids=ids, attention_mask=mask).last_hidden_state
        >>> sorted(recorder.calls.values()), bool(torch.allclose(before, after, atol=1e-5))
        ([4, 4], True)
    """
    recorder = _Recorder()
    _register(recorder)
    configs = _configs(model)
    saved = [config._attn_implementation for config in configs]
    try:
        for config in configs:
            config._attn_implementation = IMPLEMENTATION
        yield recorder
    finally:
        for config, value in zip(configs, saved, strict=True):
            config._attn_implementation = value


def fusion_info(model: nn.Module, recorder: _Recorder) -> FusedAttentionInfo:
    """Which encoder layers (found by the family's anatomy adapter) called the fused attention, in order.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("mpnet")).eval()
        >>> with fused_attention(model) as recorder:
        ...     _ = model(input_ids=torch.tensor([[0, 5, 2]]))
        >>> fusion_info(model, recorder).unfused_layers
        [0, 1]
    """
    from surgery.anatomy import adapter_for

    fused, heads, unfused = [], [], []
    for index, layer in enumerate(adapter_for(model).layers()):
        counts = [recorder.calls[id(m)] for m in layer.modules() if id(m) in recorder.calls]
        if counts:
            fused.append(index)
            heads.append(counts[0])
        else:
            unfused.append(index)
    reason = None
    if unfused:
        reason = ("their attention does not go through transformers' attention interface (a family that computes "
                  "position terms inside its own attention module, such as MPNet or DeBERTa-v2, or a routed "
                  "expert layer)")
    return FusedAttentionInfo(layers=fused, num_heads=heads, unfused_layers=unfused, reason=reason)
