"""Core contract on BERT: explicit head/FFN pruning, plan is JSON, dry-run does not mutate."""

from __future__ import annotations

import json

import pytest
import torch

import surgery
from surgery.strategies import FFNPruningStrategy, HeadPruningStrategy
from surgery.testing import TinySpec, main_output, tiny_inputs, tiny_model


def test_plan_does_not_mutate_and_is_json() -> None:
    spec = TinySpec("bert", task="seq-cls")
    model = tiny_model(spec)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    chosen = surgery.plan(model, HeadPruningStrategy(ratio=0.5))
    assert json.loads(json.dumps(chosen)) == chosen
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_unknown_config_field_is_rejected() -> None:
    with pytest.raises(surgery.ConfigError, match="nope: unknown field"):
        HeadPruningStrategy(heads={0: [1]}, nope=1)
    with pytest.raises(surgery.ConfigError, match="exactly one of 'heads'"):
        HeadPruningStrategy()


def test_removing_every_head_is_refused() -> None:
    model = tiny_model(TinySpec("bert", heads=2))
    with pytest.raises(surgery.PlanError, match="keep at least one head"):
        surgery.convert(model, HeadPruningStrategy(heads={0: [0, 1]}))


def test_explicit_pruning_reports_changes() -> None:
    spec = TinySpec("bert")
    model = tiny_model(spec)
    report = surgery.convert(model, FFNPruningStrategy(neurons={1: [0, 5]}))
    assert [(c.layer, c.before, c.after) for c in report.changes] == [(1, 37, 35)]
    assert report.params_before.total - report.params_after.total == 2 * (spec.hidden + 1) + 2 * spec.hidden
    assert main_output(model, tiny_inputs(spec)).shape[-1] == spec.hidden
