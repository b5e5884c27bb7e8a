"""Fused attention in exported graphs: one com.microsoft MultiHeadAttention per layer, with that layer's heads.

Every family whose attention goes through transformers' attention interface fuses; the others (MPNet,
DeBERTa-v2) and SHRP's routed expert layers are exported as MatMul + Softmax and listed as unfused.
Each export costs a few seconds, so every model carries uneven heads and one export checks several things;
the per-family export is the session's shared one (conftest ``uneven_exports``), which tests/test_deploy.py
checks at parity too.
"""

from __future__ import annotations

import json

import onnx
import pytest
import torch

import surgery
from surgery.core.errors import ConfigError
from surgery.runtimes.onnx import INFO_NAME, OnnxRuntimeModel, export_onnx
from surgery.runtimes.onnx.fused_attention import FUSED_DOMAIN, FUSED_OP, fused_attention
from surgery.runtimes.shared.graph_export import agreement
from surgery.strategies import HeadPruningStrategy
from surgery.testing import FAMILIES, TinySpec, main_output, tiny_inputs, tiny_model

TOLERANCE = 1e-4
#: Families whose attention modules compute their position terms themselves, outside the interface.
UNFUSED_FAMILIES = ("mpnet", "deberta-v2")
#: Heads left per layer after pruning layer 0 to 1 head and layer 2 to 3 (of 4).
KEPT_HEADS = [1, 4, 3]



def fused_nodes(path) -> list[onnx.NodeProto]:
    graph = onnx.load(str(path)).graph
    return [n for n in graph.node if n.op_type == FUSED_OP and n.domain == FUSED_DOMAIN]


def uneven_heads_model(family: str, task: str = "base") -> tuple[torch.nn.Module, TinySpec]:
    spec = TinySpec(family, heads=4, head_dim=4, layers=3, ffn=12, task=task, seed=FAMILIES.index(family))
    model = tiny_model(spec)
    surgery.convert(model, HeadPruningStrategy(heads={0: [0, 2, 3], 2: [1]}))
    return model, spec


@pytest.mark.slow
@pytest.mark.onnx
@pytest.mark.parametrize("family", FAMILIES)
def test_each_plain_layer_is_one_fused_operator_with_its_own_heads_and_routed_ones_stay_unfused(
        family: str, uneven_exports) -> None:
    # The export test_deploy checks at parity on other shapes: heads 1, 4, 3; FFN widths 9, 0, 11; layer 1 routed.
    exported = uneven_exports.onnx(family)
    report = exported["report"]
    nodes = fused_nodes(exported["graph"])
    info = report.fused_attention
    assert info is not None and report.parity.max_abs_diff <= TOLERANCE
    if family in UNFUSED_FAMILIES:
        assert not nodes and info.layers == [] and info.unfused_layers == [0, 1, 2] and info.reason
        assert report.operators["Softmax"] >= 3
        return
    # Layers 0 and 2 fuse with their own head counts; the routed expert layer stays MatMul + Softmax.
    assert len(nodes) == 2 and info.layers == [0, 2] and info.unfused_layers == [1] and info.reason
    heads = [next(a.i for a in n.attribute if a.name == "num_heads") for n in nodes]
    assert heads == info.num_heads == [KEPT_HEADS[0], KEPT_HEADS[2]]
    assert report.operators[FUSED_OP] == 2 and report.operators["Softmax"] >= 1
    saved = json.loads((exported["dir"] / INFO_NAME).read_text())
    assert saved["fused_attention"]["num_heads"] == [KEPT_HEADS[0], KEPT_HEADS[2]]
    # Another batch size and length, right-padded differently: the mask reaches the operator.
    runtime = OnnxRuntimeModel(exported["graph"], config=exported["model"].config, output=report.output)
    inputs = tiny_inputs(exported["spec"], batch=5, seq=13, seed=7)
    with torch.no_grad():
        expected = main_output(exported["model"], inputs)
    assert agreement(expected, getattr(runtime(**inputs), report.output)).max_abs_diff <= TOLERANCE


@pytest.mark.slow
@pytest.mark.onnx
def test_opting_out_gives_the_plain_graph(tmp_path) -> None:
    model, _ = uneven_heads_model("bert")
    report = export_onnx(model, tmp_path / "plain", batch=3, seq=8, fuse_attention=False)
    assert report.fused_attention is None and not fused_nodes(tmp_path / "plain" / "model.onnx")
    assert report.operators["Softmax"] == 3 and report.parity.max_abs_diff <= TOLERANCE


@pytest.mark.slow
@pytest.mark.onnx
@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_int8_and_smoothing_keep_the_fused_operator_in_fp32_and_quantize_the_projections(family, tmp_path) -> None:
    model, spec = uneven_heads_model(family)
    batches = [tiny_inputs(spec, batch=4, seq=10, seed=s) for s in range(2)]
    report = export_onnx(model, tmp_path / "int8", int8=True, calibration=batches, optimize=True, batch=3, seq=8)
    nodes = fused_nodes(tmp_path / "int8" / "model.onnx")
    assert len(nodes) == 3 and report.fused_attention is not None and report.fused_attention.num_heads == KEPT_HEADS
    assert report.fused_attention.unfused_layers == [] and "Softmax" not in report.operators  # every layer fused
    ops = report.optimized or {}
    # Every weight product of every layer is int8 (ModernBERT has one Wqkv and one GeGLU Wi per layer).
    products = {"bert": 6, "modernbert": 4}[family] * 3
    assert ops.get("MatMulIntegerToFloat", 0) + ops.get("DynamicQuantizeMatMul", 0) == products
    assert ops.get("MatMul", 0) == 0
    assert report.int8_smoothing is not None and report.int8_drift is not None
    assert report.int8_drift.min_cosine > 0.99


def test_the_interface_is_restored_after_the_block() -> None:
    model, spec = uneven_heads_model("distilbert")
    before = model.config._attn_implementation
    with fused_attention(model) as recorder:
        model.eval()(**tiny_inputs(spec))
    assert model.config._attn_implementation == before and sorted(recorder.calls.values()) == sorted(KEPT_HEADS)


@pytest.mark.slow
@pytest.mark.onnx
def test_static_int8_calibrates_activation_scales_around_the_fused_operator(tmp_path) -> None:
    model, spec = uneven_heads_model("bert")
    batches = [tiny_inputs(spec, batch=4, seq=10, seed=s) for s in range(2)]
    report = export_onnx(model, tmp_path / "static", int8=True, int8_mode="static", calibration=batches, batch=3,
                         seq=8)
    ops = report.operators
    # Per layer, four product inputs (q/k/v share one) get a calibrated QuantizeLinear/DequantizeLinear pair, and
    # six int8 weights a DequantizeLinear: every product downstream of a fused layer is quantized too.
    assert report.int8_mode == "static" and ops["QuantizeLinear"] == 3 * 4 and ops["DequantizeLinear"] == 3 * (4 + 6)
    assert ops[FUSED_OP] == 3 and "DynamicQuantizeLinear" not in ops
    assert report.int8_drift is not None and report.int8_drift.min_cosine > 0.99


@pytest.mark.onnx
def test_static_int8_needs_calibration_texts(tmp_path) -> None:
    model, _ = uneven_heads_model("bert")
    with pytest.raises(ConfigError, match=r"^export: int8_mode 'static' calibrates activation scales on your texts"):
        export_onnx(model, tmp_path / "x", int8=True, int8_mode="static")
    with pytest.raises(ConfigError, match=r"^export: int8_mode 'fast' is not one of dynamic, static$"):
        export_onnx(model, tmp_path / "x", int8=True, int8_mode="fast")
