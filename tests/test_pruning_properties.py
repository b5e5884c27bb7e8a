"""Properties of head and FFN-neuron removal, for all eight families (hypothesis over tiny models).

* keeping everything changes nothing (state dict and outputs identical);
* removing heads (or neurons) equals the unpruned model with the same heads (neurons) zeroed at
  the input of the output (down) projection, within 1e-5, also when heads go in two steps;
* shapes, the anatomy's numbers and the report stay consistent, and the parameter count drops by
  exactly the per-unit cost derived by hand for each family;
* invalid configs and plans are rejected with the right error class, leaving the model untouched.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import surgery
from surgery.anatomy import adapter_for
from surgery.anatomy.slicing import complement
from surgery.scoring.selection import count_for_ratio
from surgery.strategies import FFNPruningStrategy, HeadPruningStrategy
from surgery.testing import FAMILIES, TinySpec, main_output, removal_maps, tiny_inputs, tiny_model, tiny_specs

ATOL = 1e-5


def unit_costs(spec: TinySpec) -> tuple[int, int]:
    """Parameters of one attention head and of one FFN neuron, derived by hand per family.

    A head owns ``head_dim`` rows (weights and bias) of q, k and v, and ``head_dim`` input columns of
    the output projection (whose bias stays). A neuron owns one row of the up-projection (two for
    ModernBERT's GeGLU, whose ``Wi`` holds both halves) and one column of the down-projection.
    ModernBERT has no attention or MLP biases by default. MPNet's shared relative-bias table and
    DeBERTa's shared relative embeddings are not per head, so they stay.
    """
    d, hd = spec.hidden, spec.head_dim
    bias = 0 if spec.family == "modernbert" else 1
    head = 3 * (d * hd + hd * bias) + hd * d
    neuron = (2 if spec.family == "modernbert" else 1) * (d + bias) + d
    return head, neuron


def masked_reference(model: nn.Module, heads: dict[int, list[int]], neurons: dict[int, list[int]]) -> nn.Module:
    """A copy of the unpruned ``model`` with the given heads and neurons zeroed, not removed."""
    model = copy.deepcopy(model)
    adapter = adapter_for(model)
    with torch.no_grad():
        for layer, units in heads.items():
            output, columns = adapter.head_output_columns(layer, units)
            output.weight[:, columns] = 0
        for layer, units in neurons.items():
            adapter.layer(layer).ffn.down.weight[:, units] = 0
    return model


def assert_close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    assert torch.allclose(a, b, atol=ATOL, rtol=0), f"max difference {(a - b).abs().max().item():.3e}"


def assert_anatomy(model: nn.Module, spec: TinySpec, heads: list[int], widths: list[int]) -> None:
    """Module shapes, ``surgery.inspect`` and the parameter count agree with the expected sizes."""
    adapter = adapter_for(model)
    anatomy = surgery.inspect(model)
    assert [layer.heads for layer in anatomy.layers] == heads
    assert [layer.head_dim for layer in anatomy.layers] == [spec.head_dim] * spec.layers
    assert [layer.ffn_width for layer in anatomy.layers] == widths
    assert anatomy.hidden_size == spec.hidden and anatomy.num_layers == spec.layers
    assert anatomy.params == surgery.count_params(model)
    assert anatomy.params.total == sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    for i, parts in enumerate(adapter.layer(j) for j in range(spec.layers)):
        att, ffn = parts.attention, parts.ffn
        width = heads[i] * spec.head_dim
        if att.qkv is not None:
            assert att.qkv.weight.shape == (3 * width, spec.hidden)
        for proj in (att.query, att.key, att.value, *att.per_head_rows):
            if proj is not None:
                assert proj.weight.shape == (width, spec.hidden)
                assert proj.bias is None or proj.bias.shape == (width,)
        assert att.output.weight.shape == (spec.hidden, width) and att.output.in_features == width
        assert ffn.up.weight.shape == ((2 if ffn.gated else 1) * widths[i], spec.hidden)
        assert ffn.down.weight.shape == (spec.hidden, widths[i]) and ffn.width == widths[i]
        assert anatomy.layers[i].params == sum(p.numel() for p in parts.module.parameters())


def family_specs(family: str, **kw: object):
    return tiny_specs(families=(family,), **kw)


# -- keep-all ---------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_keep_all_changes_nothing(family: str, data: st.DataObject) -> None:
    spec = data.draw(family_specs(family, tasks=("base", "seq-cls", "mlm")))
    model, inputs = tiny_model(spec), tiny_inputs(spec)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        expected = main_output(model, inputs)
    no_op = data.draw(st.sampled_from([
        HeadPruningStrategy(heads={}),
        HeadPruningStrategy(heads={i: [] for i in range(spec.layers)}),
        HeadPruningStrategy(ratio=0.0),
        FFNPruningStrategy(neurons={}),
        FFNPruningStrategy(ratio=0.0, importance="random"),
    ]))
    report = surgery.convert(model, no_op)
    assert report.changes == [] and report.params_after == report.params_before
    adapter = adapter_for(model)
    for i in range(spec.layers):  # keeping every unit explicitly is also a no-op
        adapter.keep_heads(i, range(spec.heads))
        adapter.keep_neurons(i, range(spec.ffn))
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(before[k].shape == after[k].shape and torch.equal(before[k], after[k]) for k in before)
    with torch.no_grad():
        assert torch.equal(main_output(model, inputs), expected)


# -- removal equals masking -------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_head_removal_equals_masking(family: str, data: st.DataObject) -> None:
    spec = data.draw(family_specs(family))
    first = data.draw(removal_maps(spec, spec.heads), label="first")
    # A second step indexes the heads that are left, with at least one kept per layer.
    left = {i: complement(first[i], spec.heads) for i in range(spec.layers)}
    second = {i: data.draw(st.lists(st.integers(0, len(left[i]) - 1), unique=True, max_size=len(left[i]) - 1)
                           .map(sorted), label=f"second[{i}]") for i in range(spec.layers)}
    removed = {i: sorted(first[i] + [left[i][j] for j in second[i]]) for i in range(spec.layers)}

    model, inputs = tiny_model(spec), tiny_inputs(spec)
    reference = masked_reference(model, removed, {})
    head_cost, _ = unit_costs(spec)
    for step in (first, second):
        report = surgery.convert(model, HeadPruningStrategy(heads=step))
        counted = sum(len(units) for units in step.values())
        assert report.params_before.total - report.params_after.total == counted * head_cost
        assert report.params_before.without_embeddings - report.params_after.without_embeddings == counted * head_cost
        assert [(c.layer, c.before - c.after) for c in report.changes] == [(i, len(u)) for i, u in step.items() if u]

    with torch.no_grad():
        assert_close(main_output(model, inputs), main_output(reference, inputs))
    assert_anatomy(model, spec, [spec.heads - len(removed[i]) for i in range(spec.layers)], [spec.ffn] * spec.layers)
    assert surgery.count_params(reference).total - surgery.count_params(model).total == head_cost * sum(
        map(len, removed.values()))


@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_neuron_removal_equals_masking(family: str, data: st.DataObject) -> None:
    spec = data.draw(family_specs(family))
    # A layer may lose every neuron: an FFN of width 0 still computes (its down bias only).
    neurons = data.draw(removal_maps(spec, spec.ffn, keep_one=False))
    heads = data.draw(removal_maps(spec, spec.heads))
    model, inputs = tiny_model(spec), tiny_inputs(spec)
    reference = masked_reference(model, heads, neurons)
    head_cost, neuron_cost = unit_costs(spec)

    report = surgery.convert(model, FFNPruningStrategy(neurons=neurons))
    assert report.params_before.total - report.params_after.total == neuron_cost * sum(map(len, neurons.values()))
    surgery.convert(model, HeadPruningStrategy(heads=heads))

    with torch.no_grad():
        assert_close(main_output(model, inputs), main_output(reference, inputs))
    assert_anatomy(model, spec, [spec.heads - len(heads[i]) for i in range(spec.layers)],
                   [spec.ffn - len(neurons[i]) for i in range(spec.layers)])
    expected = head_cost * sum(map(len, heads.values())) + neuron_cost * sum(map(len, neurons.values()))
    assert surgery.count_params(reference).total - surgery.count_params(model).total == expected
    assert [s.strategy for s in surgery.inspect(model).steps] == ["ffn-prune", "head-prune"]


@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_ratio_plans_respect_budget_and_mask(family: str, data: st.DataObject) -> None:
    spec = data.draw(family_specs(family))
    ratio = data.draw(st.sampled_from([0.25, 0.5, 0.75, 1.0]))
    scope = data.draw(st.sampled_from(["global", "layer"]))
    model, inputs = tiny_model(spec), tiny_inputs(spec)
    original = copy.deepcopy(model)
    head_cost, neuron_cost = unit_costs(spec)

    heads = surgery.convert(model, HeadPruningStrategy(ratio=ratio, scope=scope))
    neurons = surgery.convert(model, FFNPruningStrategy(ratio=ratio, scope=scope, importance="magnitude"))
    removed_heads = {int(k): v for k, v in heads.plan["heads"].items()}
    removed_neurons = {int(k): v for k, v in neurons.plan["neurons"].items()}
    for removed, units in ((removed_heads, spec.heads), (removed_neurons, spec.ffn)):
        count = sum(map(len, removed.values()))
        if scope == "layer":
            assert count == spec.layers * min(count_for_ratio(ratio, units), units - 1)
        else:
            assert count == min(count_for_ratio(ratio, units * spec.layers), (units - 1) * spec.layers)
        assert all(len(v) < units for v in removed.values())  # min_keep=1
    assert heads.params_before.total - neurons.params_after.total == (
        head_cost * sum(map(len, removed_heads.values())) + neuron_cost * sum(map(len, removed_neurons.values())))
    with torch.no_grad():
        assert_close(main_output(model, inputs),
                     main_output(masked_reference(original, removed_heads, removed_neurons), inputs))


# -- invalid configs and plans ----------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_invalid_plans_are_rejected_and_leave_the_model(family: str, data: st.DataObject) -> None:
    spec = data.draw(family_specs(family))
    model = tiny_model(spec)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    bad_head = data.draw(st.one_of(st.integers(spec.heads, spec.heads + 5), st.integers(-3, -1)))
    bad_layer = data.draw(st.one_of(st.integers(spec.layers, spec.layers + 3), st.integers(-2, -1)))
    last = spec.layers - 1
    with pytest.raises(surgery.PlanError, match="out of range"):
        surgery.convert(model, HeadPruningStrategy(heads={last: [0, bad_head]}))
    with pytest.raises(surgery.PlanError, match="out of range"):
        surgery.convert(model, HeadPruningStrategy(heads={bad_layer: [0]}))
    with pytest.raises(surgery.PlanError, match="out of range"):
        surgery.convert(model, FFNPruningStrategy(neurons={last: [spec.ffn + bad_head % 3]}))
    # An emptied layer is refused before any layer is cut (layer 0 is valid in this plan).
    emptied = {0: [0], last: list(range(spec.heads))} if last else {0: list(range(spec.heads))}
    with pytest.raises(surgery.PlanError, match=f"all {spec.heads} heads of layer {last}.*keep at least one head"):
        surgery.convert(model, HeadPruningStrategy(heads=emptied))
    with pytest.raises(surgery.PlanError, match="keep at least one head"):
        HeadPruningStrategy(heads={0: [0]}).apply(model, {"heads": emptied})
    with pytest.raises(surgery.PlanError, match="lists of integers"):
        HeadPruningStrategy(heads={0: [0]}).apply(model, {"heads": {"0": ["x"]}})
    with pytest.raises(surgery.ConfigError, match="no 'heads' entry"):
        HeadPruningStrategy(heads={0: [0]}).apply(model, {"neurons": {"0": [1]}})
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert surgery.inspect(model).steps == []


@pytest.mark.parametrize(
    ("cls", "settings", "match"),
    [
        (HeadPruningStrategy, {"heads": {0: [1]}, "nope": 1}, "nope: unknown field"),
        (FFNPruningStrategy, {"neurons": {0: [1]}, "neuron": {0: [1]}}, "neuron: unknown field"),
        (HeadPruningStrategy, {"heads": {0: [1]}, "ratio": 0.5}, "exactly one of 'heads'"),
        (FFNPruningStrategy, {"neurons": {0: [1]}, "ratio": 0.5}, "exactly one of 'neurons'"),
        (HeadPruningStrategy, {}, "exactly one of 'heads'"),
        (HeadPruningStrategy, {"ratio": 1.5}, "ratio: Input should be less than or equal to 1"),
        (FFNPruningStrategy, {"ratio": -0.1}, "ratio: Input should be greater than or equal to 0"),
        (FFNPruningStrategy, {"ratio": 0.5, "importance": "psychic"}, "importance: Input should be"),
        (HeadPruningStrategy, {"ratio": 0.5, "scope": "model"}, "scope: Input should be"),
        (HeadPruningStrategy, {"heads": {"zero": [1]}}, "heads.zero"),
    ],
)
def test_invalid_configs_are_rejected(cls: type, settings: dict, match: str) -> None:
    with pytest.raises(surgery.ConfigError, match=match):
        cls(**settings)
    with pytest.raises(surgery.ConfigError, match=match):
        cls(settings)  # the same through the dict form (as the CLI and a reload pass it)
