"""Anatomy of MPNet, whose relative-position bias is shared by every layer, one column per head.

``MPNetEncoder.relative_attention_bias`` is an ``nn.Embedding(buckets, heads)``. The encoder
looks it up once per forward pass and hands the result, ``position_bias`` of shape
``[batch, heads, query, key]``, to every layer, which adds it to its attention scores. After a
layer loses heads, it must add only its kept heads' slices of that shared bias. The adapter
records the kept original head indices in a non-persistent buffer ``bias_heads`` on the layer's
attention module and installs a forward pre-hook that slices ``position_bias`` with it.

The buffer is not saved: reloading replays the strategy's ``apply``, which calls
:meth:`MPNetAdapter.keep_heads` again and so rebuilds both buffer and hook. The shared table keeps
every column (it is ``buckets * heads`` numbers; another layer may still use any column).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from surgery.anatomy.base import AttentionParts
from surgery.anatomy.bert import BertAdapter
from surgery.anatomy.calling import CallingConvention, LayerCall, parse_call

BIAS_HEADS = "bias_heads"


def slice_position_bias(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Forward pre-hook (``with_kwargs``) of a pruned ``MPNetSelfAttention``: keep its heads' bias.

    ``MPNetAttention`` passes ``position_bias`` positionally (third argument); a caller may also
    pass it by name, so both are handled. The hook is a module-level function reading the buffer
    from the module it is called on, so ``copy.deepcopy`` and pickling keep it working.
    """
    heads = getattr(module, BIAS_HEADS)
    if kwargs.get("position_bias") is not None:
        kwargs["position_bias"] = kwargs["position_bias"].index_select(1, heads)
    elif len(args) > 2 and args[2] is not None:
        args = (*args[:2], args[2].index_select(1, heads), *args[3:])
    return args, kwargs


class MPNetAdapter(BertAdapter):
    """MPNet (post-LN, separate q/k/v/o in one module, relative-position bias shared across layers).

    Example:
        >>> from transformers import MPNetConfig, MPNetModel
        >>> from surgery.anatomy import adapter_for
        >>> cfg = MPNetConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
        ...                   num_attention_heads=4, intermediate_size=37)
        >>> adapter = adapter_for(MPNetModel(cfg))
        >>> adapter.keep_heads(0, [1, 3])
        >>> adapter.layer(0).attention.module.bias_heads.tolist()
        [1, 3]
    """

    model_types = ("mpnet",)
    layers_path = "encoder.layer"

    def attention_parts(self, layer: nn.Module) -> AttentionParts | None:
        core = getattr(getattr(layer, "attention", None), "attn", None)
        if core is None or not hasattr(core, "q"):
            return None
        return AttentionParts(
            module=core,
            query=core.q,
            key=core.k,
            value=core.v,
            output=core.o,
            num_heads=self.num_heads_of(core),
            head_dim=core.attention_head_size,
        )

    def norms(self, layer: nn.Module) -> dict[str, nn.Module]:
        found: dict[str, nn.Module] = {}
        if hasattr(layer, "attention"):
            found["attention"] = layer.attention.LayerNorm
        if hasattr(layer, "output"):
            found["ffn"] = layer.output.LayerNorm
        return found

    def after_heads_kept(self, index: int, attention: nn.Module, keep: list[int]) -> None:
        # ``keep`` indexes the module's current heads; compose with what was kept before so the
        # buffer always holds columns of the shared table (the original head numbers).
        current = getattr(attention, BIAS_HEADS, None)
        if current is None:
            table = self.base.get_submodule("encoder").relative_attention_bias
            current = torch.arange(table.embedding_dim, device=table.weight.device)
        kept = current[torch.as_tensor(keep, dtype=torch.long, device=current.device)].clone()
        if BIAS_HEADS in attention._buffers:
            attention._buffers[BIAS_HEADS] = kept
        else:
            attention.register_buffer(BIAS_HEADS, kept, persistent=False)
        if slice_position_bias not in attention._forward_pre_hooks.values():
            attention.register_forward_pre_hook(slice_position_bias, with_kwargs=True)

    # -- whole-layer replacement: MPNet layers take the shared bias third and return a tuple --
    def calling_convention(self, layer: nn.Module) -> CallingConvention:
        attention = self.attention_parts(layer)
        # After head pruning the layer's heads map to a subset of the shared relative-bias table.
        kept = getattr(attention.module, BIAS_HEADS, None) if attention is not None else None
        return replace(super().calling_convention(layer), parse=parse_mpnet_call, result=hidden_in_tuple,
                       head_bias_columns=kept.tolist() if kept is not None else None)


def parse_mpnet_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> LayerCall:
    """An MPNet layer call ``layer(hidden_states, attention_mask, position_bias, ...)``.

    ``position_bias`` is ``[batch, heads, query, key]``, one column of the shared table per original head.

    Example:
        >>> parse_mpnet_call((torch.zeros(1, 2, 4), None, torch.ones(1, 3, 2, 2)), {}).head_bias.shape
        torch.Size([1, 3, 2, 2])
    """
    call = parse_call(args, kwargs)
    call.head_bias = args[2] if len(args) > 2 else kwargs.get("position_bias")
    return call


def hidden_in_tuple(hidden: torch.Tensor, call: LayerCall) -> tuple[torch.Tensor]:
    """What an MPNet layer returns: a one-element tuple.

    Example:
        >>> len(hidden_in_tuple(torch.zeros(1), LayerCall(hidden=torch.zeros(1))))
        1
    """
    return (hidden,)
