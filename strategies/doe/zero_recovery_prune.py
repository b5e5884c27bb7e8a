"""``zero-recovery-prune``: structured pruning of DoE's module sets (DoE §4.5, §5.4, App. A).

The strategy is ``zero-recovery-prune`` (:class:`ZeroRecoveryPruningStrategy`,
:class:`ZeroRecoveryPruningConfig`). Its unit groups per layer are those of the removal engine
(:mod:`surgery.anatomy.removal`):

* ``neurons``: FFN intermediate neurons, removed physically: the very cut of ``ffn-prune``, by the
  same engine and, for data-driven importance, the same scorer
  (:func:`~surgery.strategies.pruning.ffn_prune.neuron_scores`).
  Module set ``ffn`` is therefore ``ffn-prune`` with attribution importance ranked globally; it stays
  here because DoE plans (and models saved from them) record it in this form;
* ``qk``: output dimensions of the query and key projections, pruned *together*;
* ``v``: output dimensions of the value projection;
* ``o``: output dimensions of the attention output projection (they feed the residual stream).

``qk``, ``v`` and ``o`` are zero-recovered (:class:`~surgery.anatomy.slicing.ZeroRecoveryLinear`): only the kept
outputs are computed and scattered into zeros of full width, exactly like masking. Module sets:
``ffn`` = neurons; ``attention`` = qk, v, o; ``dense`` = o, neurons; ``all`` = all four.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field
from torch import nn

from surgery.anatomy import EncoderAdapter, adapter_for
from surgery.anatomy.removal import GROUP_PARTS, MODULE_GROUPS, units_of
from surgery.anatomy.slicing import check_indices
from surgery.core.errors import ConfigError
from surgery.core.report import LayerChange
from surgery.core.run import RunContext
from surgery.core.strategy import Data, Plan, Strategy
from surgery.scoring.importance import (
    Forward,
    Objective,
    TokenMask,
    gold_logit_objective,
    linear_input_scores,
    loss_objective,
)
from surgery.scoring.selection import lowest_units
from surgery.strategies.pruning.ffn_prune import neuron_scores
from surgery.strategies.pruning.units import OneSourceConfig

ModuleSet = Literal["ffn", "attention", "dense", "all"]
Group = Literal["qk", "v", "o", "neurons"]
MODULE_SETS: dict[str, tuple[str, ...]] = {
    "ffn": ("neurons",),
    "attention": ("qk", "v", "o"),
    "dense": ("o", "neurons"),
    "all": ("qk", "v", "o", "neurons"),
}
ImportanceKind = Literal["attribution", "activation", "gradient", "random"]


def group_width(adapter: EncoderAdapter, layer: int, group: str) -> int:
    """Number of units of ``group`` in ``layer``.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> group_width(adapter_for(tiny_model(TinySpec("bert", ffn=37))), 0, "neurons")
        37
    """
    return units_of(adapter.layer(layer), group)


def module_scores(
    model: nn.Module,
    module_set: str,
    data: Data | None,
    *,
    kind: ImportanceKind = "attribution",
    objective: Objective = gold_logit_objective,
    max_batches: int | None = None,
    seed: int = 0,
    forward: Forward | None = None,
    token_mask: TokenMask | None = None,
) -> dict[tuple[int, str], torch.Tensor]:
    """Importance of every unit of ``module_set``, keyed by ``(layer, group)``; higher = keep.

    FFN neurons are scored on the input of the down-projection (DoE's h) by ffn-prune's
    :func:`~surgery.strategies.pruning.ffn_prune.neuron_scores`, the other groups on the output of their
    projection (a fused projection once; each part reads its rows); ``qk`` adds the query and key
    scores of each dimension. One backward per batch and pass.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert", layers=1))
        >>> scores = module_scores(model, "dense", None, kind="random")
        >>> sorted(scores), scores[(0, "neurons")].shape
        ([(0, 'neurons'), (0, 'o')], torch.Size([37]))
    """
    if module_set not in MODULE_SETS:
        raise ConfigError(f"module set {module_set!r} is unknown; choose one of {sorted(MODULE_SETS)}")
    adapter = adapter_for(model)
    groups = MODULE_SETS[module_set]
    if kind == "random":
        gen = torch.Generator().manual_seed(seed)
        return {(i, g): torch.rand(group_width(adapter, i, g), generator=gen)
                for i in range(adapter.num_layers) for g in groups}
    if data is None:
        raise ConfigError(f"importance {kind!r} needs data; pass training batches or use 'random'")
    neuron_layers = list(range(adapter.num_layers)) if "neurons" in groups else []
    # Each projection is scored once on its output rows; a part's scores are its rows (row maps).
    outputs: dict[Any, nn.Module] = {}
    for i in range(adapter.num_layers):
        parts = adapter.layer(i)
        for g in groups:
            if g == "neurons":
                continue
            attention = parts.require_attention()
            linears = [attention.output] if g == "o" else [attention.projection_of(p)[0] for p in GROUP_PARTS[g]]
            for linear in linears:
                outputs.setdefault((i, id(linear)), linear)
    data = list(data)  # two passes below must see the same batches
    common = dict(kind=kind, objective=objective, max_batches=max_batches, forward=forward, token_mask=token_mask)
    neurons = neuron_scores(model, adapter, neuron_layers, data, **common) if neuron_layers else {}
    raw = linear_input_scores(model, outputs, data, side="output", **common) if outputs else {}
    scores: dict[tuple[int, str], torch.Tensor] = {}
    for i in range(adapter.num_layers):
        attention = adapter.layer(i).attention
        for g in groups:
            if g == "neurons":
                scores[(i, g)] = neurons[i]
            elif g == "o":
                scores[(i, g)] = raw[(i, id(attention.output))]
            else:  # qk adds the query and key scores of each dimension
                rows_of = [attention.rows_of_part(p, range(attention.width)) for p in GROUP_PARTS[g]]
                scores[(i, g)] = sum(raw[(i, id(linear))][rows] for linear, rows in rows_of)
    return scores


def lowest_module_units(scores: Mapping[tuple[int, str], torch.Tensor], ratio: float, *, min_keep: int = 1
                        ) -> dict[str, dict[str, list[int]]]:
    """The globally lowest ``ratio`` of all units (all groups ranked together), as a plan map.

    Example:
        >>> s = {(0, "o"): torch.tensor([3.0, 1.0]), (1, "neurons"): torch.tensor([0.5, 4.0, 0.1])}
        >>> lowest_module_units(s, 0.4)
        {'0': {'o': []}, '1': {'neurons': [0, 2]}}
    """
    keys = list(scores)
    removed = lowest_units({n: scores[key] for n, key in enumerate(keys)}, ratio, min_keep=min_keep)
    plan: dict[str, dict[str, list[int]]] = {}
    for n, (layer, group) in enumerate(keys):
        plan.setdefault(str(layer), {})[group] = removed[n]
    return plan


def prune_layer_groups(adapter: EncoderAdapter, layer: int, removal: Mapping[str, list[int]]) -> list[LayerChange]:
    """Carry out one layer's removal map (group -> unit indices) in place, through the removal engine."""
    removal = {g: removal[g] for g in MODULE_GROUPS if g in removal}
    widths = {g: group_width(adapter, layer, g) for g in removal}
    adapter.remove_units(layer, removal, who="zero-recovery-prune")
    return [LayerChange(layer=layer, component=g, before=widths[g], after=widths[g] - len(set(removal[g])))
            for g in removal]


class ZeroRecoveryPruningConfig(OneSourceConfig):
    """Settings of ``zero-recovery-prune``.

    Example:
        >>> ZeroRecoveryPruningConfig(module_set="attention", ratio=0.3).importance
        'attribution'
    """

    module_set: ModuleSet = Field(default="ffn", description="ffn | attention | dense | all (DoE §5.4)")
    ratio: float | None = Field(default=None, ge=0.0, le=1.0, description="fraction of all units to remove")
    remove: dict[int, dict[str, list[int]]] | None = Field(
        default=None, description="layer -> group (qk, v, o, neurons) -> units to remove")
    importance: ImportanceKind = Field(default="attribution", description="how to rank units for 'ratio'")
    objective: Literal["gold-logit", "loss"] = Field(default="gold-logit", description="P for attribution")
    max_batches: int = Field(default=1, ge=1, description="data batches read to score importance")
    min_keep: int = Field(default=1, ge=0, description="units that always stay in every group of every layer")
    seed: int = 0

    explicit_field: ClassVar[str] = "remove"


class ZeroRecoveryPruningStrategy(Strategy):
    """Prune a module set with zero-recovery (FFN neurons physically, attention rows zero-recovered).

    Example:
        >>> import surgery
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert"))
        >>> _ = surgery.convert(model, ZeroRecoveryPruningStrategy(module_set="all", ratio=0.5, importance="random"))
        >>> type(model.encoder.layer[0].attention.output.dense).__name__
        'ZeroRecoveryLinear'
    """

    name = "zero-recovery-prune"
    trained_after = True  # in DoE the condensed prompt of the accepted probe is copied in next
    requires = "batches"  # importance scores read batches (explicit 'remove' needs none)
    config_class = ZeroRecoveryPruningConfig
    config: ZeroRecoveryPruningConfig

    def plan(self, model: nn.Module, data: Data | None = None, context: RunContext | None = None) -> Plan:
        adapter = adapter_for(model)
        groups = MODULE_SETS[self.config.module_set]
        if self.config.remove is not None:
            remove = {str(k): {g: sorted(set(v)) for g, v in m.items()} for k, m in self.config.remove.items()}
            for layer, m in remove.items():
                for g, units in m.items():
                    if g not in groups:
                        raise ConfigError(f"zero-recovery-prune: group {g!r} is not in module set "
                                          f"{self.config.module_set!r} ({', '.join(groups)})")
                    check_indices([int(layer)], adapter.num_layers, "zero-recovery-prune: layers")
                    check_indices(units, group_width(adapter, int(layer), g), f"{g} of layer {layer}")
            return {"module_set": self.config.module_set, "remove": remove}
        objective = gold_logit_objective if self.config.objective == "gold-logit" else loss_objective
        scores = module_scores(model, self.config.module_set, data, kind=self.config.importance,
                               objective=objective, max_batches=self.config.max_batches, seed=self.config.seed)
        remove = lowest_module_units(scores, float(self.config.ratio), min_keep=self.config.min_keep)
        return {"module_set": self.config.module_set, "remove": remove}

    def apply(self, model: nn.Module, plan: Plan) -> list[LayerChange]:
        adapter = adapter_for(model)
        remove = plan.get("remove")
        if not isinstance(remove, Mapping):
            raise ConfigError("zero-recovery-prune: plan has no 'remove' map")
        changes: list[LayerChange] = []
        for layer in sorted(remove, key=int):
            check_indices([int(layer)], adapter.num_layers, "zero-recovery-prune: layers")
            changes += prune_layer_groups(adapter, int(layer), remove[layer])
        return changes

