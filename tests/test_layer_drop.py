"""Properties of ``layer-drop`` on all eight families (hypothesis over tiny models).

* the model keeps valid dimensions: the kept layers are the original modules, in order;
* its output equals the unpruned model's with the dropped layers skipped (an identity layer in
  their place, returning what the family's encoder expects), within 1e-5;
* the parameter count drops by exactly the dropped layers' parameters;
* save and reload (replaying the plan on the original config) gives identical weights and outputs;
* the rules pick the documented layers, and bad plans are refused with the model untouched.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import surgery
from surgery.anatomy import EncoderAdapter, adapter_for
from surgery.strategies import LayerDropStrategy
from surgery.strategies.pruning.layer_drop import layers_to_drop
from surgery.testing import FAMILIES, TinySpec, main_output, tiny_inputs, tiny_model, tiny_specs

ATOL = 1e-5


class SkipLayer(nn.Module):
    """A layer that hands its input straight back, in the form the family's encoder expects."""

    def __init__(self, adapter: EncoderAdapter, original: nn.Module) -> None:
        super().__init__()
        convention = adapter.calling_convention(original)
        self.parse_call, self.shape_result = convention.parse, convention.result
        for name, value in convention.attributes.items():
            setattr(self, name, value)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        call = self.parse_call(args, kwargs)
        return self.shape_result(call.hidden, call)


def skipping_reference(model: nn.Module, drop: list[int]) -> nn.Module:
    reference = copy.deepcopy(model)
    adapter = adapter_for(reference)
    layers = adapter.layers()
    for i in drop:
        layers[i] = SkipLayer(adapter, layers[i])
    return reference


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=10)  # per family; the suite's time budget is shared with the other property tests
@given(data=st.data())
def test_dropping_layers_equals_skipping_them(family: str, data: st.DataObject) -> None:
    spec = data.draw(tiny_specs(families=(family,)).filter(lambda s: s.layers > 1))
    drop = data.draw(st.lists(st.integers(0, spec.layers - 1), unique=True, min_size=1, max_size=spec.layers - 1)
                     .map(sorted), label="drop")
    model, inputs = tiny_model(spec), tiny_inputs(spec)
    originals = list(adapter_for(model).layers())
    reference = skipping_reference(model, drop)
    dropped_params = sum(sum(p.numel() for p in originals[i].parameters()) for i in drop)

    report = surgery.convert(model, LayerDropStrategy(layers=drop))
    kept = [m for i, m in enumerate(originals) if i not in drop]
    assert list(adapter_for(model).layers()) == kept  # the same modules, in order
    anatomy = surgery.inspect(model)
    assert anatomy.num_layers == spec.layers - len(drop)
    assert anatomy.params.total == sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert report.params_before.total - report.params_after.total == dropped_params
    assert [(c.layer, c.before, c.after) for c in report.changes] == [
        (i, sum(p.numel() for p in originals[i].parameters()), 0) for i in drop]
    with torch.no_grad():
        got, expected = main_output(model, inputs), main_output(reference, inputs)
        hidden = model(**inputs, output_hidden_states=True).hidden_states
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=ATOL, rtol=0), f"max difference {(got - expected).abs().max():.3e}"
    assert len(hidden) == spec.layers - len(drop) + 1


@pytest.mark.parametrize("family", FAMILIES)
def test_save_and_reload_replays_the_drop(family: str, tmp_path: Path) -> None:
    spec = TinySpec(family, layers=4, task="seq-cls")
    model, inputs = tiny_model(spec), tiny_inputs(spec)
    surgery.convert(model, LayerDropStrategy(count=2, rule="keep-ends"))
    surgery.convert(model, LayerDropStrategy(layers=[0]))  # a second drop indexes the layers that are left
    out = surgery.save_pretrained(model, tmp_path / "m")
    reloaded = surgery.from_pretrained(out)
    assert surgery.inspect(reloaded).num_layers == 1
    assert [s.strategy for s in surgery.inspect(reloaded).steps] == ["layer-drop", "layer-drop"]
    mine, theirs = model.state_dict(), reloaded.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    with torch.no_grad():
        assert torch.equal(main_output(model, inputs), main_output(reloaded, inputs))


@pytest.mark.parametrize("n", range(1, 13))
def test_rules_drop_count_distinct_layers(n: int) -> None:
    for rule in ("every-other", "keep-ends", "top", "bottom"):
        for count in range(n):
            drop = layers_to_drop(n, count, rule)
            assert len(drop) == count and drop == sorted(set(drop)) and all(0 <= i < n for i in drop)
    assert layers_to_drop(12, 6, "every-other") == [1, 3, 5, 7, 9, 11]  # the sentence-transformers recipe
    assert layers_to_drop(6, 3, "keep-ends") == [2, 3, 4] and layers_to_drop(6, 3, "bottom") == [0, 1, 2]


def test_bad_plans_and_configs_are_refused() -> None:
    model = tiny_model(TinySpec("bert", layers=3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(surgery.PlanError, match="keep at least one layer"):
        surgery.convert(model, LayerDropStrategy(layers=[0, 1, 2]))
    with pytest.raises(surgery.PlanError, match="keep at least one"):
        surgery.convert(model, LayerDropStrategy(count=3))
    with pytest.raises(surgery.PlanError, match="out of range"):
        surgery.convert(model, LayerDropStrategy(layers=[3]))
    with pytest.raises(surgery.PlanError, match="list of integer layer indices"):
        LayerDropStrategy(count=1).apply(model, {"drop": ["1"]})
    with pytest.raises(surgery.ConfigError, match="exactly one of 'layers'"):
        LayerDropStrategy(layers=[1], count=1)
    with pytest.raises(surgery.ConfigError, match="rule: Input should be"):
        LayerDropStrategy(count=1, rule="middle")
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    conv = tiny_model(TinySpec("deberta-v2", layers=2), conv_kernel_size=3)
    with pytest.raises(surgery.PlanError, match="convolution after layer 0"):
        surgery.convert(conv, LayerDropStrategy(layers=[0]))
