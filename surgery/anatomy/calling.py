"""A family's calling convention: how the encoder calls one of its layers, in family-neutral terms.

A module that stands in for a whole encoder layer must take the encoder's call exactly as the family
makes it (hidden states, mask, position terms, in the family's argument order) and hand back what the
encoder expects. :meth:`EncoderAdapter.calling_convention <surgery.anatomy.base.EncoderAdapter.calling_convention>`
describes that for one layer as a :class:`CallingConvention`: plain callables and values, holding no
adapter and no model, so a replacement can keep them without referencing the model it sits in.

Each call is parsed into a :class:`LayerCall`. Position information the family adds to attention
scores arrives in one of three forms: a per-head additive ``head_bias`` (MPNet's shared relative
bias), a ``rotary`` map on ``q, k`` (ModernBERT), or ``head_scores`` (DeBERTa's c2p/p2c terms), which
the family computes from projections the caller hands it, so it needs to know nothing about how the
caller stores its weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

Projection = Callable[[torch.Tensor], torch.Tensor]
"""Rows ``[R, d]`` mapped to ``[B, R, head_dim]`` by the head each sequence of a batch uses."""


class HeadScores(Protocol):
    """Per-head position scores a family adds to ``q·k``, computed from a head's own projections.

    ``q``/``k`` are ``[B, 1, S, head_dim]``; ``query``/``key`` project rows (such as relative position
    embeddings) with each sequence's head query and key projections. Returns an additive
    ``[B, 1, S, S]`` term, already scaled like the content score.
    """

    def __call__(self, q: torch.Tensor, k: torch.Tensor, query: Projection, key: Projection) -> torch.Tensor: ...


@dataclass
class LayerCall:
    """One call of an encoder layer, in family-neutral terms.

    ``attention_bias`` is additive and broadcastable to ``[batch, 1, seq, seq]``; ``head_bias`` is a
    per-head additive position term ``[batch or 1, heads, seq, seq]`` (MPNet's relative bias);
    ``rotary`` applies a family's rotary embedding to per-head ``q, k`` of shape
    ``[batch, 1, seq, head_dim]``; ``head_scores`` adds per-head position scores (see :class:`HeadScores`).

    Example:
        >>> call = parse_call((torch.zeros(1, 2, 4), torch.tensor([[1, 0]])), {})
        >>> call.key_mask().tolist()
        [[True, False]]
    """

    hidden: torch.Tensor
    attention_bias: torch.Tensor | None = None
    head_bias: torch.Tensor | None = None
    rotary: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    head_scores: HeadScores | None = None

    def key_mask(self) -> torch.Tensor | None:
        """``[batch, seq]`` bool, True where a token can be attended to by some query."""
        if self.attention_bias is None:
            return None
        bias = self.attention_bias
        real = bias[:, 0] > torch.finfo(bias.dtype).min / 2
        return real.any(dim=-2) if real.dim() == 3 else real


@dataclass(frozen=True)
class CallingConvention:
    """How the encoder calls one layer, and what a module standing in for the layer must match.

    ``parse`` turns the layer's ``(args, kwargs)`` into a :class:`LayerCall`; ``result`` turns new
    hidden states (and the call) into what the encoder expects back. ``scale`` is the factor on a
    head's ``q·k`` scores, ``dropout`` the dropout probability on sublayer outputs. ``input_norm`` is
    the norm the layer applies to its input before attention (pre-LN families), ``output_norm`` the
    one that closes the layer (post-LN); they are the layer's own modules, to copy from, not to keep.
    ``attributes`` are plain attributes the encoder reads from its layers (ModernBERT's
    ``attention_type``), and ``head_bias_columns`` the columns of a shared per-head position term the
    layer's current heads use (``None``: one per head, in order; MPNet after head pruning differs).
    ``parse`` and ``result`` are module-level functions or partials of them, so keeping them holds no
    reference to an adapter or a model, and they survive ``copy.deepcopy`` and pickling.

    Example:
        >>> from surgery.anatomy import adapter_for
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("mpnet", heads=4, head_dim=8))
        >>> convention = adapter_for(model).calling_convention(model.encoder.layer[0])
        >>> convention.scale == 8 ** -0.5, type(convention.output_norm).__name__
        (True, 'LayerNorm')
    """

    parse: Callable[[tuple[Any, ...], dict[str, Any]], LayerCall]
    result: Callable[[torch.Tensor, LayerCall], Any]
    scale: float
    dropout: float = 0.0
    input_norm: nn.Module | None = None
    output_norm: nn.Module | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    head_bias_columns: list[int] | None = None


def parse_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> LayerCall:
    """The BERT layout's call, ``layer(hidden_states, attention_mask, ...)``, as a :class:`LayerCall`.

    Example:
        >>> parse_call((), {"hidden_states": torch.zeros(1, 2, 4)}).attention_bias is None
        True
    """
    hidden = args[0] if args else kwargs["hidden_states"]
    mask = args[1] if len(args) > 1 else kwargs.get("attention_mask")
    return LayerCall(hidden=hidden, attention_bias=additive_mask(mask, hidden.dtype))


def hidden_only(hidden: torch.Tensor, call: LayerCall) -> torch.Tensor:
    """The BERT layout's layer result: the new hidden states alone.

    Example:
        >>> hidden_only(torch.ones(1), LayerCall(hidden=torch.zeros(1))).tolist()
        [1.0]
    """
    return hidden


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Turn an encoder's attention mask (bool, 0/1 ``[B, S]`` or additive 4-D) into an additive 4-D bias.

    Example:
        >>> additive_mask(torch.tensor([[1, 0]]), torch.float32).shape
        torch.Size([1, 1, 1, 2])
    """
    if mask is None:
        return None
    neg = torch.finfo(dtype).min
    if mask.dim() == 2:  # [B, S] with 1 = keep (DistilBERT-style padding masks)
        mask = mask[:, None, None, :].bool()
    if not mask.is_floating_point():  # bool or 0/1 integers (DeBERTa): 1 = keep
        mask = mask.bool()
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, neg)
    return mask.to(dtype)
