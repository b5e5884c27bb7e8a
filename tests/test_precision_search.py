"""The precision pass of the search (no runtime needed): fallbacks bought back against cuts by loss per ms."""

from __future__ import annotations

import pytest
import torch

from surgery.compress.latency_table import FallbackCosts, LatencyTable
from surgery.compress.mask_fisher import UnitCosts
from surgery.compress.removal_path import Removal, buy_fallbacks, search_path, start_indexed
from surgery.compress.structure import LayerShape, Structure

START = Structure((LayerShape(4, 8), LayerShape(4, 8), LayerShape(4, 8)))


def path():
    costs = UnitCosts("task", 8, heads={i: torch.full((4,), 0.01 * (i + 1)) for i in range(3)},
                      neurons={i: torch.full((8,), 0.001 * (i + 1)) for i in range(3)}, layers={0: 0.5, 1: 0.3, 2: 0.2})
    table = LatencyTable(runtime="openvino-int8", batch_size=1, seq_len=8, model_key="demo", base_ms=1.0,
                         overhead_ms=0.2, attention_ms={h: 0.5 * h for h in range(1, 5)},
                         ffn_ms={w: 0.25 * w for w in range(1, 9)})
    return search_path(costs, table, START, groups=4)


COSTS = FallbackCosts(runtime="openvino-int8", precision="f32", per_unit_ms={"attention": 0.05, "ffn-down": 0.02})


def test_a_fallback_worth_more_than_the_cuts_that_pay_for_it_is_bought_and_costs_its_time() -> None:
    p = path()
    k0 = p.first_reaching(1.5)
    choice = buy_fallbacks(p, k0, {"layer.2.ffn-down": 5.0}, COSTS, target_speedup=1.5)
    assert choice.int8_float and choice.step >= k0
    # The pick still meets the target once the fallback's milliseconds are counted.
    assert p.reference_ms / choice.predicted_ms >= 1.5 - 1e-9
    bought = choice.bought[0]
    assert bought["gain"] > bought["extra_cut_loss"] and choice.predicted_ms > p.steps[choice.step - 1].predicted_ms


def test_a_fallback_worth_less_than_the_cuts_it_needs_is_not_bought() -> None:
    p = path()
    k0 = p.first_reaching(1.5)
    slack = p.reference_ms / 1.5 - p.steps[k0 - 1].predicted_ms
    # costs more than the slack, gains less than any further cut loses
    gain = 1e-9
    choice = buy_fallbacks(p, k0, {"layer.2.attention": gain}, COSTS.model_copy(
        update={"per_unit_ms": {"attention": slack + 1.0}}), target_speedup=1.5)
    assert choice.int8_float == [] and choice.step == k0 and choice.bought == []


def test_a_fallback_measured_faster_in_float_is_bought_for_free_and_walks_the_path_back() -> None:
    p = path()
    k0 = p.first_reaching(1.5)
    faster = COSTS.model_copy(update={"per_unit_ms": {"attention": -0.2, "ffn-down": 0.02}})
    choice = buy_fallbacks(p, k0, {"layer.2.attention": 1e-6}, faster, target_speedup=1.5)
    assert choice.int8_float == ["layer.2.attention"]
    # the time float gives back buys fewer cuts: an earlier path point, still meeting the target
    assert choice.step < k0 and p.reference_ms / choice.predicted_ms >= 1.5 - 1e-9
    ms = p.start_ms if choice.step == 0 else p.steps[choice.step - 1].predicted_ms
    assert choice.predicted_ms < ms
    assert choice.bought[0]["extra_cut_loss"] == 0.0 and choice.bought[0]["steps"] == choice.step - k0
    # a free group with no measured gain is still not taken (the float variant was no more accurate)
    assert buy_fallbacks(p, k0, {"layer.2.attention": -1e-6}, faster, target_speedup=1.5).int8_float == []


def test_free_fallbacks_come_first_and_paid_ones_are_still_traded_against_cuts() -> None:
    p = path()
    k0 = p.first_reaching(1.5)
    costs = COSTS.model_copy(update={"per_unit_ms": {"attention": -0.01, "ffn-down": 0.02}})
    choice = buy_fallbacks(p, k0, {"layer.0.attention": 1e-6, "layer.2.ffn-down": 5.0}, costs, target_speedup=1.5)
    assert choice.int8_float == ["layer.0.attention", "layer.2.ffn-down"]
    assert [b["group"] for b in choice.bought] == ["layer.0.attention", "layer.2.ffn-down"]
    assert p.reference_ms / choice.predicted_ms >= 1.5 - 1e-9


def test_nothing_is_bought_with_no_gain_and_groups_are_renumbered_by_the_cut_model() -> None:
    p = path()
    k0 = p.first_reaching(1.5)
    assert buy_fallbacks(p, k0, {"layer.2.ffn-down": -1.0}, COSTS, target_speedup=1.5).int8_float == []
    removal = Removal(layers=[0])
    assert start_indexed({"layer.0.ffn-down": 1.0, "layer.1.attention": 2.0}, removal) == {
        "layer.1.ffn-down": 1.0, "layer.2.attention": 2.0}


@pytest.mark.slow
@pytest.mark.onnx
def test_onnx_runtime_int8_replays_a_recorded_precision_map(tmp_path) -> None:
    pytest.importorskip("onnxruntime", reason="the onnx extra is not installed: pip install 'encoder-surgery[onnx]'")
    import onnx

    from surgery.core.manifest import set_int8_float
    from surgery.runtimes.onnx import export_onnx
    from surgery.testing import TinySpec, tiny_model

    model = tiny_model(TinySpec("bert", layers=2))
    plain = export_onnx(model, tmp_path / "all", task="base", int8=True, batch=2, seq=8)
    set_int8_float(model, ["layer.1.ffn-down", "layer.0.attention"])
    mixed = export_onnx(model, tmp_path / "map", task="base", int8=True, batch=2, seq=8)
    assert plain.int8_fp32_nodes == 0 and plain.int8_float == []
    # layer 0's q, k, v and output projections and layer 1's FFN down: 5 products left as plain MatMuls
    assert mixed.int8_float == ["layer.0.attention", "layer.1.ffn-down"] and mixed.int8_fp32_nodes == 5

    def matmuls(name: str) -> int:
        return sum(n.op_type == "MatMul" for n in onnx.load(str(tmp_path / name / "model.onnx")).graph.node)

    assert matmuls("map") - matmuls("all") == 5
    assert export_onnx(model, tmp_path / "fp32", task="base", batch=2, seq=8).int8_float == []
