"""Properties of ``top1-prune`` on tiny models of every family."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import surgery
from surgery.core.errors import DataError, PlanError
from surgery.strategies import ExpertAttentionStrategy, Top1PruningStrategy
from surgery.strategies.shrp.expert_attention import expert_layers
from surgery.testing import TinySpec, main_output, tiny_inputs, tiny_model, tiny_specs
from tests.helpers import one_family_fast


@pytest.mark.parametrize("family", one_family_fast())
@given(data=st.data())
def test_keep1_equals_moe_on_inputs_routed_to_the_kept_expert(family: str, data: st.DataObject) -> None:
    spec = data.draw(tiny_specs(families=(family,)))
    model = tiny_model(spec)
    surgery.convert(model, ExpertAttentionStrategy(layers=[0]))
    inputs = tiny_inputs(spec, batch=6)
    (_, layer), = expert_layers(model)
    with torch.no_grad():
        moe = main_output(model, inputs)
        choice = layer.last_choice.clone()
    report = surgery.convert(model, Top1PruningStrategy(keep=1), data=[inputs])
    kept = report.plan["keep"]["0"][0]
    assert report.metrics["usage"]["0"] == torch.bincount(choice, minlength=spec.heads).tolist()
    assert layer.router is None and layer.num_experts == 1
    with torch.no_grad():
        pruned = main_output(model, inputs)
    routed = choice == kept
    assert routed.any()  # the kept expert is the most used one
    real = inputs["attention_mask"].bool() & routed[:, None]
    if pruned.dim() == 3:
        torch.testing.assert_close(pruned[real], moe[real], atol=1e-5, rtol=1e-4)
    else:
        torch.testing.assert_close(pruned[routed], moe[routed], atol=1e-5, rtol=1e-4)
    with tempfile.TemporaryDirectory() as tmp:
        reloaded = surgery.from_pretrained(surgery.save_pretrained(model, Path(tmp) / "m"))
        torch.testing.assert_close(main_output(reloaded, inputs), pruned)


def test_keep2_slices_the_router_and_static_param_count(tmp_path: Path) -> None:
    spec = TinySpec("bert", heads=4, head_dim=8)
    model = tiny_model(spec)
    surgery.convert(model, ExpertAttentionStrategy(layers=[1]))
    layer = model.encoder.layer[1]
    layer.usage.copy_(torch.tensor([5, 0, 9, 1]))
    report = surgery.convert(model, Top1PruningStrategy(keep=2))  # no data: the recorded usage
    assert report.plan["keep"] == {"1": [0, 2]} and report.metrics["usage_source"] == "recorded"
    assert layer.router.out_features == 2 and layer.head_index.tolist() == [0, 2]
    inputs = tiny_inputs(spec)
    out = surgery.save_pretrained(model, tmp_path / "m")
    torch.testing.assert_close(main_output(surgery.from_pretrained(out), inputs), main_output(model, inputs))
    surgery.convert(model, Top1PruningStrategy(keep=1))
    d, dh = spec.hidden, spec.head_dim
    assert sum(p.numel() for p in layer.parameters()) == 4 * dh * d + 3 * dh + d + 2 * d + 2 * d


def test_needs_data_or_recorded_usage() -> None:
    model = tiny_model(TinySpec("bert"))
    with pytest.raises(PlanError, match="expert-attention first"):
        surgery.convert(model, Top1PruningStrategy())
    surgery.convert(model, ExpertAttentionStrategy(layers=[0]))
    with pytest.raises(DataError, match="pass calibration data"):
        surgery.convert(model, Top1PruningStrategy())
    with pytest.raises(DataError, match="iterable of model-input batches"):
        surgery.convert(model, Top1PruningStrategy(), data="train.csv")
