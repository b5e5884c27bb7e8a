"""``top1-prune``: keep the most-used experts of every Expert Attention layer (SHRP, §3.3).

The plan counts, per layer, how often each expert is the router's argmax over calibration data
(or reads the usage counts persisted in the layers when no data is given) and keeps the ``keep``
most-used ones. With ``keep=1`` the router is deleted and the layer becomes a static single-head
layer; for every input the routed layer sent to the kept expert, the output is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from pydantic import Field
from torch import nn

from surgery.anatomy.slicing import check_indices
from surgery.core.errors import DataError, PlanError
from surgery.core.report import LayerChange
from surgery.core.run import RunContext
from surgery.core.strategy import Data, Plan, Strategy, StrategyConfig
from surgery.strategies.shrp.expert_attention import ExpertAttentionLayer, expert_layers


class Top1PruningConfig(StrategyConfig):
    """Settings of ``top1-prune``.

    Example:
        >>> Top1PruningConfig().keep
        1
    """

    keep: int = Field(default=1, ge=1, description="experts kept per layer (1: static single-head layer)")
    max_batches: int | None = Field(default=None, ge=1, description="calibration batches read (default: all)")


def routing_calibration_batches(data: Data | Any, who: str) -> Iterable[Mapping[str, Any]]:
    """Model-input batches for calibration: a TaskData's eval split (train if none), or an iterable of batches."""
    from surgery.data.task_data import TaskData

    if isinstance(data, TaskData):
        return data.loader("eval" if data.eval is not None else "train")
    if isinstance(data, (str, bytes, Mapping)) or not isinstance(data, Iterable):
        kind = type(data).__name__
        raise DataError(f"{who}: data must be TaskData or an iterable of model-input batches, got {kind}")
    return data


@torch.no_grad()
def count_usage(model: nn.Module, data: Data | Any, *, max_batches: int | None = None, who: str = "top1-prune",
                progress: Any = None) -> dict[int, list[int]]:
    """How often each expert of each routed layer is the argmax over ``data`` (the model is left unchanged)."""
    layers = [(i, m) for i, m in expert_layers(model) if m.routed]
    counts = {i: torch.zeros(m.num_experts, dtype=torch.long) for i, m in layers}
    was_training = model.training
    tracking = {i: m.track_usage for i, m in layers}
    model.eval()
    device = next(model.parameters()).device
    try:
        for _, m in layers:
            m.track_usage = False
        batches = routing_calibration_batches(data, who)
        total = len(batches) if hasattr(batches, "__len__") else None
        for n, batch in enumerate(batches):
            if max_batches is not None and n >= max_batches:
                break
            if not isinstance(batch, Mapping) or "input_ids" not in batch:
                raise DataError(f"{who}: each data batch must be a dict with 'input_ids' (and 'attention_mask')")
            inputs = {k: v.to(device) for k, v in batch.items() if k != "labels" and torch.is_tensor(v)}
            model(**inputs)
            for i, m in layers:
                counts[i] += torch.bincount(m.last_choice.cpu(), minlength=m.num_experts)
            if progress is not None:
                progress("calibration", n + 1, total)
    finally:
        for i, m in layers:
            m.track_usage = tracking[i]
        model.train(was_training)
    return {i: c.tolist() for i, c in counts.items()}


class Top1PruningStrategy(Strategy):
    """Keep the ``keep`` most-used experts of every routed Expert Attention layer.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model, tiny_inputs
        >>> from surgery.strategies import ExpertAttentionStrategy
        >>> import surgery
        >>> spec = TinySpec("bert")
        >>> model = tiny_model(spec)
        >>> _ = surgery.convert(model, ExpertAttentionStrategy(layers=[1]))
        >>> report = surgery.convert(model, Top1PruningStrategy(keep=1), data=[tiny_inputs(spec)])
        >>> surgery.inspect(model).layers[1].kind
        'single-head'
    """

    name = "top1-prune"
    config_class = Top1PruningConfig
    requires = "batches"  # calibration; without data the usage counted during training is used
    config: Top1PruningConfig

    def plan(self, model: nn.Module, data: Data | None = None, context: RunContext | None = None) -> Plan:
        context = context or RunContext()
        layers = {i: m for i, m in expert_layers(model) if m.routed}
        if not layers:
            raise PlanError(f"{self.name}: the model has no routed Expert Attention layer; run expert-attention first")
        if data is not None:
            usage = count_usage(model, data, max_batches=self.config.max_batches, who=self.name,
                                progress=lambda t, c, n: context.emit(t, c, n))
            source = "calibration"
        else:
            usage = {i: m.usage.tolist() for i, m in layers.items()}
            if not any(sum(u) for u in usage.values()):
                raise DataError(f"{self.name}: no usage counts are recorded in the model; pass calibration data "
                                "(--eval-data or --data)")
            source = "recorded"
        keep = {}
        for i, counts in usage.items():
            k = min(self.config.keep, len(counts))
            # Most used first; ties go to the lower expert index, so the plan is deterministic.
            ranked = sorted(range(len(counts)), key=lambda e: (-counts[e], e))[:k]
            keep[str(i)] = sorted(ranked)
        context.metrics["usage"] = {str(i): u for i, u in usage.items()}
        context.metrics["usage_source"] = source
        context.metrics["kept"] = keep
        total = {str(i): sum(u) for i, u in usage.items()}
        context.metrics["coverage"] = {i: (sum(usage[int(i)][e] for e in keep[i]) / total[i] if total[i] else None)
                                    for i in keep}
        return {"keep": keep, "usage": {str(i): u for i, u in usage.items()}}

    def apply(self, model: nn.Module, plan: Plan) -> list[LayerChange]:
        layers = dict(expert_layers(model))
        changes = []
        for key, kept in sorted(plan["keep"].items(), key=lambda kv: int(kv[0])):
            i = int(key)
            layer = layers.get(i)
            if layer is None or not layer.routed:
                raise PlanError(f"{self.name}: layer {i} is not a routed Expert Attention layer")
            kept = check_indices(kept, layer.num_experts, f"{self.name}: experts of layer {i}")
            if not kept:
                raise PlanError(f"{self.name}: layer {i}: keep at least one expert")
            before = layer.num_experts
            keep_experts_(layer, kept)
            changes.append(LayerChange(layer=i, component="experts", before=before, after=len(kept),
                                       note="static single-head layer" if not layer.routed else "router sliced"))
        return changes


@torch.no_grad()
def keep_experts_(layer: ExpertAttentionLayer, kept: list[int]) -> None:
    """Keep only experts ``kept`` of ``layer`` in place; with one left, delete the router."""
    idx = torch.as_tensor(kept, dtype=torch.long, device=layer.qkv_weight.device)
    grad = layer.qkv_weight.requires_grad
    layer.qkv_weight = nn.Parameter(layer.qkv_weight.index_select(0, idx).clone(), requires_grad=grad)
    layer.qkv_bias = nn.Parameter(layer.qkv_bias.index_select(0, idx).clone(), requires_grad=grad)
    layer.head_index = layer.head_index.index_select(0, idx)
    layer.usage = layer.usage.index_select(0, idx)
    layer.allowed = layer.allowed.index_select(0, idx)
    if not bool(layer.allowed.any()):  # a replayed plan kept only masked experts: let the router use them
        layer.allowed.fill_(True)
    layer.num_allowed = int(layer.allowed.sum())
    if len(kept) == 1:
        layer.router = None
        layer.last_probs = layer.last_choice = None
    else:
        from surgery.anatomy.slicing import keep_linear_outputs_

        keep_linear_outputs_(layer.router, kept)
