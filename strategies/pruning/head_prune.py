"""``head-prune``: remove attention heads physically (the baseline of Michel et al. 2019)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import nn

from surgery.anatomy import EncoderAdapter
from surgery.core.errors import ConfigError, PlanError
from surgery.core.strategy import Data
from surgery.scoring.importance import linear_input_scores, objective_for
from surgery.scoring.selection import normalise_per_layer
from surgery.strategies.pruning.units import UnitPruningConfig, UnitPruningStrategy


class HeadPruningConfig(UnitPruningConfig):
    """Settings of ``head-prune``.

    Example:
        >>> HeadPruningConfig(ratio=0.25, scope="layer").importance
        'auto'
    """

    heads: dict[int, list[int]] | None = Field(default=None, description="layer -> heads to remove")
    importance: Literal["auto", "gradient", "magnitude"] = Field(
        default="auto", description="gradient (Michel et al.) with data, magnitude without; auto picks"
    )
    explicit_field: ClassVar[str] = "heads"


class HeadPruningStrategy(UnitPruningStrategy):
    """Remove attention heads, given explicitly or by importance and a ratio.

    Importance is Michel et al.'s ``E|dL/d gate_h|`` when data with labels is given, otherwise the
    magnitude ``||W_V[h]|| * ||W_O[:, h]||`` of the head's value/output path. Scores are normalised
    per layer (L2) before global ranking, and at least one head stays in every layer.

    Example:
        >>> import surgery
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert"))  # 2 layers, 4 heads, FFN width 37
        >>> report = surgery.convert(model, HeadPruningStrategy(ratio=0.5, scope="layer"))
        >>> [layer.heads for layer in surgery.inspect(model).layers]
        [2, 2]
    """

    name = "head-prune"
    config_class = HeadPruningConfig
    unit = "heads"
    config: HeadPruningConfig


    def _validate(self, adapter: EncoderAdapter, removal: dict[int, list[int]]) -> None:
        super()._validate(adapter, removal)
        # Refuse an emptied layer before any layer is cut, so a rejected plan leaves the model as it was.
        for layer, heads in sorted(removal.items()):
            count = self.units_in(adapter, layer)
            if heads and len(heads) >= count:
                raise PlanError(
                    f"{self.name}: removing all {count} heads of layer {layer} is not supported; keep at least one "
                    "head (or convert the layer with a strategy that replaces attention)"
                )

    def scores(self, model: nn.Module, adapter: EncoderAdapter, layers: list[int], data: Data | None,
               metrics: dict[str, Any]) -> dict[int, torch.Tensor]:
        kind = self.config.importance
        if kind == "auto":
            kind = "gradient" if data is not None else "magnitude"
        if kind == "gradient":
            if data is None:
                raise ConfigError("head-prune importance='gradient' needs labelled data; pass data or use 'magnitude'")
            outputs = {i: adapter.layer(i).attention.output for i in layers}
            head_dim = adapter.layer(layers[0]).attention.head_dim if layers else 1
            raw = linear_input_scores(model, outputs, data, kind="gate", group_size=head_dim,
                                      objective=objective_for(data), max_batches=self.config.max_batches)
        else:
            raw = {}
            for i in layers:
                att = adapter.layer(i).attention
                value, rows = att.rows_of_part("v", range(att.width))
                v_norm = value.weight.detach()[rows].view(att.num_heads, -1).norm(dim=1)
                o_norm = att.output.weight.detach().view(att.output.out_features, att.num_heads, -1)
                raw[i] = (v_norm * o_norm.transpose(0, 1).reshape(att.num_heads, -1).norm(dim=1)).float()
        metrics["importance_kind"] = kind
        return normalise_per_layer(raw)
