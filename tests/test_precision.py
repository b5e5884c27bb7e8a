"""Precision as a search dimension on OpenVINO int8: a precision map left out of quantization in the IR,
recorded with the saved model and replayed on export; the float variants that rank groups; the
quantization-aware refit.

Skipped in one line where the ``openvino`` extra (openvino, nncf) is not installed.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("openvino", reason="the openvino extra is not installed: pip install 'encoder-surgery[openvino]'")
pytest.importorskip("nncf", reason="the openvino extra is not installed: pip install 'encoder-surgery[openvino]'")

import openvino as ov

import surgery
from surgery.anatomy import adapter_for
from surgery.core.errors import ConfigError
from surgery.core.manifest import int8_float_of, set_int8_float
from surgery.runtimes.openvino.openvino_export import (
    OV_INFO,
    OV_XML,
    export_openvino,
    quantized_product_inputs,
    with_float_groups,
)
from surgery.runtimes.openvino.quantized_refit import quantization_aware_refit
from surgery.runtimes.shared.graph_export import graph_feeds
from surgery.runtimes.shared.weight_products import precision_groups
from surgery.testing import TinySpec, tiny_inputs, tiny_model
from surgery.training.refit import projection_name, refit_projections
from tests.helpers import main_path_only

pytestmark = pytest.mark.openvino


def calibration(spec: TinySpec) -> list[dict[str, torch.Tensor]]:
    return [tiny_inputs(spec, batch=8, seq=12, seed=seed) for seed in range(3)]


def fake_quantized_products(xml) -> dict[str, bool]:
    """Each torch module's product in the IR file -> whether a FakeQuantize feeds its activation input."""
    return fake_quantized_products_of(ov.Core().read_model(str(xml)))


def fake_quantized_products_of(ir) -> dict[str, bool]:
    found = {}
    for op in ir.get_ordered_ops():
        if op.get_type_name() == "MatMul" and "aten::linear" in op.get_friendly_name():
            module = op.get_friendly_name().split("/", 1)[0].removeprefix("__module.model.")
            found[module] = op.input_value(0).get_node().get_type_name() == "FakeQuantize"
    return found


@pytest.mark.slow
def test_a_fallback_map_is_left_out_of_quantization_recorded_saved_and_replayed(tmp_path) -> None:
    spec = TinySpec("bert", task="seq-cls", layers=2)
    model = tiny_model(spec).eval()
    set_int8_float(model, ["layer.1.ffn-down", "classifier"])
    report = export_openvino(model, tmp_path / "ir", int8=True, calibration=calibration(spec), batch=2, seq=8)
    # The IR: no FakeQuantize before the fallback's products, one before every other product.
    quantized = fake_quantized_products(tmp_path / "ir" / OV_XML)
    floats = {"bert.encoder.layer.1.output.dense", "bert.pooler.dense", "classifier"}
    assert {m for m, q in quantized.items() if not q} == floats
    assert quantized["bert.encoder.layer.0.output.dense"] and quantized["bert.encoder.layer.1.intermediate.dense"]
    # The artefact's manifest records the map.
    info = json.loads((tmp_path / "ir" / OV_INFO).read_text())
    assert info["int8_float"] == ["classifier", "layer.1.ffn-down"] and info["int8_float_nodes"] == 3
    # Saved with the model and replayed when it is exported again from the saved directory.
    surgery.save_pretrained(model, tmp_path / "model")
    assert json.loads((tmp_path / "model" / "surgery.json").read_text())["int8_float"] == ["classifier",
                                                                                          "layer.1.ffn-down"]
    again = surgery.from_pretrained(tmp_path / "model")
    assert int8_float_of(again) == ["classifier", "layer.1.ffn-down"]
    replayed = export_openvino(again, tmp_path / "again", int8=True, calibration=calibration(spec), batch=2, seq=8)
    assert replayed.int8_float == report.int8_float
    assert fake_quantized_products(tmp_path / "again" / OV_XML) == quantized
    # An explicit empty map quantizes everything (the recorded one is not forced).
    every = export_openvino(again, tmp_path / "all", int8=True, calibration=calibration(spec), batch=2, seq=8,
                            int8_float=[])
    assert every.int8_float == [] and all(fake_quantized_products(tmp_path / "all" / OV_XML).values())


@pytest.mark.slow
def test_a_precision_map_names_real_groups_and_needs_int8(tmp_path) -> None:
    spec = TinySpec("bert", layers=2)
    model = tiny_model(spec)
    assert list(precision_groups(model)) == [*(f"layer.{i}.{p}" for i in range(2) for p in ("attention", "ffn-up",
                                                                                            "ffn-down")),
                                             "classifier"]  # a bare BERT's pooler
    with pytest.raises(ConfigError, match="not an op group"):
        set_int8_float(model, ["layer.1.mlp"])
    with pytest.raises(ConfigError, match=r"layer\.7\.ffn-up"):
        export_openvino(model, tmp_path / "a", int8=True, calibration=calibration(spec), int8_float=["layer.7.ffn-up"])
    with pytest.raises(ConfigError, match="needs int8"):
        export_openvino(model, tmp_path / "b", int8_float=["layer.0.ffn-up"])
    set_int8_float(model, ["layer.0.ffn-up"])  # a recorded map means nothing to a float export
    assert export_openvino(model, tmp_path / "c", batch=2, seq=8).int8_float == []


@pytest.mark.slow
def test_a_float_variant_of_the_int8_ir_runs_like_the_ir_quantized_without_those_groups(tmp_path) -> None:
    spec = TinySpec("bert", layers=2)
    model = tiny_model(spec).eval()
    every = list(precision_groups(model))
    export_openvino(model, tmp_path / "ir", int8=True, calibration=calibration(spec), batch=2, seq=8)
    export_openvino(model, tmp_path / "float", int8=True, calibration=calibration(spec), batch=2, seq=8,
                    int8_float=every)
    quantized = ov.Core().read_model(str(tmp_path / "ir" / OV_XML))
    inputs = tiny_inputs(spec, batch=4, seq=12, seed=7)
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state

    def run(ir) -> torch.Tensor:
        compiled = ov.Core().compile_model(ir, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        return torch.from_numpy(compiled(graph_feeds(inputs, [p.get_any_name() for p in ir.inputs]))[
            compiled.outputs[0]])

    variant = with_float_groups(quantized, model, every)
    assert not any(fake_quantized_products_of(variant).values())
    # Each product's weights back in fp32 with the SmoothQuant factor NNCF folded in: the variant runs as
    # the IR that NNCF quantized with every group ignored, far closer than the int8 IR is to either.
    ignored = run(ov.Core().read_model(str(tmp_path / "float" / OV_XML)))
    int8_gap = float((run(quantized) - ignored).square().mean())
    assert float((run(variant) - ignored).square().mean()) < 0.2 * int8_gap
    assert float((run(variant) - expected).square().mean()) < float((run(quantized) - expected).square().mean())


@pytest.mark.slow
def test_quantization_aware_refit_lowers_the_int8_models_layer_error(tmp_path) -> None:
    spec = TinySpec("bert", layers=3, ffn=37)
    teacher = tiny_model(spec).eval()
    student = copy.deepcopy(teacher)
    for layer in range(3):
        adapter_for(student).remove_units(layer, {"neurons": list(range(0, 37, 3)), "heads": [0]})
    batches = [tiny_inputs(spec, batch=16, seq=12, seed=s) for s in range(3)]
    held = [tiny_inputs(spec, batch=16, seq=12, seed=s) for s in range(10, 12)]
    plain = copy.deepcopy(student)
    refit_projections(plain, teacher, batches)
    aware = copy.deepcopy(plain)
    quantization_aware_refit(aware, teacher, batches, calibration=batches, threads=1)

    def int8_error(model: torch.nn.Module) -> float:
        """Relative error of the int8 artefact's last layer's FFN-down output against the teacher's, on held text."""
        out = tmp_path / f"ir-{id(model)}"
        export_openvino(model, out, int8=True, calibration=batches, batch=2, seq=8)
        quantized = ov.Core().read_model(str(out / OV_XML))
        name = projection_name(model, 2, "down")
        read = quantized_product_inputs(quantized, model, [name], threads=1)
        down = adapter_for(model).layer(2).ffn.down
        target = {}
        handle = adapter_for(teacher).layer(2).ffn.down.register_forward_hook(
            lambda _m, _a, o: target.__setitem__("y", o.detach()))
        total = norm = 0.0
        with torch.no_grad():
            for batch in held:
                teacher(**batch)
                y = down(read(batch)[name])
                total += float((y - target["y"]).square().sum())
                norm += float((target["y"] - target["y"].mean((0, 1))).square().sum())
        handle.remove()
        return total / norm

    assert int8_error(aware) < int8_error(plain)


@pytest.mark.slow
def test_a_float_variant_leaves_an_emptied_ffn_as_the_ir_has_it(tmp_path) -> None:
    spec = TinySpec("bert", layers=2, ffn=37)
    model = tiny_model(spec).eval()
    adapter_for(model).remove_units(1, {"neurons": list(range(37))})  # layer 1's FFN emptied
    export_openvino(model, tmp_path / "ir", int8=True, calibration=calibration(spec), batch=2, seq=8)
    quantized = ov.Core().read_model(str(tmp_path / "ir" / OV_XML))
    variant = with_float_groups(quantized, model, list(precision_groups(model)))  # it raised on the empty FFN
    compiled = ov.Core().compile_model(variant, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    inputs = tiny_inputs(spec, batch=4, seq=12, seed=7)
    got = torch.from_numpy(compiled(graph_feeds(inputs, [p.get_any_name() for p in variant.inputs]))[
        compiled.outputs[0]])
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    # every product back in float: the variant runs like the fp32 model (the biases keep NNCF's small correction)
    assert float((got - expected).abs().max()) < 0.1 * float(expected.abs().max())


@pytest.mark.slow
def test_quantization_aware_refit_solves_an_emptied_ffn_from_the_teacher_alone() -> None:
    spec = TinySpec("bert", layers=2, ffn=37)
    teacher = tiny_model(spec).eval()
    student = copy.deepcopy(teacher)
    adapter_for(student).remove_units(0, {"neurons": list(range(10))})
    adapter_for(student).remove_units(1, {"neurons": list(range(37))})  # layer 1's FFN emptied
    batches = [tiny_inputs(spec, batch=16, seq=12, seed=s) for s in range(2)]
    plain = copy.deepcopy(student)
    expected = refit_projections(plain, teacher, batches, residual=False)
    result = quantization_aware_refit(student, teacher, batches, calibration=batches, threads=1)
    # the emptied down projection (bias only) is solved as the plain refit solves it, for the projection's own output
    # (the int8 model gives no residual stream to fit); layer 0's from int8 inputs
    assert "1:down" in result.error and result.error["1:down"] == expected.error["1:down"]
    assert "0:down" in result.error
    assert torch.equal(adapter_for(student).layer(1).ffn.down.bias, adapter_for(plain).layer(1).ffn.down.bias)


@pytest.mark.slow
def test_compress_buys_a_fallback_and_records_its_map_in_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    from surgery.compress import precision
    from surgery.compress.compress_run import compress
    from surgery.compress.config import CompressConfig
    from surgery.compress.latency_source import TableLatency
    from surgery.compress.latency_table import FallbackCosts
    from surgery.compress.shape_table import shape_latency_table
    from surgery.testing import tiny_task_data

    model = tiny_model(TinySpec("bert", task="seq-cls"))
    # Tiny random models give noise-sized gains: the measured figures are replaced by ones that make one
    # fallback clearly worth the cuts that pay for it, and one clearly not.
    def gains(_served, cut_model, *_a, **_k) -> dict[str, float]:
        groups = list(precision_groups(cut_model))
        last_down = [g for g in groups if g.endswith("ffn-down")][-1]
        return {g: 10.0 if g == last_down else -1.0 for g in groups}

    monkeypatch.setattr(precision, "fallback_gains", gains)
    monkeypatch.setattr("surgery.compress.latency_measure.measure_fallback_costs", lambda *_a, **_k: FallbackCosts(
        runtime="openvino-int8", precision="f32", per_unit_ms={"ffn-down": 0.01, "attention": 0.01}))
    tables = TableLatency({"torch": shape_latency_table(model), "openvino-int8": shape_latency_table(
        model, "openvino-int8", scale=1 / 1.5)})
    main_path_only(monkeypatch, precision=True)  # the pass is under test, not the paths beside the main one
    result = compress(model, tiny_task_data(), CompressConfig(speedup=2.0, runtime="openvino-int8", threads=1),
                      latency=tables)
    chosen = [c for c in result.report.candidates if c.origin == "precision"]
    assert len(chosen) == 1 and len(chosen[0].int8_float) == 1 and chosen[0].int8_float[0].endswith(".ffn-down")
    assert any(n.startswith("precision map: layer.") for n in chosen[0].notes)
    assert any(n.startswith("quantization-aware refit: ") for n in chosen[0].notes)
    recorded = json.loads(result.report.model_dump_json())["candidates"]
    assert [c["int8_float"] for c in recorded if c["origin"] == "precision"] == [chosen[0].int8_float]
    assert any("precision pass" in note and "1 fallback(s)" in note for note in result.report.notes)
    others = [c for c in result.report.candidates if c.origin != "precision"]
    assert all(c.int8_float == [] for c in others)


def test_the_max_drop_pass_measures_no_gain_where_no_part_runs_faster_in_float(monkeypatch: pytest.MonkeyPatch
                                                                                  ) -> None:
    from types import SimpleNamespace

    from surgery.compress import precision
    from surgery.compress.latency_table import FallbackCosts

    def gains(*_a, **_k):
        raise AssertionError("gains measured although no fallback can be free")

    monkeypatch.setattr(precision, "fallback_gains", gains)
    monkeypatch.setattr("surgery.compress.latency_measure.measure_fallback_costs", lambda *_a, **_k: FallbackCosts(
        runtime="openvino-int8", precision="f32", per_unit_ms={"ffn-down": 0.01, "attention": 0.002}))
    plan = SimpleNamespace(batch_size=2, seq_len=8, batches=None)
    judge = SimpleNamespace(threads=1, runtime=None)  # the costs are stubbed: no runtime is asked
    assert precision.precision_choice(None, 3, None, Path("unused"), judge, plan, 2.0, free_only=True) == (None, [])


def max_drop_on_openvino(monkeypatch: pytest.MonkeyPatch, per_unit_ms: dict[str, float]
                         ) -> tuple[Any, list[list[str]], list[object]]:
    """compress --max-drop on OpenVINO int8 with the fallback costs ``per_unit_ms`` and stubbed gains; also the
    groups whose gains were asked for, and the models the quantization-aware refit was given."""
    from surgery.compress import precision
    from surgery.compress.compress_run import compress
    from surgery.compress.config import CompressConfig
    from surgery.compress.latency_source import TableLatency
    from surgery.compress.latency_table import FallbackCosts
    from surgery.compress.shape_table import shape_latency_table
    from surgery.testing import tiny_task_data

    model = tiny_model(TinySpec("bert", task="seq-cls"))
    asked: list[list[str]] = []
    refits: list[object] = []

    def gains(_served, cut_model, *_a, groups=None, **_k) -> dict[str, float]:
        asked.append(list(groups if groups is not None else precision_groups(cut_model)))
        return {g: 0.5 if g.endswith("attention") else 1.0 for g in asked[-1]}

    def refit(self, model, *_a, **_k) -> list[str]:
        refits.append(model)
        return []

    monkeypatch.setattr(precision, "fallback_gains", gains)
    monkeypatch.setattr("surgery.runtimes.openvino.openvino_runtime.OpenVinoInt8Runtime.int8_refit", refit)
    monkeypatch.setattr("surgery.compress.latency_measure.measure_fallback_costs", lambda *_a, **_k: FallbackCosts(
        runtime="openvino-int8", precision="f32", per_unit_ms=per_unit_ms))
    tables = TableLatency({"torch": shape_latency_table(model), "openvino-int8": shape_latency_table(
        model, "openvino-int8", scale=1 / 1.5)})
    # The pass is under test, not the paths beside the main one nor the bisection along it: the main path's first
    # 3 points (each an int8 IR), every one within the drop, so the deepest of them is the cut the pass takes.
    main_path_only(monkeypatch, steps=3, precision=True)
    result = compress(model, tiny_task_data(), CompressConfig(max_drop=100.0, runtime="openvino-int8", threads=1),
                      latency=tables)
    return result, asked, refits


@pytest.mark.slow
def test_max_drop_takes_the_parts_faster_in_float_on_the_deepest_cut_within(monkeypatch: pytest.MonkeyPatch) -> None:
    # attention measured faster in float than in int8 (as on a CPU without VNNI); the FFN slower
    result, asked, refits = max_drop_on_openvino(monkeypatch, {"ffn-down": 0.01, "attention": -0.01})
    chosen = [c for c in result.report.candidates if c.origin == "precision"]
    # the cut with its own weights, and the cut refitted against its int8 inputs: both with the free parts in float
    assert len(chosen) == 2 and sorted(c.int8_refit for c in chosen) == [False, True]
    anchor = max((c for c in result.report.candidates if c.origin == "path" and c.drop <= 100.0),
                 key=lambda c: c.path_step or 0)
    for c in chosen:  # only the free parts, on the very cut the search judged deepest within the drop
        assert c.int8_float and all(g.endswith(".attention") for g in c.int8_float)
        assert c.path_step == anchor.path_step and c.removal == anchor.removal
    assert any("precision pass" in n and "faster in float than in int8" in n for n in result.report.notes)
    # only the free parts' gains were measured; the plain one keeps the judged cut's weights
    assert asked and all(g.endswith(".attention") for g in asked[0])
    plain = next(c for c in chosen if not c.int8_refit)
    refitted = next(c for c in chosen if c.int8_refit)
    assert len(refits) == 1 and not any("quantization-aware" in n for n in plain.notes)
    assert any(n.startswith("quantization-aware refit") for n in refitted.notes)


@pytest.mark.slow
def test_max_drop_refits_the_deepest_cut_within_against_its_int8_inputs_where_nothing_is_faster_in_float(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a CPU where int8 is faster everywhere (VNNI): no fallback, but the cut refitted against its int8 inputs
    result, asked, refits = max_drop_on_openvino(monkeypatch, {"ffn-down": 0.01, "attention": 0.002})
    chosen = [c for c in result.report.candidates if c.origin == "precision"]
    assert asked == [] and len(refits) == 1
    assert len(chosen) == 1 and chosen[0].int8_refit and chosen[0].int8_float == []
    anchor = max((c for c in result.report.candidates if c.origin == "path" and c.drop <= 100.0),
                 key=lambda c: c.path_step or 0)
    assert chosen[0].removal == anchor.removal and chosen[0].name.startswith("int8-refit-")
    assert all(not c.int8_refit for c in result.report.candidates if c.origin != "precision")
