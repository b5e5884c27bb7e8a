"""The method contract holds for every registered method: run state never lives on the method object.

docs/writing-a-strategy.md and surgery/core/strategy.py promise that one method instance can run any
number of times, on any number of models, and stays what it was configured to be: what a run gathers
goes to its RunContext and comes back in the report. Each registered method runs twice on one
instance here (fresh tiny models), and its attributes must be exactly the same after each run and
at every progress event during it (a method that swaps its config for a run and restores it after
is caught mid-run).
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import pytest
from pydantic import BaseModel
from torch import nn

import surgery
from surgery.core import registry
from surgery.strategies import ExpertAttentionStrategy
from surgery.testing import TinySpec, tiny_inputs, tiny_model, tiny_task_data

SPEC = TinySpec("bert", task="seq-cls", layers=2, ffn=16)


def _model() -> nn.Module:
    return tiny_model(SPEC, num_labels=3)


def _routed_model() -> nn.Module:
    model = _model()
    surgery.convert(model, ExpertAttentionStrategy(layers=[0]))
    return model


def _batches() -> list[dict[str, Any]]:
    return [tiny_inputs(SPEC, seed=s) for s in range(2)]


#: name -> (settings, the model it runs on, the data it needs): small settings, so a run takes seconds.
CASES: dict[str, tuple[dict[str, Any], Any, Any]] = {
    "head-prune": ({"heads": {0: [1]}}, _model, lambda: None),
    "ffn-prune": ({"neurons": {0: [0, 1]}}, _model, lambda: None),
    "layer-drop": ({"layers": [1]}, _model, lambda: None),
    "expert-attention": ({"layers": [0]}, _model, lambda: None),
    "top1-prune": ({}, _routed_model, _batches),
    "soft-prompt": ({"length": 3}, _model, lambda: None),
    "zero-recovery-prune": ({"module_set": "ffn", "ratio": 0.25, "importance": "random"}, _model, lambda: None),
    # both layers of two: a deep conversion, whose settings are resolved for the run (ShrpConfig.for_depth)
    "shrp": ({"num_layers": 2, "extra_epochs": 0, "bench": False, "recover_epochs": 0, "batch_size": 16},
             _model, lambda: tiny_task_data(32)),
    # two probes of the rate search (each condensed and accepted), not the default five: every step of a run is
    # still taken, and the contract is checked at each of its progress events
    "doe": ({"epochs": 1, "condense_epochs": 1, "batch_size": 16, "margin": 100.0, "max_probes": 2,
             "prompt_length": 4}, _model, lambda: tiny_task_data(32)),
}


def state(method: Any) -> dict[str, Any]:
    """Every attribute of ``method``, as plain comparable values (configs by their fields)."""
    return {name: value.model_dump() if isinstance(value, BaseModel) else repr(value)
            for name, value in sorted(vars(method).items())}


def test_every_registered_method_has_a_case() -> None:
    # the built-ins' entry points (a test may have registered a method in-process, e.g. a docstring example)
    builtins = {ep.name for ep in metadata.entry_points(group=registry.STRATEGY_GROUP)
                if ep.dist is not None and ep.dist.name == registry.BUILTIN_DISTRIBUTION}
    assert sorted(builtins) == sorted(CASES), "add the new method to CASES"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_method_instance_is_unchanged_by_running_it_twice(name: str) -> None:
    settings, make_model, make_data = CASES[name]
    method = registry.get_method(name)(settings)
    before = state(method)
    changed_during: list[str] = []

    def watch(event: Any) -> None:
        if state(method) != before:
            changed_during.append(event.task)

    for _ in range(2):
        report = surgery.convert(make_model(), method, data=make_data(), progress=watch)
        assert report.strategy == name
        assert state(method) == before, f"{name}: running it changed the method object"
    assert changed_during == [], f"{name}: the method object changed during the run"
