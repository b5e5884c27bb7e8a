"""Filling a path point's slack (no runtime needed): the time a cut has beyond the target given back as units."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from surgery.compress.latency_table import LatencyTable
from surgery.compress.mask_fisher import UnitCosts
from surgery.compress.removal_path import Removal, fill_slack, search_path
from surgery.compress.structure import LayerShape, Structure

START = Structure((LayerShape(4, 8), LayerShape(4, 8), LayerShape(4, 8), LayerShape(4, 8)))
TABLE = LatencyTable(runtime="openvino-int8", batch_size=1, seq_len=8, model_key="demo", base_ms=1.0,
                     overhead_ms=0.2, attention_ms={h: 0.8 * h for h in range(1, 5)},
                     ffn_ms={w: 0.1 * w for w in range(1, 9)})  # a head costs 4 neuron groups


def undo(removal: Removal, kind: str, layer: int, units: list[int]) -> Removal:
    table = dict(removal.heads if kind == "head" else removal.neurons)
    table[layer] = [u for u in table.get(layer, []) if u not in units]
    return Removal(heads=table if kind == "head" else removal.heads,
                   neurons=table if kind == "neurons" else removal.neurons, layers=removal.layers).effective()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), share=st.floats(0.3, 1.0), slack=st.floats(1.0, 1.4))
def test_a_filled_cut_keeps_the_points_layers_fits_the_time_and_leaves_no_step_that_fits(
        seed: int, share: float, slack: float) -> None:
    g = torch.Generator().manual_seed(seed)
    # Neurons cheap to lose, heads dear: the path takes neuron groups first and heads last, so filling meets
    # heads (4 groups' time each) before neuron groups and must skip a head that does not fit, not stop there;
    # a group of 2 neurons that does not fit whole may give one back.
    costs = UnitCosts("task", 8, heads={i: torch.rand(4, generator=g) for i in range(4)},
                      neurons={i: torch.rand(8, generator=g) * 0.05 for i in range(4)},
                      layers={i: float(torch.rand(1, generator=g)) * 4 for i in range(4)})
    path = search_path(costs, TABLE, START, groups=4)
    k = max(1, round(share * len(path.steps)))
    point = path.removal_at(k)
    within = TABLE.predict_ms(point.structure(START)) * slack
    filled, back = fill_slack(path, k, TABLE, within)

    assert filled.layers == point.layers  # the layers the point removed stay removed
    for kind in ("heads", "neurons"):  # only units the point removed come back
        for layer, units in getattr(filled, kind).items():
            assert set(units) <= set(getattr(point, kind).get(layer, []))
    assert TABLE.predict_ms(filled.structure(START)) <= within + 1e-9
    assert filled.units() == point.units() - sum(map(len, back.values()))
    for j, units in back.items():  # a step gives back its costliest units: the end of its removal order
        taken = path.steps[j - 1].units[0]
        assert units == taken[len(taken) - len(units):]
    # Nothing left that would fit: the next unit of every head or neuron step of a kept layer costs more than the
    # time left (one more head, or the step's next costliest neuron).
    for j in range(1, k + 1):
        step = path.steps[j - 1]
        if step.kind not in ("head", "neurons") or step.layers[0] in point.layers:
            continue
        taken, given = step.units[0], back.get(j, [])
        if len(given) == len(taken):
            continue
        more = undo(filled, step.kind, step.layers[0], [taken[len(taken) - len(given) - 1]])
        assert TABLE.predict_ms(more.structure(START)) > within


def test_no_time_beyond_the_point_gives_its_own_cut_back() -> None:
    costs = UnitCosts("task", 8, heads={i: torch.full((4,), 0.01 * (i + 1)) for i in range(4)},
                      neurons={i: torch.full((8,), 0.001 * (i + 1)) for i in range(4)},
                      layers={0: 0.5, 1: 0.3, 2: 0.2, 3: 0.4})
    path = search_path(costs, TABLE, START, groups=4)
    k = len(path.steps) // 2
    filled, back = fill_slack(path, k, TABLE, TABLE.predict_ms(path.structure_at(k)))
    assert back == {} and filled == path.removal_at(k)
