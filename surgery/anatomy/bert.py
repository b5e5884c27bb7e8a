"""Anatomy of the BERT layout, shared by BERT, RoBERTa, XLM-RoBERTa and ELECTRA.

The four families build their layers from identical module trees (``attention.self.query`` ...
``output.LayerNorm``), so one adapter serves all of them.
"""

from __future__ import annotations

from torch import nn

from surgery.anatomy.base import AttentionParts, EncoderAdapter, FFNParts


class BertAdapter(EncoderAdapter):
    """BERT, RoBERTa, XLM-RoBERTa and ELECTRA (post-LN, separate q/k/v, GELU FFN).

    Example:
        >>> from transformers import RobertaConfig, RobertaForSequenceClassification
        >>> from surgery.anatomy import adapter_for
        >>> cfg = RobertaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
        ...                     num_attention_heads=4, intermediate_size=37)
        >>> adapter_for(RobertaForSequenceClassification(cfg)).num_layers
        2
    """

    model_types = ("bert", "roberta", "xlm-roberta", "electra")
    layers_path = "encoder.layer"

    def attention_parts(self, layer: nn.Module) -> AttentionParts | None:
        attention = getattr(layer, "attention", None)
        core = getattr(attention, "self", None)
        if core is None or not hasattr(core, "query"):
            return None
        return AttentionParts(
            module=core,
            query=core.query,
            key=core.key,
            value=core.value,
            output=attention.output.dense,
            num_heads=self.num_heads_of(core),
            head_dim=core.attention_head_size,
        )

    def ffn_parts(self, layer: nn.Module) -> FFNParts | None:
        if not hasattr(layer, "intermediate"):
            return None
        return FFNParts(
            up=layer.intermediate.dense,
            down=layer.output.dense,
            act=layer.intermediate.intermediate_act_fn,
        )

    def norms(self, layer: nn.Module) -> dict[str, nn.Module]:
        found: dict[str, nn.Module] = {}
        if hasattr(layer, "attention"):
            found["attention"] = layer.attention.output.LayerNorm
        if hasattr(layer, "output"):
            found["ffn"] = layer.output.LayerNorm
        return found
