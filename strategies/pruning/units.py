"""Shared machinery of the structured pruning baselines: remove units (heads or FFN neurons).

A unit-pruning strategy either takes the units to remove explicitly (``{layer: [units]}``) or ranks
them by an importance and removes a ``ratio`` of them, per layer or globally. The plan is always the
explicit map, so a hand-written plan and a computed one take the same path through ``apply``.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from surgery.anatomy import EncoderAdapter, adapter_for
from surgery.anatomy.slicing import check_indices
from surgery.core.errors import ConfigError
from surgery.core.report import LayerChange
from surgery.core.run import RunContext
from surgery.core.strategy import Data, Plan, Strategy, StrategyConfig
from surgery.scoring.selection import lowest_units, parse_layer_map


class OneSourceConfig(StrategyConfig):
    """Settings whose units come from exactly one of two fields: an explicit one, or one they are derived from.

    Subclasses name the fields (``explicit_field``, ``derived_field``) and how the message describes
    them; the validator is the same for every pruning strategy.

    Example:
        >>> class Cfg(OneSourceConfig):
        ...     units: list[int] | None = None
        ...     ratio: float | None = None
        ...     explicit_field: ClassVar[str] = "units"
        >>> Cfg(ratio=0.5).ratio
        0.5
        >>> try:
        ...     Cfg(units=[1], ratio=0.5)
        ... except ValueError as err:
        ...     print(err.errors()[0]["msg"])
        Value error, give exactly one of 'units' (explicit units) or 'ratio'
    """

    explicit_field: ClassVar[str] = ""
    derived_field: ClassVar[str] = "ratio"
    explicit_hint: ClassVar[str] = "explicit units"
    derived_hint: ClassVar[str] = ""

    @model_validator(mode="after")
    def _one_source(self) -> OneSourceConfig:
        if (getattr(self, self.explicit_field) is None) == (getattr(self, self.derived_field) is None):
            raise ValueError(f"give exactly one of '{self.explicit_field}' ({self.explicit_hint}) or "
                             f"'{self.derived_field}'{self.derived_hint}")
        return self


class UnitPruningConfig(OneSourceConfig):
    """Settings shared by ``head-prune`` and ``ffn-prune``."""

    ratio: float | None = Field(default=None, ge=0.0, le=1.0, description="fraction of units to remove")
    scope: Literal["global", "layer"] = Field(default="global", description="rank units globally or per layer")
    layers: list[int] | None = Field(default=None, description="layers to consider (default: all)")
    max_batches: int = Field(default=32, ge=1, description="data batches read to score importance")
    seed: int = Field(default=0, description="seed for random importance")
    min_keep: int = Field(default=1, ge=0, description="units that always stay in every layer")


class UnitPruningStrategy(Strategy):
    """Base of strategies that remove whole units from layers; subclasses name the unit."""

    unit: ClassVar[str] = ""  # plan key and LayerChange component, e.g. "heads"
    requires = "batches"  # data-driven importance reads batches; explicit units and magnitude need none
    objectives = ("task", "embedding")  # importance and recovery have a label-free embedding objective
    config: Any

    def units_in(self, adapter: EncoderAdapter, layer: int) -> int:
        """How many units layer ``layer`` has now."""
        return adapter.layer(layer).count(self.unit)

    @abstractmethod
    def scores(self, model: nn.Module, adapter: EncoderAdapter, layers: list[int], data: Data | None,
               metrics: dict[str, Any]) -> dict[int, torch.Tensor]:
        """Importance of every unit of ``layers`` (higher = keep); figures worth reporting go to ``metrics``."""

    def target_layers(self, adapter: EncoderAdapter) -> list[int]:
        layers = self.config.layers if self.config.layers is not None else range(adapter.num_layers)
        checked = check_indices(list(layers), adapter.num_layers, f"{self.name}: layers")
        return [i for i in checked if adapter.layer(i).attention is not None or self.unit != "heads"]

    def plan(self, model: nn.Module, data: Data | None = None, context: RunContext | None = None) -> Plan:
        metrics = (context or RunContext()).metrics
        adapter = adapter_for(model)
        explicit = getattr(self.config, self.config.explicit_field)
        if explicit is not None:
            removal = parse_layer_map(explicit, f"{self.name}: {self.config.explicit_field}")
            self._validate(adapter, removal)
            return {self.unit: {str(k): v for k, v in sorted(removal.items()) if v}}
        # A layer whose units are all gone already (an FFN of width 0) has nothing left to rank.
        layers = [i for i in self.target_layers(adapter) if self.units_in(adapter, i) > 0]
        with torch.no_grad() if data is None else torch.enable_grad():
            scores = self.scores(model, adapter, layers, data, metrics)
        removal = lowest_units(scores, float(self.config.ratio), scope=self.config.scope,
                               min_keep=self.config.min_keep)
        metrics["importance"] = {str(k): [round(float(x), 6) for x in v] for k, v in scores.items()}
        return {self.unit: {str(k): v for k, v in sorted(removal.items()) if v}}

    def _validate(self, adapter: EncoderAdapter, removal: dict[int, list[int]]) -> None:
        for layer, units in removal.items():
            check_indices([layer], adapter.num_layers, f"{self.name}: layer numbers")
            check_indices(units, self.units_in(adapter, layer), f"{self.name}: {self.unit} of layer {layer}")

    def apply(self, model: nn.Module, plan: Plan) -> list[LayerChange]:
        adapter = adapter_for(model)
        if self.unit not in plan:
            raise ConfigError(f"{self.name}: plan has no '{self.unit}' entry")
        removal = parse_layer_map(plan[self.unit], f"{self.name}: plan {self.unit}")
        self._validate(adapter, removal)
        changes = []
        for layer, units in sorted(removal.items()):
            before = self.units_in(adapter, layer)
            adapter.remove_units(layer, {self.unit: units}, self.name)  # the removal engine, head bookkeeping too
            changes.append(LayerChange(layer=layer, component=self.unit, before=before,
                                       after=self.units_in(adapter, layer)))
        return changes
