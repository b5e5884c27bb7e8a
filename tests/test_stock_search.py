"""``compress --stock`` searches only what a stock config can state (issue 29).

Every cut of a stock search, at every step of its path, is one :func:`save_stock` accepts: whole
layers it can drop (never ModernBERT's first layer, which a stock model builds without an
attention norm), one FFN width for every layer and never width 0 (``"intermediate_size": 0`` loads in
transformers but surgery's own ``inspect``/``export``/``bench`` refuse it), all heads. A model no
stock config can state is refused before any work, not at the save after the whole job.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import surgery
from surgery.compress.candidates import apply_removal
from surgery.compress.compress_report import SpeedupTarget
from surgery.compress.latency_source import TableLatency
from surgery.compress.mask_fisher import unit_costs
from surgery.compress.plan import plan_compress
from surgery.compress.removal_path import search_path
from surgery.compress.shape_table import shape_latency_table
from surgery.compress.stock_export import save_stock, stock_fixed_layers, stock_structure_problem
from surgery.compress.structure import Structure
from surgery.core.errors import StockFormatError
from surgery.persist.config_values import load_config
from surgery.strategies import HeadPruningStrategy
from surgery.testing import FAMILIES, TinySpec, tiny_model, tiny_task_data


def costs_of(model: torch.nn.Module) -> Any:
    return unit_costs(model, list(tiny_task_data().loader("train", batch_size=8)), objective="task")


def test_only_modernbert_has_a_layer_a_stock_config_cannot_drop() -> None:
    fixed = {family: stock_fixed_layers(tiny_model(TinySpec(family, layers=3))) for family in FAMILIES}
    assert fixed == {family: ([0] if family == "modernbert" else []) for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_step_of_a_stock_path_can_be_saved_as_a_stock_directory(family: str) -> None:
    model = tiny_model(TinySpec(family, task="seq-cls", layers=3))
    start = Structure.from_model(model)
    # No stop: the path runs until nothing is left to cut, so it reaches the narrowest widths and fewest layers.
    path = search_path(costs_of(model), shape_latency_table(model), start, stock=True,
                       fixed_layers=stock_fixed_layers(model))
    assert path.steps and path.speedup_at(len(path.steps)) > 1.5
    for k in range(len(path.steps) + 1):
        kept = path.structure_at(k).kept
        assert min(s.ffn_width for s in kept) > 0, (k, kept)
        if family == "modernbert":
            assert path.structure_at(k).layers[0] is not None, k
    last = copy.deepcopy(model)
    apply_removal(last, path.removal_at(len(path.steps)))
    assert stock_structure_problem(last) is None


@pytest.mark.slow
def test_a_stock_compress_of_modernbert_saves_and_reloads_in_plain_transformers(tmp_path: Path) -> None:
    from transformers import AutoModelForSequenceClassification

    model = tiny_model(TinySpec("modernbert", task="seq-cls", layers=4))
    plan = plan_compress(model, tiny_task_data(), target=SpeedupTarget(speedup=3.0), stock=True,
                         latency=TableLatency({"torch": shape_latency_table(model)}))
    cut = copy.deepcopy(model)
    apply_removal(cut, plan.path.removal_at(len(plan.path.steps)))
    assert len(plan.path.steps) > 2 and Structure.from_model(cut).layers[0] is not None
    out = save_stock(cut, tmp_path / "stock")
    config = json.loads((out / "config.json").read_text())
    assert config["intermediate_size"] > 0 and config["num_hidden_layers"] < 4
    load_config(out)  # surgery's own checks accept the config it wrote
    reloaded = AutoModelForSequenceClassification.from_pretrained(out).eval()
    inputs = {"input_ids": torch.randint(5, 90, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    with torch.no_grad():
        assert torch.allclose(reloaded(**inputs).logits, cut.eval()(**inputs).logits, atol=1e-5)


def test_a_model_no_stock_config_can_state_is_refused_before_the_latency_table() -> None:
    model = tiny_model(TinySpec("bert", task="seq-cls", layers=2))
    surgery.convert(model, HeadPruningStrategy(heads={1: [0]}))

    class NeverTimed:
        def table(self, *args: object, **kwargs: object) -> Any:
            raise AssertionError("measured a latency table for a search that cannot be saved")

        def speedup(self, *args: object, **kwargs: object) -> Any:
            raise AssertionError("timed a model for a search that cannot be saved")

    with pytest.raises(StockFormatError, match=r"compress --stock: .* attention heads were pruned .* drop --stock"):
        plan_compress(model, tiny_task_data(), target=SpeedupTarget(speedup=2.0), stock=True, latency=NeverTimed())
