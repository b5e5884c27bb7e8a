"""Anatomy of ModernBERT: pre-LN, fused ``Wqkv``, rotary positions and a GeGLU FFN.

``attn.Wqkv`` has rows ``[q heads | k heads | v heads]`` (the forward views its output as
``(3, heads, head_dim)`` with ``-1`` heads, so no head count is stored anywhere). ``mlp.Wi`` holds
both GeGLU halves, ``[input | gate]``: neuron ``j`` owns rows ``j`` and ``j + width``. Rotary
embeddings act within a head (``head_dim`` is unchanged by head removal), so nothing else moves.
Layer 0 has no attention norm (``attn_norm`` is ``nn.Identity``); it is still reported.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch import nn

from surgery.anatomy.base import AttentionParts, EncoderAdapter, FFNParts
from surgery.anatomy.calling import CallingConvention, LayerCall, parse_call


class ModernBertAdapter(EncoderAdapter):
    """ModernBERT (pre-LN, fused qkv, GeGLU; layers at ``layers``; biases off by default).

    Example:
        >>> from surgery.anatomy import adapter_for
        >>> from surgery.testing import TinySpec, tiny_model
        >>> layer = adapter_for(tiny_model(TinySpec("modernbert", heads=4, ffn=37))).layer(1)
        >>> layer.attention.num_heads, layer.ffn.width, layer.ffn.gated
        (4, 37, True)
    """

    model_types = ("modernbert",)
    layers_path = "layers"

    def attention_parts(self, layer: nn.Module) -> AttentionParts | None:
        core = getattr(layer, "attn", None)
        if core is None or not hasattr(core, "Wqkv"):
            return None
        return AttentionParts(
            module=core,
            qkv=core.Wqkv,
            output=core.Wo,
            num_heads=self.num_heads_of(core),
            head_dim=core.head_dim,
        )

    def ffn_parts(self, layer: nn.Module) -> FFNParts | None:
        mlp = getattr(layer, "mlp", None)
        if mlp is None or not hasattr(mlp, "Wi"):
            return None
        return FFNParts(up=mlp.Wi, down=mlp.Wo, act=mlp.act, gated=True)

    def norms(self, layer: nn.Module) -> dict[str, nn.Module]:
        return {role: getattr(layer, name) for role, name in (("attention", "attn_norm"), ("ffn", "mlp_norm"))
                if hasattr(layer, name)}

    def num_heads_of(self, module: nn.Module) -> int:
        # The module keeps no head count; the fused projection's rows are 3 * heads * head_dim.
        return module.Wqkv.out_features // (3 * module.head_dim)

    # -- whole-layer replacement -------------------------------------------------------------
    # ModernBERT is pre-LN: a replacement norms its input with the layer's attn_norm and adds its
    # output to the residual stream (no closing norm). Rotary embeddings are applied to each
    # replacement head's q/k exactly as to every head; local layers keep their sliding-window mask,
    # which the encoder selects by the layer's ``attention_type``.
    def calling_convention(self, layer: nn.Module) -> CallingConvention:
        norm = getattr(layer, "attn_norm", None)
        return replace(
            super().calling_convention(layer), parse=parse_modernbert_call, output_norm=None,
            input_norm=None if isinstance(norm, nn.Identity) else norm,  # layer 0 norms nothing
            attributes={"attention_type": layer.attention_type} if hasattr(layer, "attention_type") else {},
            dropout=float(getattr(self.config, "mlp_dropout", 0.0) or 0.0))


def parse_modernbert_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> LayerCall:
    """A ModernBERT layer call ``layer(hidden_states, attention_mask, position_embeddings, ...)``.

    The rotary ``(cos, sin)`` pair becomes the call's ``rotary`` map on per-head ``q, k``.

    Example:
        >>> import torch
        >>> parse_modernbert_call((torch.zeros(1, 2, 4), None), {}).rotary is None
        True
    """
    call = parse_call(args, kwargs)
    position = args[2] if len(args) > 2 else kwargs.get("position_embeddings")
    if position is not None:
        from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb

        cos, sin = position
        call.rotary = lambda q, k: apply_rotary_pos_emb(q, k, cos, sin)
    return call
