"""Uniform anatomy of supported encoders: one small adapter per family."""

from __future__ import annotations

from torch import nn

from surgery.anatomy.base import AttentionParts, EncoderAdapter, FFNParts, LayerParts
from surgery.core.errors import UnsupportedModelError
from surgery.core.registry import adapter_class_for


def adapter_for(model: nn.Module) -> EncoderAdapter:
    """The anatomy adapter for a Hugging Face encoder (bare or with a task head).

    Example:
        >>> from transformers import BertConfig, BertForMaskedLM
        >>> cfg = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
        ...                  num_attention_heads=4, intermediate_size=37)
        >>> adapter_for(BertForMaskedLM(cfg)).num_layers
        2

    Raises:
        UnsupportedModelError: if the model is not a transformers model of a supported family.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type is None:
        raise UnsupportedModelError(
            f"{type(model).__name__} is not a Hugging Face transformers model (it has no config.model_type); "
            "pass a PreTrainedModel such as BertModel or AutoModelForSequenceClassification"
        )
    return adapter_class_for(model_type)(model)


__all__ = ["AttentionParts", "EncoderAdapter", "FFNParts", "LayerParts", "adapter_for"]
