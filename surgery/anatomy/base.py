"""The uniform anatomy of an encoder, and the adapter base class every family implements.

An adapter is the only code that knows a family's module names. Everything else in surgery sees an
encoder as a list of :class:`LayerParts`: attention (q, k, v and o, or a fused qkv), FFN (up, down,
activation) and norms. Head and neuron removal are implemented once here, on top of those parts;
an adapter only overrides the hooks where its family keeps extra per-head state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import nn

from surgery.anatomy.calling import CallingConvention, hidden_only, parse_call
from surgery.errors import PlanError
from surgery.ops import head_rows, keep_linear_inputs_, keep_linear_outputs_


@dataclass
class AttentionParts:
    """One layer's self-attention, seen uniformly.

    ``qkv`` is set instead of ``query``/``key``/``value`` for families that fuse the three
    projections into one Linear whose rows are laid out ``[q heads | k heads | v heads]``.
    ``per_head_rows`` lists further projections whose output rows are split per head exactly like
    the query (DeBERTa-v2's separate position projections when keys are not shared).
    """

    module: nn.Module
    output: nn.Linear
    num_heads: int
    head_dim: int
    query: nn.Linear | None = None
    key: nn.Linear | None = None
    value: nn.Linear | None = None
    qkv: nn.Linear | None = None
    per_head_rows: tuple[nn.Linear, ...] = ()

    @property
    def projections(self) -> tuple[nn.Linear, ...]:
        """Every Linear whose output rows are per head (q, k, v or qkv, plus ``per_head_rows``)."""
        own = (self.qkv,) if self.qkv is not None else (self.query, self.key, self.value)
        return tuple(p for p in own if p is not None) + self.per_head_rows


@dataclass
class FFNParts:
    """One layer's feed-forward block.

    With ``gated=True`` (ModernBERT's GeGLU) ``up`` has ``2 * width`` rows: rows ``j`` and
    ``j + width`` both belong to neuron ``j``.
    """

    up: nn.Linear
    down: nn.Linear
    act: nn.Module | Callable[..., Any]
    gated: bool = False

    @property
    def width(self) -> int:
        """Number of intermediate neurons."""
        return self.down.in_features


@dataclass
class LayerParts:
    """One encoder layer: its module, attention, FFN and norms (by role name)."""

    index: int
    module: nn.Module
    attention: AttentionParts | None
    ffn: FFNParts | None
    norms: dict[str, nn.Module] = field(default_factory=dict)


class EncoderAdapter:
    """Base class of the per-family anatomy adapters.

    Subclasses set ``model_types`` (values of ``config.model_type``) and ``layers_path`` (the
    encoder's ``ModuleList`` relative to the bare model), and implement :meth:`attention_parts`,
    :meth:`ffn_parts` and :meth:`norms`. Families with extra per-head state override
    :meth:`after_heads_kept`.

    Example:
        >>> from transformers import BertConfig, BertModel
        >>> from surgery.anatomy import adapter_for
        >>> cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
        ...                  num_attention_heads=4, intermediate_size=37)
        >>> adapter = adapter_for(BertModel(cfg))
        >>> adapter.layer(0).attention.num_heads, adapter.layer(0).ffn.width
        (4, 37)
    """

    model_types: ClassVar[tuple[str, ...]] = ()
    layers_path: ClassVar[str] = "encoder.layer"
    # Attributes on the attention module that hold its head count, and the one that holds
    # heads * head_dim; forward passes of some families read them.
    head_count_attrs: ClassVar[tuple[str, ...]] = ("num_attention_heads",)
    all_head_size_attrs: ClassVar[tuple[str, ...]] = ("all_head_size",)
    # Submodules of the bare model that serve the task head rather than the encoder: BERT-style
    # poolers were trained for next-sentence prediction and feed ...ForSequenceClassification.
    task_head_modules: ClassVar[tuple[str, ...]] = ("pooler",)

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.base: nn.Module = getattr(model, "base_model", model)

    # -- structure -----------------------------------------------------------------------
    def task_head_parameters(self) -> dict[str, nn.Parameter]:
        """Parameters of the task head by name: outside the bare model, plus its task-head submodules.

        Example:
            >>> from surgery.testing import TinySpec, tiny_model
            >>> from surgery.anatomy import adapter_for
            >>> sorted(adapter_for(tiny_model(TinySpec("bert", task="seq-cls"))).task_head_parameters())[:2]
            ['bert.pooler.dense.bias', 'bert.pooler.dense.weight']
        """
        prefix = getattr(self.model, "base_model_prefix", "")
        inside = (f"{prefix}." if prefix and self.base is not self.model else "",)
        heads = tuple(f"{inside[0]}{name}." for name in self.task_head_modules)
        return {
            name: p for name, p in self.model.named_parameters()
            if not name.startswith(inside[0]) or name.startswith(heads)
        }

    @property
    def config(self) -> Any:
        return self.model.config

    def layers(self) -> nn.ModuleList:
        """The encoder's layer list."""
        return self.base.get_submodule(self.layers_path)  # type: ignore[return-value]

    @property
    def num_layers(self) -> int:
        return len(self.layers())

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    def layer(self, index: int) -> LayerParts:
        """The uniform view of layer ``index``."""
        layers = self.layers()
        if not 0 <= index < len(layers):
            raise PlanError(f"layer {index} does not exist; this model has layers 0..{len(layers) - 1}")
        module = layers[index]
        return LayerParts(
            index=index,
            module=module,
            attention=self.attention_parts(module),
            ffn=self.ffn_parts(module),
            norms=self.norms(module),
        )

    def attention_parts(self, layer: nn.Module) -> AttentionParts | None:
        """The attention of one layer module, or None if a strategy has replaced it."""
        raise NotImplementedError

    def ffn_parts(self, layer: nn.Module) -> FFNParts | None:
        """The FFN of one layer module, or None if a strategy has replaced it."""
        raise NotImplementedError

    def norms(self, layer: nn.Module) -> dict[str, nn.Module]:
        """The layer's norms by role (``"attention"``, ``"ffn"``; pre- or post-LN as the family has)."""
        raise NotImplementedError

    def head_dim(self) -> int:
        """The configured head dimension."""
        return int(getattr(self.config, "head_dim", None) or self.hidden_size // self.num_heads_config())

    def num_heads_config(self) -> int:
        return int(self.config.num_attention_heads)

    # -- surgery -------------------------------------------------------------------------
    def keep_heads(self, index: int, keep: Sequence[int]) -> None:
        """Keep only the attention heads ``keep`` of layer ``index`` (indices into its current heads)."""
        attention = self._attention(index)
        keep = sorted(set(keep))
        if not keep:
            raise PlanError(
                f"layer {index}: removing all {attention.num_heads} heads is not supported; keep at least one "
                "head (or convert the layer with a strategy that replaces attention)"
            )
        hd = attention.head_dim
        rows = head_rows(keep, hd)
        if attention.qkv is not None:
            width = attention.num_heads * hd
            keep_linear_outputs_(attention.qkv, [part * width + r for part in range(3) for r in rows])
            for lin in attention.per_head_rows:
                keep_linear_outputs_(lin, rows)
        else:
            for lin in attention.projections:
                keep_linear_outputs_(lin, rows)
        keep_linear_inputs_(attention.output, rows)
        for attr in self.head_count_attrs:
            if hasattr(attention.module, attr):
                setattr(attention.module, attr, len(keep))
        for attr in self.all_head_size_attrs:
            if hasattr(attention.module, attr):
                setattr(attention.module, attr, len(keep) * hd)
        self.after_heads_kept(index, attention.module, keep)

    def after_heads_kept(self, index: int, attention: nn.Module, keep: list[int]) -> None:
        """Hook for families with extra per-head state outside q/k/v/o (MPNet's relative bias)."""

    def keep_neurons(self, index: int, keep: Sequence[int]) -> None:
        """Keep only the FFN intermediate neurons ``keep`` of layer ``index``."""
        ffn = self._ffn(index)
        keep = sorted(set(keep))
        rows = keep + [ffn.width + j for j in keep] if ffn.gated else keep
        keep_linear_outputs_(ffn.up, rows)
        keep_linear_inputs_(ffn.down, keep)

    def head_output_columns(self, index: int, heads: Sequence[int]) -> tuple[nn.Linear, list[int]]:
        """The output projection of layer ``index`` and its input columns fed by ``heads``.

        Zeroing those columns masks the heads exactly; tests use it as the reference for removal.
        """
        attention = self._attention(index)
        return attention.output, head_rows(sorted(heads), attention.head_dim)

    def _attention(self, index: int) -> AttentionParts:
        parts = self.layer(index).attention
        if parts is None:
            raise PlanError(f"layer {index} has no standard attention any more (a strategy replaced it)")
        return parts

    def _ffn(self, index: int) -> FFNParts:
        parts = self.layer(index).ffn
        if parts is None:
            raise PlanError(f"layer {index} has no standard FFN any more (a strategy replaced it)")
        return parts

    def num_heads_of(self, module: nn.Module) -> int:
        """Current head count of an attention module, read from its bookkeeping attribute."""
        for attr in self.head_count_attrs:
            if hasattr(module, attr):
                return int(getattr(module, attr))
        raise AttributeError(f"{type(module).__name__} has none of {self.head_count_attrs}")

    # -- whole-layer replacement ---------------------------------------------------------------
    def calling_convention(self, layer: nn.Module) -> CallingConvention:
        """How the encoder calls ``layer``, for a module that stands in for the whole layer.

        The default fits the BERT layout (post-LN, ``layer(hidden, attention_mask, ...) -> tensor``,
        scores scaled by ``1/sqrt(head_dim)``); families override it and replace what differs.

        Example:
            >>> from surgery.anatomy import adapter_for
            >>> from surgery.testing import TinySpec, tiny_model
            >>> model = tiny_model(TinySpec("bert", head_dim=16))
            >>> adapter_for(model).calling_convention(model.encoder.layer[0]).scale
            0.25
        """
        attention = self.attention_parts(layer)
        head_dim = attention.head_dim if attention is not None else self.head_dim()
        return CallingConvention(parse=parse_call, result=hidden_only, scale=head_dim**-0.5,
                                 dropout=sublayer_dropout(self.config), output_norm=self.norms(layer).get("ffn"))


def sublayer_dropout(config: Any) -> float:
    """The dropout probability on sublayer outputs, under the first name a family's config uses for it.

    Example:
        >>> from transformers import DistilBertConfig
        >>> sublayer_dropout(DistilBertConfig(dropout=0.2))
        0.2
    """
    for attr in ("hidden_dropout_prob", "dropout", "mlp_dropout"):
        value = getattr(config, attr, None)
        if isinstance(value, (int, float)):
            return float(value)
    return 0.0
