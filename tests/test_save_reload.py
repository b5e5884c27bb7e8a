"""``save_pretrained`` then ``from_pretrained`` reproduces pruned models exactly, for all eight families.

Uneven head counts and FFN widths per layer, bare and task models, explicit plans and ratio plans
chosen from data (gradient and attribution importance): the reloaded model has every state-dict
tensor equal, the same outputs, the same anatomy and the same recorded steps, and it never needs
the data again (the manifest records the explicit plan).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import surgery
from surgery.strategies import ExpertAttentionStrategy, FFNPruningStrategy, HeadPruningStrategy
from surgery.testing import FAMILIES, TinySpec, main_output, removal_maps, tiny_inputs, tiny_model, tiny_specs


def round_trip(model: nn.Module, directory: str) -> nn.Module:
    """Save ``model`` under ``directory`` and load it back without naming its class."""
    return surgery.from_pretrained(surgery.save_pretrained(model, Path(directory) / "model"))


def assert_identical(model: nn.Module, reloaded: nn.Module, spec: TinySpec) -> None:
    assert type(reloaded) is type(model) and not reloaded.training
    ours, theirs = model.state_dict(), reloaded.state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key
    inputs = tiny_inputs(spec)
    with torch.no_grad():
        assert torch.equal(main_output(model, inputs), main_output(reloaded, inputs))
    assert surgery.inspect(reloaded) == surgery.inspect(model)


def labelled_batches(spec: TinySpec, count: int = 1) -> list[dict[str, torch.Tensor]]:
    batches = []
    for seed in range(count):
        batch = tiny_inputs(spec, batch=4, seed=seed + 10)
        batch["labels"] = torch.arange(4) % 3
        batches.append(batch)
    return batches


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_uneven_heads_and_widths_round_trip(family: str, data: st.DataObject) -> None:
    spec = data.draw(tiny_specs(families=(family,), tasks=("base", "seq-cls", "mlm")))
    heads = data.draw(removal_maps(spec, spec.heads), label="heads")
    neurons = data.draw(removal_maps(spec, spec.ffn, keep_one=False), label="neurons")
    model = tiny_model(spec)
    surgery.convert(model, HeadPruningStrategy(heads=heads))
    surgery.convert(model, FFNPruningStrategy(neurons=neurons))
    with tempfile.TemporaryDirectory() as tmp:
        reloaded = round_trip(model, tmp)
        manifest = json.loads((Path(tmp) / "model" / "surgery.json").read_text())
        assert [s["strategy"] for s in manifest["steps"]] == ["head-prune", "ffn-prune"]
        assert manifest["model_class"] == type(model).__name__
        assert_identical(model, reloaded, spec)
        assert [la.heads for la in surgery.inspect(reloaded).layers] == [
            spec.heads - len(heads[i]) for i in range(spec.layers)]
        assert [la.ffn_width for la in surgery.inspect(reloaded).layers] == [
            spec.ffn - len(neurons[i]) for i in range(spec.layers)]


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_ratio_plans_from_data_round_trip(family: str, data: st.DataObject) -> None:
    spec = data.draw(tiny_specs(families=(family,), tasks=("seq-cls",)))
    ffn_importance = data.draw(st.sampled_from(["activation", "gradient", "attribution"]))
    scope = data.draw(st.sampled_from(["global", "layer"]))
    model = tiny_model(spec)
    batches = labelled_batches(spec)
    heads = surgery.convert(model, HeadPruningStrategy(ratio=0.5, scope=scope), data=batches)
    neurons = surgery.convert(model, FFNPruningStrategy(ratio=0.4, scope=scope, importance=ffn_importance),
                              data=batches)
    assert heads.metrics["importance_kind"] == "gradient"
    assert sum(map(len, heads.plan["heads"].values())) > 0 and sum(map(len, neurons.plan["neurons"].values())) > 0
    with tempfile.TemporaryDirectory() as tmp:
        reloaded = round_trip(model, tmp)  # replays the recorded explicit plans; no data needed
        steps = json.loads((Path(tmp) / "model" / "surgery.json").read_text())["steps"]
        assert steps[0]["config"]["ratio"] == 0.5 and steps[0]["plan"] == heads.plan
        assert steps[1]["config"]["importance"] == ffn_importance and steps[1]["plan"] == neurons.plan
        assert_identical(model, reloaded, spec)


@pytest.mark.parametrize("family", ["mpnet", "modernbert"])
def test_reloaded_model_prunes_further_and_round_trips_again(family: str) -> None:
    spec = TinySpec(family, heads=4, head_dim=4, layers=3, ffn=9, task="mlm")
    model = tiny_model(spec)
    surgery.convert(model, HeadPruningStrategy(heads={0: [1], 2: [0, 3]}))
    surgery.convert(model, FFNPruningStrategy(neurons={1: list(range(9))}))  # an FFN of width 0
    with tempfile.TemporaryDirectory() as tmp:
        reloaded = round_trip(model, tmp)
        surgery.convert(reloaded, HeadPruningStrategy(heads={0: [0], 2: [1]}))  # current, not original, indices
        surgery.convert(reloaded, FFNPruningStrategy(ratio=0.5, importance="magnitude"))
        again = surgery.from_pretrained(surgery.save_pretrained(reloaded, Path(tmp) / "again"))
        assert_identical(reloaded, again, spec)
        assert [la.heads for la in surgery.inspect(again).layers] == [2, 4, 1]
        assert [s.strategy for s in surgery.inspect(again).steps] == [
            "head-prune", "ffn-prune", "head-prune", "ffn-prune"]


def test_edited_manifest_is_a_one_line_shape_error() -> None:
    spec = TinySpec("deberta-v2", heads=4, head_dim=4, layers=2, ffn=9, task="seq-cls")
    model = tiny_model(spec)
    surgery.convert(model, HeadPruningStrategy(heads={1: [0, 3]}))
    with tempfile.TemporaryDirectory() as tmp:
        out = surgery.save_pretrained(model, Path(tmp) / "model")
        manifest = json.loads((out / "surgery.json").read_text())
        manifest["steps"][0]["plan"]["heads"] = {"1": [0]}
        (out / "surgery.json").write_text(json.dumps(manifest))
        with pytest.raises(surgery.ModelLoadError, match=r"has shape .* in the file but .* in the rebuilt model") as e:
            surgery.from_pretrained(out)
        assert "\n" not in str(e.value)


DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data(), dtype=st.sampled_from(DTYPES))
def test_dtype_is_kept_on_reload_and_can_be_overridden(family: str, data: st.DataObject, dtype: torch.dtype) -> None:
    spec = data.draw(tiny_specs(families=(family,), tasks=("base", "seq-cls")))
    heads = data.draw(removal_maps(spec, spec.heads), label="heads")
    model = tiny_model(spec)
    surgery.convert(model, ExpertAttentionStrategy(layers=[spec.layers - 1]))  # modules created at replay time
    surgery.convert(model, HeadPruningStrategy(heads={k: v for k, v in heads.items() if k != spec.layers - 1}))
    model.to(dtype)
    with tempfile.TemporaryDirectory() as tmp:
        reloaded = round_trip(model, tmp)
        assert json.loads((Path(tmp) / "model" / "surgery.json").read_text())["dtype"] == str(dtype)[6:]
        assert {p.dtype for p in reloaded.parameters()} == {dtype}
        assert_identical(model, reloaded, spec)  # every tensor equal (dtype included), outputs equal
        wider = surgery.from_pretrained(Path(tmp) / "model", dtype=torch.float64)
        assert {p.dtype for p in wider.parameters()} == {torch.float64}
        assert all(torch.equal(a.double(), b) for a, b in zip(model.parameters(), wider.parameters(), strict=True))
