"""Anatomy of DeBERTa-v2/v3: disentangled attention with relative-position projections.

With ``share_att_key=True`` (every released v3 checkpoint) the relative embeddings are projected
by the layer's own ``query_proj``/``key_proj``, so slicing a head's query and key rows also cuts
its slice of the position projections. With ``share_att_key=False`` the separate
``pos_key_proj``/``pos_query_proj`` are split per head exactly like the query, and are listed as
``per_head_rows``. The forward pass reshapes by ``num_attention_heads`` and scales by the head
size (``query_layer.size(-1)``), so only ``num_attention_heads``/``all_head_size`` need updating.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

import torch
from torch import nn

from surgery.anatomy.base import AttentionParts
from surgery.anatomy.bert import BertAdapter
from surgery.anatomy.calling import CallingConvention, LayerCall, Projection, parse_call
from surgery.core.errors import PlanError


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

    # -- whole-layer replacement -------------------------------------------------------------
    # DeBERTa's score is (q·k + c2p + p2c) / sqrt(head_dim * factor). With shared position
    # projections (share_att_key, as DeBERTa-v3 ships) c2p/p2c use the head's own query/key
    # projections of the relative embeddings, so a replacement head reproduces them exactly from
    # its own projections. Separate position projections (share_att_key=False) are not reproduced.
    def calling_convention(self, layer: nn.Module) -> CallingConvention:
        attention = self.attention_parts(layer)
        head_dim = attention.head_dim if attention is not None else self.head_dim()
        cfg = self.config
        types = tuple(getattr(cfg, "pos_att_type", None) or ())
        relative = bool(getattr(cfg, "relative_attention", False))
        max_relative = getattr(cfg, "max_relative_positions", -1)
        max_relative = max_relative if max_relative and max_relative > 0 else cfg.max_position_embeddings
        parse = partial(parse_deberta_call, relative=relative, shared=bool(getattr(cfg, "share_att_key", False)),
                        buckets=getattr(cfg, "position_buckets", -1), max_relative=max_relative,
                        types=types)
        return replace(super().calling_convention(layer), parse=parse, result=hidden_and_no_attention,
                       scale=(head_dim * score_factor(types, relative)) ** -0.5)


def score_factor(types: tuple[str, ...], relative: bool = True) -> int:
    """How many score terms DeBERTa sums (content, c2p, p2c): the scores are divided by ``sqrt(head_dim * it)``.

    Example:
        >>> score_factor(("p2c", "c2p")), score_factor(("c2p",), relative=False)
        (3, 1)
    """
    return 1 + int("c2p" in types) + int("p2c" in types) if relative else 1


def parse_deberta_call(args: tuple[Any, ...], kwargs: dict[str, Any], *, relative: bool, shared: bool, buckets: int,
                       max_relative: int, types: tuple[str, ...]) -> LayerCall:
    """A DeBERTa-v2 layer call; with relative attention its c2p/p2c terms become the call's ``head_scores``.

    Example:
        >>> call = parse_deberta_call((torch.zeros(1, 2, 4), None), {}, relative=False, shared=True, buckets=4,
        ...                           max_relative=8, types=())
        >>> call.head_scores is None
        True
    """
    call = parse_call(args, kwargs)
    rel = kwargs.get("rel_embeddings")
    if relative and rel is not None:
        if not shared:
            raise PlanError("replacing a whole DeBERTa-v2 layer needs share_att_key=True (shared position "
                            "projections); this model has separate ones")
        relative_pos = kwargs.get("relative_pos")
        hidden = call.hidden
        if relative_pos is None:
            from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

            relative_pos = build_relative_position(hidden, hidden, bucket_size=buckets, max_position=max_relative)
        span = buckets if buckets > 0 else max_relative
        call.head_scores = partial(relative_head_scores, rel=rel[: 2 * span], relative_pos=relative_pos, span=span,
                                   types=types)
    return call


def hidden_and_no_attention(hidden: torch.Tensor, call: LayerCall) -> tuple[torch.Tensor, None]:
    """What a DeBERTa-v2 layer returns: ``(hidden_states, attention_probs)``, without the probabilities.

    Example:
        >>> hidden_and_no_attention(torch.zeros(1), LayerCall(hidden=torch.zeros(1)))[1] is None
        True
    """
    return (hidden, None)


def relative_head_scores(q: torch.Tensor, k: torch.Tensor, query: Projection, key: Projection, *, rel: torch.Tensor,
                         relative_pos: torch.Tensor, span: int, types: tuple[str, ...]) -> torch.Tensor:
    """c2p + p2c of each sequence's head, as ``[B, 1, S, S]``, scaled like the content score.

    ``q``/``k`` are ``[B, 1, S, dh]``; ``query``/``key`` project the relative embeddings ``rel`` with
    each sequence's head projections (shared position projections, ``share_att_key=True``).
    """
    dh = q.shape[-1]
    inv = (dh * score_factor(types)) ** -0.5
    rp = relative_pos.to(device=q.device, dtype=torch.long)
    while rp.dim() > 2:
        rp = rp[0]
    b, s = q.shape[0], q.shape[2]
    score = q.new_zeros(b, s, s)
    if "c2p" in types:
        c2p = torch.bmm(q[:, 0], key(rel).transpose(1, 2))
        idx = torch.clamp(rp + span, 0, 2 * span - 1).expand(b, s, s)
        score = score + torch.gather(c2p, -1, idx) * inv
    if "p2c" in types:
        p2c = torch.bmm(k[:, 0], query(rel).transpose(1, 2))
        idx = torch.clamp(-rp + span, 0, 2 * span - 1).expand(b, s, s)
        score = score + torch.gather(p2c, -1, idx).transpose(-1, -2) * inv
    return score[:, None]
