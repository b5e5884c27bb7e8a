"""The uniform anatomy of an encoder, and the adapter base class every family implements.

An adapter is the only code that knows a family's module names. Everything else in surgery sees an
encoder as a list of :class:`LayerParts` (:mod:`surgery.anatomy.parts`): attention (q, k, v and o, or
a fused qkv), FFN (up, down, activation) and norms. Removal is cut once, by
:mod:`surgery.anatomy.removal` on top of those parts; the adapter adds the family's head bookkeeping,
and only overrides the hooks where its family keeps extra per-head state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from torch import nn

from surgery.anatomy.calling import CallingConvention, hidden_only, parse_call
from surgery.anatomy.parts import AttentionParts, FFNParts, LayerParts
from surgery.anatomy.removal import commit, layer_cuts
from surgery.anatomy.slicing import check_indices, complement
from surgery.core.errors import PlanError


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
    # The config attribute that holds the FFN width of every layer (what a stock config can say of it).
    ffn_width_config: ClassVar[str] = "intermediate_size"

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
    def remove_units(self, index: int, removal: Mapping[str, Sequence[int]], who: str = "") -> None:
        """Remove units of layer ``index`` for good: ``removal`` maps a group to the units to remove.

        Groups: ``heads``, ``neurons`` (cut physically), ``qk``, ``v``, ``o`` (zero-recovered); see
        :mod:`surgery.anatomy.removal`. ``who`` prefixes error messages (a strategy's name).

        Example:
            >>> from surgery.anatomy import adapter_for
            >>> from surgery.testing import TinySpec, tiny_model
            >>> adapter = adapter_for(tiny_model(TinySpec("bert", heads=4, ffn=37)))
            >>> adapter.remove_units(0, {"heads": [1], "neurons": [0, 5]})
            >>> adapter.layer(0).attention.num_heads, adapter.layer(0).ffn.width
            (3, 35)
        """
        parts = self.layer(index)
        commit(parts.module, layer_cuts(parts, removal, who))
        if "heads" in removal:
            attention = parts.require_attention()
            keep = complement(removal["heads"], attention.num_heads)
            for attr in self.head_count_attrs:
                if hasattr(attention.module, attr):
                    setattr(attention.module, attr, len(keep))
            for attr in self.all_head_size_attrs:
                if hasattr(attention.module, attr):
                    setattr(attention.module, attr, len(keep) * attention.head_dim)
            self.after_heads_kept(index, attention.module, keep)

    def keep_heads(self, index: int, keep: Sequence[int]) -> None:
        """Keep only the attention heads ``keep`` of layer ``index`` (indices into its current heads)."""
        heads = self._attention(index).num_heads
        keep = check_indices(keep, heads, f"layer {index}: heads to keep")
        self.remove_units(index, {"heads": complement(keep, heads)})

    def after_heads_kept(self, index: int, attention: nn.Module, keep: list[int]) -> None:
        """Hook for families with extra per-head state outside q/k/v/o (MPNet's relative bias)."""

    def keep_neurons(self, index: int, keep: Sequence[int]) -> None:
        """Keep only the FFN intermediate neurons ``keep`` of layer ``index``."""
        width = self._ffn(index).width
        keep = check_indices(keep, width, f"layer {index}: neurons to keep")
        self.remove_units(index, {"neurons": complement(keep, width)})

    def head_output_columns(self, index: int, heads: Sequence[int]) -> tuple[nn.Linear, list[int]]:
        """The output projection of layer ``index`` and its input columns fed by ``heads``.

        Zeroing those columns masks the heads exactly; tests use it as the reference for removal.
        """
        attention = self._attention(index)
        return attention.output, attention.columns_of_heads(sorted(heads))

    def _attention(self, index: int) -> AttentionParts:
        return self.layer(index).require_attention()

    def _ffn(self, index: int) -> FFNParts:
        return self.layer(index).require_ffn()

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
