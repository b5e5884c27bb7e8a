"""The search: remove, one at a time, the structure that costs the least objective per millisecond saved.

ZipLM (Kurtic et al., NeurIPS 2023) removes at each step the structure with the worst trade-off of
loss against saved runtime, timed on the target device; Kwon et al. (NeurIPS 2022) rank heads and
neurons by their mask Fisher under a latency table. This search does both with surgery's pieces:
starting from the full model, the candidates at each step are, per kept layer, its next head (the
least costly left), its next group of FFN neurons (``width / groups`` neurons, least costly first)
and the whole layer. The one with the smallest ``estimated loss increase / LatencyTable.saving_ms``
goes; the step, its estimated cumulative loss and the predicted time are recorded, so one run gives
every speed point up to the last, nested (a faster point removes a superset of a slower one's units).

The cost of a layer already thinned is what removing it adds: its measured removal cost minus the
costs of the units already taken from it (an additive model of the loss, as the diagonal Fisher is).

``uniform`` keeps every kept layer at the same shape: a step removes the next head, or the next
group of neurons, from every kept layer (the least costly of each layer's own), as the uniform cuts
this project measured do. ``stock`` keeps to what a stock transformers config can say: uniform FFN
width and whole layers; no head is removed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from surgery.compress.latency_table import LatencyTable
from surgery.compress.mask_fisher import UnitCosts
from surgery.compress.structure import LayerShape, Structure
from surgery.core.errors import ConfigError
from surgery.runtimes.shared.weight_products import split_group

StepKind = Literal["head", "neurons", "layer", "uniform-neurons", "uniform-heads"]


class Removal(BaseModel):
    """What to cut from the starting model: heads and neurons per layer (indices of that model), whole layers.

    Example:
        >>> r = Removal(heads={0: [1]}, neurons={1: [0, 2]}, layers=[1])
        >>> r.effective().neurons, r.units()
        ({}, 2)
    """

    heads: dict[int, list[int]] = Field(default_factory=dict)
    neurons: dict[int, list[int]] = Field(default_factory=dict)
    layers: list[int] = Field(default_factory=list)

    def effective(self) -> Removal:
        """The same cut without units of removed layers (they go with their layer)."""
        gone = set(self.layers)
        return Removal(heads={k: sorted(v) for k, v in sorted(self.heads.items()) if v and k not in gone},
                       neurons={k: sorted(v) for k, v in sorted(self.neurons.items()) if v and k not in gone},
                       layers=sorted(gone))

    def layers_only(self) -> bool:
        """Whether the cut removes whole layers and nothing inside the layers it keeps (nothing to refit).

        Example:
            >>> Removal(layers=[1], heads={1: [0]}).layers_only(), Removal(layers=[1], heads={0: [0]}).layers_only()
            (True, False)
        """
        e = self.effective()
        return bool(e.layers) and not e.heads and not e.neurons

    def units(self) -> int:
        """Heads plus neurons removed from kept layers, plus one per removed layer (a size for comparisons)."""
        e = self.effective()
        return sum(map(len, e.heads.values())) + sum(map(len, e.neurons.values())) + len(e.layers)

    def structure(self, start: Structure) -> Structure:
        """The structure the starting model has after this cut.

        Example:
            >>> Removal(heads={0: [1]}, layers=[1]).structure(Structure((LayerShape(4, 37), LayerShape(4, 37))))
            Structure(layers=(LayerShape(heads=3, ffn_width=37), None))
        """
        e = self.effective()
        return Structure(tuple(
            None if i in e.layers or shape is None else
            LayerShape(shape.heads - len(e.heads.get(i, [])), shape.ffn_width - len(e.neurons.get(i, [])))
            for i, shape in enumerate(start.layers)))


class PathStep(BaseModel):
    """One removal of the path and where it leaves the model."""

    kind: StepKind
    layers: list[int]
    units: list[list[int]] = Field(default_factory=list, description="per entry of layers: unit indices removed, "
                                   "least costly first")
    loss: float = Field(description="estimated objective increase of this step")
    saving_ms: float
    cumulative_loss: float
    predicted_ms: float
    predicted_speedup: float


class RemovalPath(BaseModel):
    """Every step of one search, from the full model; ``removal_at(k)`` is the cut after ``k`` steps.

    ``reference_ms`` is the time the speedups are against (the original model on the reference
    runtime, in the table's units); ``start_ms`` the predicted time of the full model on the target one.
    """

    start: list[dict[str, int] | None]
    reference_ms: float
    start_ms: float
    stock: bool = False
    layers: bool = Field(default=True, description="whether whole layers could be removed")
    uniform: bool = Field(default=False, description="every kept layer cut alike")
    group_size: dict[int, int] = Field(default_factory=dict)
    steps: list[PathStep] = Field(default_factory=list)

    def removal_at(self, k: int) -> Removal:
        """The cut after the first ``k`` steps."""
        heads: dict[int, list[int]] = {}
        neurons: dict[int, list[int]] = {}
        layers: list[int] = []
        for step in self.steps[:k]:
            for layer, units in zip(step.layers, step.units or [[]] * len(step.layers), strict=True):
                if step.kind in ("head", "uniform-heads"):
                    heads.setdefault(layer, []).extend(units)
                elif step.kind == "layer":
                    layers.append(layer)
                else:
                    neurons.setdefault(layer, []).extend(units)
        return Removal(heads=heads, neurons=neurons, layers=layers).effective()

    def structure_at(self, k: int) -> Structure:
        return self.removal_at(k).structure(Structure.from_json(self.start))

    def speedup_at(self, k: int) -> float:
        """Predicted speedup after ``k`` steps (k = 0: the full model on the target runtime)."""
        ms = self.start_ms if k == 0 else self.steps[k - 1].predicted_ms
        return self.reference_ms / ms

    def first_reaching(self, speedup: float) -> int | None:
        """The fewest steps whose predicted speedup reaches ``speedup`` (None: the path never does)."""
        return next((k for k in range(len(self.steps) + 1) if self.speedup_at(k) >= speedup), None)


@dataclass
class _Layer:
    """Search state of one layer: units in removal order and how many are gone."""

    shape: LayerShape
    head_order: list[int]
    head_cost: list[float]
    groups: list[list[int]]
    group_cost: list[float]
    removable_cost: float | None
    heads_gone: int = 0
    groups_gone: int = 0
    spent: float = 0.0
    removed: bool = False
    taken_heads: list[int] = field(default_factory=list)

    def now(self) -> LayerShape | None:
        if self.removed:
            return None
        width = self.shape.ffn_width - sum(len(g) for g in self.groups[: self.groups_gone])
        return LayerShape(self.shape.heads - self.heads_gone, width)

    def can_cut(self, unit: str, *, keep_neurons: bool = False) -> bool:
        """Whether a next head (one always stays) or neuron group (with ``keep_neurons``, one stays) is left."""
        if self.removed:
            return False
        if unit == "head":
            return self.heads_gone < len(self.head_order) - 1
        return self.groups_gone < len(self.groups) - (1 if keep_neurons else 0)

    def next_cut(self, unit: str) -> tuple[float, LayerShape, LayerShape]:
        """The cost of the next head or neuron group, the layer's shape now and without it."""
        shape = self.now()
        assert shape is not None
        if unit == "head":
            return self.head_cost[self.heads_gone], shape, LayerShape(shape.heads - 1, shape.ffn_width)
        narrower = LayerShape(shape.heads, shape.ffn_width - len(self.groups[self.groups_gone]))
        return self.group_cost[self.groups_gone], shape, narrower

    def cut(self, unit: str) -> list[int]:
        """Remove the next head or neuron group; the unit indices removed."""
        loss = self.next_cut(unit)[0]
        self.spent += loss
        if unit == "head":
            self.heads_gone += 1
            return [self.head_order[self.heads_gone - 1]]
        self.groups_gone += 1
        return list(self.groups[self.groups_gone - 1])  # in removal order: a fill gives the costliest back first


def _ascending(costs: torch.Tensor) -> tuple[list[int], list[float]]:
    order = sorted(range(len(costs)), key=lambda j: (float(costs[j]), j))  # ties: lower index first, repeatable
    return order, [float(costs[j]) for j in order]


def neuron_groups(costs: torch.Tensor, groups: int) -> list[list[int]]:
    """Neurons in removal order (least costly first), in ``groups`` chunks of ``ceil(width / groups)``.

    Example:
        >>> neuron_groups(torch.tensor([0.3, 0.1, 0.2, 0.0, 0.5]), 2)
        [[3, 1, 2], [0, 4]]
    """
    order, _ = _ascending(costs)
    size = max(1, math.ceil(len(order) / groups))
    return [order[i:i + size] for i in range(0, len(order), size)]


def search_path(costs: UnitCosts, table: LatencyTable, start: Structure, *, reference_ms: float | None = None,
                stop_speedup: float | None = None, stock: bool = False, groups: int = 16,
                layers: bool = True, uniform: bool = False, fixed_layers: Sequence[int] = ()) -> RemovalPath:
    """Greedy removal under the latency table, from ``start`` until ``stop_speedup`` or nothing is left.

    ``reference_ms`` (default: the table's time of ``start``) is the time speedups are against.
    At least one layer stays, and one head in every kept layer (a layer without heads is a layer to remove).
    ``layers=False`` removes heads and neurons only (Kwon et al.'s search space): the layer costs are
    measured one layer at a time, and a path that removes several may rely on them more than they
    deserve, so compression tries both. ``uniform=True`` cuts every kept layer alike (implied by ``stock``).
    ``stock`` also keeps an FFN width of at least one neuron group (a stock config cannot say
    ``intermediate_size: 0``, and surgery refuses such a config) and never removes ``fixed_layers``
    (:func:`surgery.compress.stock_export.stock_fixed_layers`: layers a stock config cannot drop).

    Example:
        >>> from surgery.compress.mask_fisher import UnitCosts
        >>> start = Structure((LayerShape(2, 4), LayerShape(2, 4)))
        >>> costs = UnitCosts("task", 8, heads={0: torch.tensor([1., 2.]), 1: torch.tensor([.1, .2])},
        ...                   neurons={0: torch.tensor([1., 1, 1, 1]), 1: torch.tensor([.1, .1, 5, 5])},
        ...                   layers={0: 9.0, 1: 9.0})
        >>> table = LatencyTable(runtime="torch", batch_size=1, seq_len=8, model_key="demo", base_ms=1.0,
        ...                      overhead_ms=0.1, attention_ms={2: 2.0, 1: 1.0}, ffn_ms={4: 2.0, 2: 1.0})
        >>> path = search_path(costs, table, start, stop_speedup=1.3, groups=2)
        >>> [(s.kind, s.layers) for s in path.steps], round(path.speedup_at(len(path.steps)), 3)
        ([('head', [1]), ('neurons', [1]), ('head', [0])], 1.484)
    """
    if groups < 1:
        raise ConfigError(f"compress: neuron groups per layer must be at least 1, got {groups}")
    uniform = uniform or stock
    if uniform:
        widths = {shape.ffn_width for shape in start.kept}
        if len(widths) > 1:
            raise ConfigError(f"compress: the model's FFN widths differ per layer ({sorted(widths)}); a uniform or "
                              "stock search keeps one width, so start from a model with uniform layers")
    state: list[_Layer | None] = []
    group_size: dict[int, int] = {}
    for i, shape in enumerate(start.layers):
        if shape is None:
            state.append(None)
            continue
        head_costs = costs.heads.get(i, torch.zeros(0))
        neuron_costs = costs.neurons.get(i, torch.zeros(0))
        order, head_cost = _ascending(head_costs)
        chunks = neuron_groups(neuron_costs, groups) if len(neuron_costs) else []
        group_size[i] = len(chunks[0]) if chunks else 0
        state.append(_Layer(shape=shape, head_order=order, head_cost=head_cost, groups=chunks,
                            group_cost=[float(neuron_costs[c].sum()) for c in chunks],
                            removable_cost=costs.layers.get(i) if layers else None))
    every = [s for s in state if s is not None]
    now = table.predict_ms(start)
    reference = now if reference_ms is None else reference_ms
    path = RemovalPath(start=start.to_json(), reference_ms=reference, start_ms=now, stock=stock, layers=layers,
                       uniform=uniform, group_size=group_size)
    total = 0.0
    while stop_speedup is None or reference / now < stop_speedup:
        best: tuple[tuple[float, float], StepKind, list[int]] | None = None

        def offer(kind: StepKind, where: list[int], loss: float, saving: float) -> None:
            nonlocal best
            if saving <= 1e-12:
                return  # a cut that saves no time on this runtime is never worth its loss
            key = (max(loss, 0.0) / saving, -saving)
            if best is None or key < best[0]:
                best = (key, kind, where)

        kept = [i for i, s in enumerate(state) if s is not None and not s.removed]
        layer_states = [s for s in state if s is not None and not s.removed]
        for i, s in zip(kept, layer_states, strict=True):
            if s.removable_cost is not None and len(kept) > 1 and i not in fixed_layers:
                offer("layer", [i], s.removable_cost - s.spent, table.saving_ms(s.now(), None))
            for unit, kind in (("head", "head"), ("neurons", "neurons")):
                if not uniform and s.can_cut(unit):
                    loss, shape, after = s.next_cut(unit)
                    offer(kind, [i], loss, table.saving_ms(shape, after))
        for unit, kind in (("neurons", "uniform-neurons"), ("head", "uniform-heads")):
            if uniform and (unit == "neurons" or not stock) and kept and all(s.can_cut(unit, keep_neurons=stock)
                                                                             for s in layer_states):
                cuts = [s.next_cut(unit) for s in layer_states]
                offer(kind, kept, sum(c[0] for c in cuts), sum(table.saving_ms(c[1], c[2]) for c in cuts))
        if best is None:
            break
        _, kind, where = best
        step_loss, saving, units = 0.0, 0.0, []
        for i in where:
            s = state[i]
            assert s is not None
            if kind == "layer":
                step_loss = (s.removable_cost or 0.0) - s.spent
                saving += table.saving_ms(s.now(), None)
                s.removed = True
                units.append([])
                continue
            unit = "head" if kind in ("head", "uniform-heads") else "neurons"
            loss, shape, after = s.next_cut(unit)
            step_loss += loss
            saving += table.saving_ms(shape, after)
            units.append(s.cut(unit))
        total += step_loss
        now = table.base_ms + sum(table.layer_ms(s.now()) for s in every)
        path.steps.append(PathStep(kind=kind, layers=where, units=units, loss=step_loss, saving_ms=saving,
                                   cumulative_loss=total, predicted_ms=now, predicted_speedup=reference / now))
    return path


def fill_slack(path: RemovalPath, k: int, table: LatencyTable, within_ms: float
               ) -> tuple[Removal, dict[int, list[int]]]:
    """The cut after ``k`` steps with the time it saves beyond ``within_ms`` given back as units.

    Deep in a path the steps left are whole layers, so the first point fast enough can overshoot the
    asked speed by a layer (MiniLM-L6 at ``--speedup 12``: 11.0x, then 13.7x predicted, 12.8x and 16.1x
    measured). The time between is spent on the head and neuron steps of kept layers, undone latest
    first (the greedy took them last: the most estimated loss per millisecond), each one only where
    the table keeps the model within ``within_ms``; a neuron group that does not fit whole gives back
    its costliest neurons that do (a step's neurons are in removal order, least costly first). The
    layers the path removed stay removed. Returns the filled cut and, per path step undone (1-based),
    the units it gave back (empty: nothing fits).

    Example:
        >>> table = LatencyTable(runtime="torch", batch_size=1, seq_len=8, model_key="demo", base_ms=1.0,
        ...                      overhead_ms=0.0, attention_ms={2: 2.0, 1: 1.0}, ffn_ms={4: 4.0, 2: 2.0})
        >>> start = Structure((LayerShape(2, 4), LayerShape(2, 4), LayerShape(2, 4)))
        >>> path = RemovalPath(start=start.to_json(), reference_ms=19.0, start_ms=19.0, group_size={0: 2})
        >>> for kind, layer, units in [("neurons", 0, [3, 1]), ("head", 0, [1]), ("layer", 1, [])]:
        ...     path.steps.append(PathStep(kind=kind, layers=[layer], units=[units], loss=0.0, saving_ms=0.0,
        ...                                cumulative_loss=0.0, predicted_ms=1.0, predicted_speedup=1.0))
        >>> removal, back = fill_slack(path, 3, table, within_ms=11.5)
        >>> back, removal.structure(start).to_json()[0], removal.neurons, removal.layers
        ({2: [1]}, {'heads': 2, 'ffn_width': 2}, {0: [1, 3]}, [1])
        >>> fill_slack(path, 3, table, within_ms=12.0)[1]  # a millisecond more: the costlier neuron of step 1
        {2: [1], 1: [1]}
    """
    start = Structure.from_json(path.start)
    removal = path.removal_at(k)
    back: dict[int, list[int]] = {}

    def without(kind: str, layer: int, units: Sequence[int]) -> Removal:
        given = set(units)
        table_of = dict(removal.heads if kind == "head" else removal.neurons)
        table_of[layer] = [u for u in table_of.get(layer, []) if u not in given]
        return Removal(heads=table_of if kind == "head" else removal.heads,
                       neurons=table_of if kind == "neurons" else removal.neurons, layers=removal.layers).effective()

    for j in range(k, 0, -1):
        step = path.steps[j - 1]
        if step.kind not in ("head", "neurons") or any(i in removal.layers for i in step.layers):
            continue
        (layer,), (taken,) = step.layers, step.units
        # Whole, else (neurons) the costliest m that fit. Time is monotone in width, so the largest m that fits is
        # found by bisection: a BERT-base neuron step holds 192 neurons, and trying each m from the top (a cut of
        # tens of thousands of indices built per trial) held compress for minutes at 512 tokens (session 14).
        low, high, found = (1 if step.kind == "neurons" else len(taken)), len(taken), None
        while low <= high:
            m = (low + high) // 2
            trial = without(step.kind, layer, taken[len(taken) - m:])
            if table.predict_ms(trial.structure(start)) <= within_ms:
                found, low = (m, trial), m + 1
            else:
                high = m - 1
        if found is not None:
            m, removal = found
            back[j] = list(taken[len(taken) - m:])
    return removal, back


def describe_cut(path: RemovalPath, k: int) -> dict[str, Any]:
    """A short account of the cut after ``k`` steps, for reports and ``--dry-run``."""
    structure = path.structure_at(k)
    removal = path.removal_at(k)
    return {"steps": k, "predicted_speedup": round(path.speedup_at(k), 4),
            "estimated_loss": round(path.steps[k - 1].cumulative_loss, 6) if k else 0.0,
            "structure": structure.to_json(), "removed_layers": removal.layers,
            "heads_removed": sum(map(len, removal.heads.values())),
            "neurons_removed": sum(map(len, removal.neurons.values()))}


class PrecisionChoice(BaseModel):
    """The precision pass's answer: how far along the path to cut, and which op groups to leave in float.

    ``int8_float`` names groups by the layers of the cut model (a removed layer renumbers the ones
    above it); ``bought`` lists, per group taken (by the starting model's layers), its measured loss
    gain, its cost in ms and the estimated loss of the extra cuts that pay for it; ``free`` names those
    of them taken because their part runs faster in float (:meth:`FallbackCosts.is_free`).
    """

    step: int
    int8_float: list[str] = Field(default_factory=list)
    predicted_ms: float
    bought: list[dict[str, Any]] = Field(default_factory=list)
    free: list[str] = Field(default_factory=list)


def _renumbered(group: str, removal: Removal) -> str:
    """``layer.N.part`` of the starting model as the cut model numbers its layers (removed ones gone)."""
    index, part = split_group(group)
    if index is None:
        return group
    below = sum(1 for gone in removal.effective().layers if gone < index)
    return f"layer.{index - below}.{part}"


def start_indexed(gains: dict[str, float], removal: Removal) -> dict[str, float]:
    """Per-group figures of the cut model (its layers renumbered) keyed by the starting model's layers.

    Example:
        >>> start_indexed({"layer.1.ffn-up": 0.5, "classifier": 0.1}, Removal(layers=[0]))
        {'layer.2.ffn-up': 0.5, 'classifier': 0.1}
    """
    gone = set(removal.effective().layers)
    out = {}
    for group, value in gains.items():
        kept, part = split_group(group)
        if kept is not None:
            layer = next(i for i in range(kept + len(gone) + 1) if i not in gone and
                         sum(1 for j in range(i) if j not in gone) == kept)
            group = f"layer.{layer}.{part}"
        out[group] = value
    return out


def free_fallbacks(gains: dict[str, float], costs: Any, structure: Structure) -> list[str]:
    """The groups that gained in float and were measured faster in float than in int8 at ``structure``,
    best gain first: a fallback that costs nothing (a group with no units left costs 0 and is not one).

    Example:
        >>> from surgery.compress.latency_table import FallbackCosts
        >>> costs = FallbackCosts(runtime="demo", precision="f32", per_unit_ms={"attention": -0.1, "ffn-up": 0.01})
        >>> free_fallbacks({"layer.0.attention": 0.2, "layer.1.attention": -0.1, "layer.0.ffn-up": 0.5}, costs,
        ...                Structure((LayerShape(2, 4), LayerShape(2, 4))))
        ['layer.0.attention']
    """
    return sorted((g for g, gain in gains.items() if gain > 0 and costs.is_free(g)
                   for cost in [costs.cost(g, structure)] if cost), key=lambda g: -gains[g])


def buy_fallbacks(path: RemovalPath, start_step: int, gains: dict[str, float], costs: Any, *,
                  target_speedup: float, free_only: bool = False) -> PrecisionChoice:
    """Trade float fallbacks against further cuts along ``path``, by loss per millisecond.

    A fallback is the opposite of a cut: it costs milliseconds and buys loss back. The path (all
    int8) reaches the target at ``start_step``; a fallback ``g`` with measured loss gain ``gains[g]``
    (the objective's drop on calibration batches when that group alone is float, at the model of
    ``start_step``) and cost ``costs.cost(g, structure)`` (:class:`~surgery.compress.latency_table.FallbackCosts`)
    is paid for by walking further along the path until the predicted time is back under the target.
    It is taken when its gain exceeds the estimated loss of the extra cuts it needs: exactly when
    buying it back is better per millisecond than the marginal cuts it displaces. Fallbacks are tried
    best gain per millisecond first; the slack a path point already has under the target is free.
    A fallback measured *faster* in float than in int8 (cost < 0: int8 matmuls without VNNI, or
    the quantize/dequantize around small products) costs nothing and gains loss back: it is taken
    first, and the time it gives back walks the path back to an earlier point (fewer cuts) that
    still meets the target. Groups are named by the starting model's layers in ``gains``; a group
    whose layer the extra cuts remove is skipped. ``free_only``: only the free fallbacks, at
    ``start_step`` itself (``--max-drop``: the cut is the one judged within the drop; float where it
    runs faster makes it faster still).

    Example:
        >>> from surgery.compress.latency_table import FallbackCosts
        >>> path = RemovalPath(start=[{"heads": 2, "ffn_width": 4}], reference_ms=10.0, start_ms=10.0, steps=[
        ...     PathStep(kind="neurons", layers=[0], units=[[0]], loss=0.01, saving_ms=1.0, cumulative_loss=0.01,
        ...              predicted_ms=9.0, predicted_speedup=10 / 9),
        ...     PathStep(kind="neurons", layers=[0], units=[[1]], loss=0.02, saving_ms=1.0, cumulative_loss=0.03,
        ...              predicted_ms=8.0, predicted_speedup=1.25)])
        >>> costs = FallbackCosts(runtime="demo", precision="f32", per_unit_ms={"ffn-down": 0.3, "attention": 0.5})
        >>> choice = buy_fallbacks(path, 1, {"layer.0.ffn-down": 0.05, "layer.0.attention": 0.001}, costs,
        ...                        target_speedup=10 / 9)
        >>> choice.step, choice.int8_float
        (2, ['layer.0.ffn-down'])

        Attention measured faster in float gives back a millisecond: no cut is needed any more.

        >>> faster = FallbackCosts(runtime="demo", precision="f32", per_unit_ms={"attention": -0.5})
        >>> choice = buy_fallbacks(path, 1, {"layer.0.attention": 0.001}, faster, target_speedup=10 / 9)
        >>> choice.step, choice.int8_float, choice.predicted_ms
        (0, ['layer.0.attention'], 9.0)
    """
    budget_ms = path.reference_ms / target_speedup

    def ms_at(k: int) -> float:
        return path.start_ms if k == 0 else path.steps[k - 1].predicted_ms

    def loss_at(k: int) -> float:
        return path.steps[k - 1].cumulative_loss if k else 0.0

    def spent_at(k: int, groups: list[str]) -> float | None:
        structure = path.structure_at(k)
        found = [costs.cost(g, structure) for g in groups]
        return None if any(c is None for c in found) else float(sum(found))  # type: ignore[arg-type]

    start = path.structure_at(start_step)
    step, chosen, bought = start_step, [], []
    # Free first: float measured no slower than int8 (every layer's group at once, as measured).
    if free := free_fallbacks(gains, costs, start):
        chosen = free
        bought = [{"group": g, "gain": round(gains[g], 6), "cost_ms": round(float(costs.cost(g, start)), 6),
                   "extra_cut_loss": 0.0, "steps": 0} for g in free]
        # The time they give back: the earliest point at or before the start that still meets the target.
        while not free_only and step > 0 and (back := spent_at(step - 1, chosen)) is not None and \
                ms_at(step - 1) + back <= budget_ms + 1e-12:
            step -= 1
        for row in bought:
            row["steps"] = step - start_step
    ranked = [] if free_only else sorted(
        ((gain / cost, g) for g, gain in gains.items() if gain > 0
         for cost in [costs.cost(g, start)] if cost is not None and cost > 0), reverse=True)
    for _, group in ranked:
        trial = [*chosen, group]
        for k in range(step, len(path.steps) + 1):
            spent = spent_at(k, trial)
            if spent is None:
                break  # the extra cuts remove a chosen group's layer: not this fallback
            if ms_at(k) + spent <= budget_ms + 1e-12:
                extra = loss_at(k) - loss_at(step)
                if gains[group] > extra:
                    bought.append({"group": group, "gain": round(gains[group], 6),
                                   "cost_ms": round(float(costs.cost(group, path.structure_at(k))), 6),
                                   "extra_cut_loss": round(extra, 6), "steps": k - step})
                    step, chosen = k, trial
                break
    removal = path.removal_at(step)
    spent = spent_at(step, chosen) or 0.0
    return PrecisionChoice(step=step, int8_float=sorted(_renumbered(g, removal) for g in chosen),
                           predicted_ms=ms_at(step) + spent, bought=bought, free=free)
