"""``zero-recovery-prune``: structured pruning of the paper's module sets (DoE §4.5, §5.4, App. A).

Units per layer, by group:

* ``neurons``: FFN intermediate neurons, removed physically (``adapter.keep_neurons``: up rows,
  down columns, both GeGLU halves), so layers end up with uneven widths;
* ``qk``: output dimensions of the query and key projections, pruned *together* (the attention
  score is a sum over these dimensions, so a dimension is only removed from both);
* ``v``: output dimensions of the value projection;
* ``o``: output dimensions of the attention output projection (they feed the residual stream).

For ``qk``, ``v`` and ``o`` the Linear is replaced by a :class:`~surgery.ops.ZeroRecoveryLinear`: it
computes only the kept outputs and scatters them into zeros of full width, so the head reshape
and the residual addition see the shapes they expect (exactly like masking those rows). Module
sets: ``ffn`` = neurons; ``attention`` = qk, v, o; ``dense`` = o, neurons; ``all`` = all four.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from surgery.anatomy import EncoderAdapter, adapter_for
from surgery.errors import ConfigError, PlanError
from surgery.importance import gold_logit_objective, linear_input_scores, loss_objective
from surgery.ops import ZeroRecoveryLinear, check_indices, complement, replace_module
from surgery.report import LayerChange
from surgery.selection import lowest_units
from surgery.strategy import Data, Plan, Strategy, StrategyConfig

ModuleSet = Literal["ffn", "attention", "dense", "all"]
Group = Literal["qk", "v", "o", "neurons"]
MODULE_SETS: dict[str, tuple[str, ...]] = {
    "ffn": ("neurons",),
    "attention": ("qk", "v", "o"),
    "dense": ("o", "neurons"),
    "all": ("qk", "v", "o", "neurons"),
}
ImportanceKind = Literal["attribution", "activation", "gradient", "random"]


def _proj(attention: Any, part: str) -> tuple[nn.Module, int]:
    """The Linear computing ``part`` ("q", "k", "v") and the row offset of that part in it."""
    if attention.qkv is not None:
        width = attention.num_heads * attention.head_dim
        return attention.qkv, {"q": 0, "k": 1, "v": 2}[part] * width
    return {"q": attention.query, "k": attention.key, "v": attention.value}[part], 0


def group_width(adapter: EncoderAdapter, layer: int, group: str) -> int:
    """Number of units of ``group`` in ``layer``."""
    parts = adapter.layer(layer)
    if group == "neurons":
        if parts.ffn is None:
            raise PlanError(f"layer {layer} has no standard FFN to prune")
        return parts.ffn.width
    if parts.attention is None:
        raise PlanError(f"layer {layer} has no standard attention to prune")
    if group == "o":
        return parts.attention.output.out_features
    return parts.attention.num_heads * parts.attention.head_dim


def module_scores(
    model: nn.Module,
    module_set: str,
    data: Data | None,
    *,
    kind: ImportanceKind = "attribution",
    objective: Callable[[Any, Mapping[str, torch.Tensor]], torch.Tensor] = gold_logit_objective,
    max_batches: int | None = None,
    seed: int = 0,
    forward: Callable[[nn.Module, Mapping[str, torch.Tensor]], Any] | None = None,
    token_mask: Callable[[Mapping[str, torch.Tensor]], torch.Tensor | None] | None = None,
) -> dict[tuple[int, str], torch.Tensor]:
    """Importance of every unit of ``module_set``, keyed by ``(layer, group)``; higher = keep.

    FFN neurons are scored on the input of the down-projection (DoE's h), the other groups on
    the output of their projection; ``qk`` adds the query and key scores of each dimension.
    All linears are scored in one pass over ``data`` (one backward per batch).

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
    inputs: dict[Any, nn.Module] = {}
    outputs: dict[Any, nn.Module] = {}
    for i in range(adapter.num_layers):
        parts = adapter.layer(i)
        for g in groups:
            if g == "neurons":
                inputs[(i, g)] = parts.ffn.down
            elif parts.attention is None:
                raise PlanError(f"layer {i} has no standard attention to prune")
            elif g == "o":
                outputs[(i, "o")] = parts.attention.output
            elif parts.attention.qkv is not None:
                outputs[(i, "qkv")] = parts.attention.qkv
            else:
                for p in ("q", "k") if g == "qk" else ("v",):
                    outputs[(i, p)] = _proj(parts.attention, p)[0]
    data = list(data)  # two passes below must see the same batches
    common = dict(kind=kind, objective=objective, max_batches=max_batches, forward=forward, token_mask=token_mask)
    raw: dict[Any, torch.Tensor] = {}
    if inputs:
        raw.update(linear_input_scores(model, inputs, data, **common))
    if outputs:
        raw.update(linear_input_scores(model, outputs, data, side="output", **common))
    scores: dict[tuple[int, str], torch.Tensor] = {}
    for i in range(adapter.num_layers):
        for g in groups:
            if g in ("neurons", "o"):
                scores[(i, g)] = raw[(i, g)]
            elif (i, "qkv") in raw:
                q, k, v = raw[(i, "qkv")].chunk(3)
                scores[(i, g)] = q + k if g == "qk" else v
            else:
                scores[(i, g)] = raw[(i, "q")] + raw[(i, "k")] if g == "qk" else raw[(i, "v")]
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


def _zero_recover(layer_module: nn.Module, linear: nn.Module, kept: list[int]) -> None:
    if isinstance(linear, ZeroRecoveryLinear):
        raise PlanError("a projection is already zero-recovered; prune each module set once, on the full model")
    if len(kept) == linear.out_features:
        return  # keep-all stays a plain Linear: exactly the identity
    replace_module(layer_module, linear, ZeroRecoveryLinear.from_linear(linear, kept))


def prune_layer_groups(adapter: EncoderAdapter, layer: int, removal: Mapping[str, list[int]]) -> list[LayerChange]:
    """Carry out one layer's removal map (group -> unit indices) in place."""
    changes = []
    parts = adapter.layer(layer)
    for group in ("qk", "v", "o", "neurons"):
        if group not in removal:
            continue
        width = group_width(adapter, layer, group)
        remove = check_indices(removal[group], width, f"zero-recovery-prune: {group} of layer {layer}")
        kept = complement(remove, width)
        if group == "neurons":
            adapter.keep_neurons(layer, kept)
        elif group == "o":
            _zero_recover(parts.module, parts.attention.output, kept)
        elif parts.attention.qkv is not None:
            # One fused Linear: collect the kept rows of every pruned part, then replace it once.
            continue
        else:
            for p in ("q", "k") if group == "qk" else ("v",):
                _zero_recover(parts.module, _proj(parts.attention, p)[0], kept)
        changes.append(LayerChange(layer=layer, component=group, before=width, after=len(kept)))
    if parts.attention is not None and parts.attention.qkv is not None and ({"qk", "v"} & set(removal)):
        width = group_width(adapter, layer, "qk")
        rows: list[int] = []
        for part in ("q", "k", "v"):
            group = "v" if part == "v" else "qk"
            kept = complement(check_indices(removal.get(group, []), width, f"{group} of layer {layer}"), width)
            rows += [_proj(parts.attention, part)[1] + j for j in kept]
            if part != "k" and group in removal:
                changes.append(LayerChange(layer=layer, component=group, before=width, after=len(kept)))
        _zero_recover(parts.module, parts.attention.qkv, rows)
    return changes


class ModulePruningConfig(StrategyConfig):
    """Settings of ``zero-recovery-prune``.

    Example:
        >>> ModulePruningConfig(module_set="attention", ratio=0.3).importance
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

    @model_validator(mode="after")
    def _one_source(self) -> ModulePruningConfig:
        if (self.remove is None) == (self.ratio is None):
            raise ValueError("give exactly one of 'remove' (explicit units) or 'ratio'")
        return self


class ModulePruningStrategy(Strategy):
    """Prune a module set with zero-recovery (FFN neurons physically, attention rows zero-recovered).

    Example:
        >>> import surgery
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert"))
        >>> _ = surgery.convert(model, ModulePruningStrategy(module_set="all", ratio=0.5, importance="random"))
        >>> type(model.encoder.layer[0].attention.output.dense).__name__
        'ZeroRecoveryLinear'
    """

    name = "zero-recovery-prune"
    trained_after = True  # in DoE the condensed prompt of the accepted probe is copied in next
    config_class = ModulePruningConfig
    config: ModulePruningConfig

    def plan(self, model: nn.Module, data: Data | None = None) -> Plan:
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
