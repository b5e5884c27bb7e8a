"""Anatomy of DeBERTa-v2/v3: disentangled attention with relative-position projections.

With ``share_att_key=True`` (every released v3 checkpoint) the relative embeddings are projected
by the layer's own ``query_proj``/``key_proj``, so slicing a head's query and key rows also cuts
its slice of the position projections. With ``share_att_key=False`` the separate
``pos_key_proj``/``pos_query_proj`` are split per head exactly like the query, and are listed as
``per_head_rows``. The forward pass reshapes by ``num_attention_heads`` and scales by the head
size (``query_layer.size(-1)``), so only ``num_attention_heads``/``all_head_size`` need updating.
"""

from __future__ import annotations

from torch import nn

from surgery.anatomy.base import AttentionParts
from surgery.anatomy.bert import BertAdapter


class DebertaV2Adapter(BertAdapter):
    """DeBERTa-v2 and v3 (post-LN, BERT layer layout, disentangled relative attention).

    Example:
        >>> from transformers import DebertaV2Config, DebertaV2Model
        >>> from surgery.anatomy import adapter_for
        >>> cfg = DebertaV2Config(vocab_size=99, hidden_size=32, num_hidden_layers=2,
        ...                       num_attention_heads=4, intermediate_size=37, relative_attention=True,
        ...                       pos_att_type=["p2c", "c2p"], share_att_key=False)
        >>> parts = adapter_for(DebertaV2Model(cfg)).layer(0).attention
        >>> [type(p).__name__ for p in parts.per_head_rows], parts.head_dim
        (['Linear', 'Linear'], 8)
    """

    model_types = ("deberta-v2",)
    layers_path = "encoder.layer"

    def attention_parts(self, layer: nn.Module) -> AttentionParts | None:
        attention = getattr(layer, "attention", None)
        core = getattr(attention, "self", None)
        if core is None or not hasattr(core, "query_proj"):
            return None
        # Present only when relative attention does not share the content projections.
        per_head = tuple(getattr(core, name) for name in ("pos_key_proj", "pos_query_proj") if hasattr(core, name))
        return AttentionParts(
            module=core,
            query=core.query_proj,
            key=core.key_proj,
            value=core.value_proj,
            output=attention.output.dense,
            num_heads=self.num_heads_of(core),
            head_dim=core.attention_head_size,
            per_head_rows=per_head,
        )
