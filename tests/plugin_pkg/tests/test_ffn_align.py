"""Tests of ffn-align on surgery's tiny random models of every supported family.

Run them with the package installed (``pip install -e .``; reloading goes through the registry).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given

import surgery
from surgery.testing import TinySpec, main_output, tiny_inputs, tiny_model, tiny_specs

# Skipped, not failed, where the package is not installed (surgery's own suite runs this file
# explicitly, after installing the package into a temporary site directory).
surgery_ffn_align = pytest.importorskip("surgery_ffn_align")
FFNAlignStrategy = surgery_ffn_align.FFNAlignStrategy


@given(spec=tiny_specs())
def test_widths_become_multiples_and_removal_equals_masking(spec: TinySpec) -> None:
    model, reference = tiny_model(spec), tiny_model(spec)
    report = surgery.convert(model, FFNAlignStrategy(multiple=4))
    assert all(layer.ffn_width % 4 == 0 for layer in surgery.inspect(model).layers)
    # Removing a neuron is the same as zeroing its column of the down-projection.
    adapter = surgery.adapter_for(reference)
    inputs = tiny_inputs(spec)
    with torch.no_grad():
        for layer, neurons in report.plan["neurons"].items():
            adapter.layer(int(layer)).ffn.down.weight[:, neurons] = 0
        torch.testing.assert_close(main_output(model, inputs), main_output(reference, inputs), atol=1e-5, rtol=0)


def test_plan_is_json_deterministic_and_read_only() -> None:
    model = tiny_model(TinySpec("bert", ffn=37))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plan = surgery.plan(model, FFNAlignStrategy(multiple=8))
    assert plan == surgery.plan(model, FFNAlignStrategy(multiple=8))
    assert json.loads(json.dumps(plan)) == plan
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_save_and_reload_gives_the_same_model(tmp_path: Path) -> None:
    spec = TinySpec("modernbert", ffn=21, task="seq-cls")
    model = tiny_model(spec)
    surgery.convert(model, FFNAlignStrategy(multiple=8))
    again = surgery.from_pretrained(surgery.save_pretrained(model, tmp_path / "aligned"))
    assert [layer.ffn_width for layer in surgery.inspect(again).layers] == [16, 16]
    with torch.no_grad():
        torch.testing.assert_close(main_output(again, tiny_inputs(spec)), main_output(model, tiny_inputs(spec)))


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(surgery.ConfigError, match="multiple"):
        FFNAlignStrategy(multiple=0)
    with pytest.raises(surgery.ConfigError, match="unknown field"):
        FFNAlignStrategy(multiples=8)


def test_a_bad_plan_is_refused_before_anything_is_cut() -> None:
    model = tiny_model(TinySpec("bert", ffn=37))
    with pytest.raises(surgery.PlanError, match="neurons of layer 1: indices \\[99\\] are out of range"):
        surgery.apply_plan(model, FFNAlignStrategy(), {"neurons": {"0": [0], "1": [99]}})
    assert [layer.ffn_width for layer in surgery.inspect(model).layers] == [37, 37]
