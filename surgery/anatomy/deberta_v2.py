"""Anatomy of DeBERTa-v2/v3: disentangled attention with relative-position projections.

With ``share_att_key=True`` (every released v3 checkpoint) the relative embeddings are projected
by the layer's own ``query_proj``/``key_proj``, so slicing a head's query and key rows also cuts
its slice of the position projections. With ``share_att_key=False`` the separate
``pos_key_proj``/``pos_query_proj`` are split per head exactly like the query, and are listed as
``per_head_rows``. The forward pass reshapes by ``num_attention_heads`` and scales by the head
size (``query_layer.size(-1)``), so only ``num_attention_heads``/``all_head_size`` need updating.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from surgery.anatomy.base import AttentionParts, LayerCall
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

    # -- whole-layer replacement (Expert Attention) ------------------------------------------
    # DeBERTa's score is (q·k + c2p + p2c) / sqrt(head_dim * factor). With shared position
    # projections (share_att_key, as DeBERTa-v3 ships) c2p/p2c use the head's own query/key
    # projections of the relative embeddings, so an expert reproduces them exactly from its own
    # Q/K weights. Separate position projections (share_att_key=False) are not reproduced.
    def _scale_factor(self) -> int:
        types = getattr(self.config, "pos_att_type", None) or []
        return 1 + int("c2p" in types) + int("p2c" in types) if getattr(self.config, "relative_attention", False) else 1

    def attention_scale(self, layer: nn.Module, head_dim: int) -> float:
        return (head_dim * self._scale_factor()) ** -0.5

    def parse_layer_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> LayerCall:
        call = super().parse_layer_call(args, kwargs)
        rel = kwargs.get("rel_embeddings")
        if getattr(self.config, "relative_attention", False) and rel is not None:
            if not getattr(self.config, "share_att_key", False):
                from surgery.errors import PlanError

                raise PlanError("expert attention on DeBERTa-v2 needs share_att_key=True (shared position "
                                "projections); this model has separate ones")
            relative_pos = kwargs.get("relative_pos")
            hidden = call.hidden
            if relative_pos is None:
                from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

                relative_pos = build_relative_position(hidden, hidden, bucket_size=self.config.position_buckets,
                                                       max_position=self._max_relative())
            span = self.config.position_buckets if self.config.position_buckets > 0 else self._max_relative()
            call.extra["head_scores"] = partial(
                _deberta_expert_scores, rel=rel[: 2 * span], relative_pos=relative_pos, span=span,
                types=tuple(self.config.pos_att_type or ()), scale=1.0)
        return call

    def _max_relative(self) -> int:
        value = getattr(self.config, "max_relative_positions", -1)
        return value if value and value > 0 else self.config.max_position_embeddings

    def layer_result(self, hidden: torch.Tensor, call: LayerCall) -> Any:
        return (hidden, None)


def _deberta_expert_scores(q: torch.Tensor, k: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, *,
                           rel: torch.Tensor, relative_pos: torch.Tensor, span: int, types: tuple[str, ...],
                           scale: float) -> torch.Tensor:
    """c2p + p2c of one expert per sequence, as ``[B, 1, S, S]``, scaled like the content score.

    ``q``/``k`` are ``[B, 1, S, dh]``; ``weight``/``bias`` the experts' stacked Q/K/V rows.
    """
    dh = q.shape[-1]
    factor = 1 + int("c2p" in types) + int("p2c" in types)
    inv = (dh * factor) ** -0.5 * scale
    rp = relative_pos.to(device=q.device, dtype=torch.long)
    while rp.dim() > 2:
        rp = rp[0]
    b, s = q.shape[0], q.shape[2]
    score = q.new_zeros(b, s, s)
    if "c2p" in types:
        pos_key = torch.einsum("rd,bhd->brh", rel, weight[:, dh:2 * dh]) + bias[:, None, dh:2 * dh]
        c2p = torch.bmm(q[:, 0], pos_key.transpose(1, 2))
        idx = torch.clamp(rp + span, 0, 2 * span - 1).expand(b, s, s)
        score = score + torch.gather(c2p, -1, idx) * inv
    if "p2c" in types:
        pos_query = torch.einsum("rd,bhd->brh", rel, weight[:, :dh]) + bias[:, None, :dh]
        p2c = torch.bmm(k[:, 0], pos_query.transpose(1, 2))
        idx = torch.clamp(-rp + span, 0, 2 * span - 1).expand(b, s, s)
        score = score + torch.gather(p2c, -1, idx).transpose(-1, -2) * inv
    return score[:, None]
