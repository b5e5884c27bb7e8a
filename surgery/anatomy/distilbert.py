"""Anatomy of DistilBERT: BERT's post-LN layer with its own module names.

DistilBERT keeps q/k/v/o side by side in one attention module (``q_lin`` ... ``out_lin``), counts
heads in ``n_heads`` and reshapes with ``-1`` heads in its forward, so removing a head needs only
the generic slicing plus the ``n_heads`` bookkeeping.
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from surgery.anatomy.base import AttentionParts, EncoderAdapter, FFNParts


class DistilBertAdapter(EncoderAdapter):
    """DistilBERT (post-LN, separate q/k/v, GELU FFN; layers at ``transformer.layer``).

    Example:
        >>> from transformers import DistilBertConfig, DistilBertForSequenceClassification
        >>> from surgery.anatomy import adapter_for
        >>> cfg = DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37)
        >>> adapter = adapter_for(DistilBertForSequenceClassification(cfg))
        >>> adapter.layer(1).attention.num_heads, adapter.layer(1).ffn.width
        (4, 37)
    """

    model_types = ("distilbert",)
    layers_path = "transformer.layer"
    head_count_attrs: ClassVar[tuple[str, ...]] = ("n_heads",)
    all_head_size_attrs: ClassVar[tuple[str, ...]] = ()
    ffn_width_config: ClassVar[str] = "hidden_dim"

    def attention_parts(self, layer: nn.Module) -> AttentionParts | None:
        core = getattr(layer, "attention", None)
        if core is None or not hasattr(core, "q_lin"):
            return None
        return AttentionParts(
            module=core,
            query=core.q_lin,
            key=core.k_lin,
            value=core.v_lin,
            output=core.out_lin,
            num_heads=self.num_heads_of(core),
            head_dim=core.attention_head_size,
        )

    def ffn_parts(self, layer: nn.Module) -> FFNParts | None:
        ffn = getattr(layer, "ffn", None)
        if ffn is None or not hasattr(ffn, "lin1"):
            return None
        return FFNParts(up=ffn.lin1, down=ffn.lin2, act=ffn.activation)

    def norms(self, layer: nn.Module) -> dict[str, nn.Module]:
        found: dict[str, nn.Module] = {}
        if hasattr(layer, "sa_layer_norm"):
            found["attention"] = layer.sa_layer_norm
        if hasattr(layer, "output_layer_norm"):
            found["ffn"] = layer.output_layer_norm
        return found
