"""OpenVINO runtimes: the IR of every family, uneven structures included, reloads and matches; NNCF int8; the CLI.

Skipped in one line where the ``openvino`` extra (openvino, nncf) is not installed.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("openvino", reason="the openvino extra is not installed: pip install 'encoder-surgery[openvino]'")
pytest.importorskip("nncf", reason="the openvino extra is not installed: pip install 'encoder-surgery[openvino]'")

import surgery
from surgery.cli.app import app
from surgery.core.errors import ConfigError
from surgery.runtimes import get_runtime
from surgery.runtimes.openvino.openvino_export import OV_INFO, OV_XML, OpenVinoModel, export_openvino
from surgery.strategies import FFNPruningStrategy, HeadPruningStrategy
from surgery.testing import FAMILIES, TinySpec, main_output, tiny_inputs, tiny_model

pytestmark = pytest.mark.openvino


def uneven(spec: TinySpec) -> torch.nn.Module:
    """A tiny model of ``spec`` with layer 0 at 2 of 4 heads and both FFNs at different widths."""
    model = tiny_model(spec)
    surgery.convert(model, HeadPruningStrategy(heads={0: [1, 2]}))
    surgery.convert(model, FFNPruningStrategy(neurons={0: list(range(20)), 1: list(range(5))}))
    return model


def calibration(spec: TinySpec) -> list[dict[str, torch.Tensor]]:
    return [tiny_inputs(spec, batch=8, seq=12, seed=seed) for seed in range(3)]


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_the_ir_of_every_family_with_uneven_heads_and_an_empty_ffn_reloads_and_matches(family, uneven_exports) -> None:
    # The session's IR of the family's uneven model (conftest ``uneven_exports``): heads 1, 4, 3 of 4 and FFN
    # widths 9, 0, 11 of 12. OpenVINO returns an empty tensor for a zero-sized product; the export serves the
    # width-0 layer as one zero neuron. A classifier for every other family, a bare encoder for the rest.
    exported = uneven_exports.openvino(family)
    model, spec, artefact = exported["model"].eval(), exported["spec"], exported["artefact"]
    assert [(layer.heads, layer.ffn_width) for layer in surgery.inspect(model).layers] == [(1, 9), (4, 0), (3, 11)]
    assert artefact.parity["max_abs_diff"] < 1e-4
    assert artefact.output == ("logits" if spec.task == "seq-cls" else "last_hidden_state")
    assert {OV_XML, "openvino_model.bin", "config.json", OV_INFO} <= set(artefact.files)
    served = get_runtime("openvino").load(artefact.directory, config=model.config, threads=1)
    # Other batches and lengths than the parity check's: the IR's batch and sequence are dynamic.
    for batch, seq in ((5, 11), (1, 3), (3, 7)):
        inputs = tiny_inputs(spec, batch=batch, seq=seq)
        with torch.no_grad():
            torch.testing.assert_close(main_output(served, inputs), main_output(model, inputs), atol=1e-4, rtol=0)
    assert surgery.adapter_for(model).layer(1).ffn.width == 0  # the caller's model is not changed


@pytest.mark.slow
def test_base_encoder_ir_with_padding_matches_on_real_tokens(tmp_path) -> None:
    spec = TinySpec("bert")
    model = uneven(spec).eval()
    report = export_openvino(model, tmp_path / "ir", batch=3, seq=9, threads=1)
    assert report.output == "last_hidden_state" and report.steps == ["head-prune", "ffn-prune"]
    assert report.inputs == ["input_ids", "attention_mask", "token_type_ids"] and report.precision == "f32"
    saved = json.loads((tmp_path / "ir" / OV_INFO).read_text())
    assert saved["parity"]["max_abs_diff"] < 1e-4 and saved["inference_precision_hint"] == "f32"
    served = OpenVinoModel(tmp_path / "ir" / OV_XML, config=model.config, threads=1)
    assert served.compiled.get_property("INFERENCE_PRECISION_HINT").to_string() == "f32"
    assert int(served.compiled.get_property("INFERENCE_NUM_THREADS")) == 1
    inputs = tiny_inputs(spec, batch=4, seq=10)
    inputs["attention_mask"][1, 6:] = 0
    torch.testing.assert_close(main_output(served, inputs), main_output(model, inputs), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_int8_is_calibrated_its_drift_recorded_and_it_needs_calibration(tmp_path) -> None:
    spec = TinySpec("bert", task="seq-cls")
    model = uneven(spec).eval()
    runtime = get_runtime("openvino-int8")
    artefact = runtime.write_artefact(model, tmp_path / "q", calibration=calibration(spec), threads=1)
    info = artefact.info
    assert info["precision"] == "int8" and info["int8_quantization"]["model_type"] == "transformer"
    assert info["int8_quantization"]["calibration_texts"] == 24  # each text unpadded
    assert 0 < info["int8_quantization"]["calibration_items"] <= 24  # texts of one length as one item
    assert info["int8_quantization"]["smooth_quant_alpha"] == 0.95
    assert 0.9 < artefact.parity["mean_cosine"] <= 1.0 + 1e-9 and artefact.parity["max_abs_diff"] > 0
    xml = (artefact.directory / OV_XML).read_text()
    assert "FakeQuantize" in xml or "FakeConvert" in xml  # the IR is quantized, not the fp32 one again
    served = runtime.load(artefact.directory, config=model.config, threads=1)
    inputs = tiny_inputs(spec, batch=5, seq=11)
    torch.testing.assert_close(served(**inputs).logits, model(**inputs).logits, atol=0.3, rtol=0)
    with pytest.raises(ConfigError, match="--calibration FILE"):
        runtime.write_artefact(model, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def _ranges(ov_model) -> dict[str, list[np.ndarray]]:
    """Every FakeQuantize node's input and output ranges (what calibration set)."""
    return {op.get_friendly_name(): [np.asarray(op.input_value(i).get_node().get_data(), dtype=np.float64)
                                     for i in range(1, 5)]
            for op in ov_model.get_ordered_ops() if op.get_type_name() == "FakeQuantize"}


@pytest.mark.slow
def test_texts_of_one_length_calibrate_together_to_the_ranges_of_one_text_an_item() -> None:
    # NNCF runs each group of equal-length texts as one batch with batchwise statistics: every text's statistics stay
    # its own, so the ranges are those of one text an item (NNCF's own way, and the library's before), up to float
    # rounding of a batched product, and no padding enters.
    import nncf

    from surgery.runtimes.openvino import openvino_ir
    from surgery.runtimes.shared.graph_export import SingleOutput

    spec = TinySpec("bert", task="seq-cls")
    model = uneven(spec).eval()
    batches = calibration(spec)
    for seed, batch in enumerate(batches):  # texts of 6 to 12 tokens: seven lengths, most shared by several texts
        for row in range(8):
            batch["attention_mask"][row, 12 - 2 * seed - row % 3:] = 0
    names = ["input_ids", "attention_mask", "token_type_ids"]
    items = openvino_ir.calibration_examples(batches, names)
    groups = openvino_ir.length_groups(items)
    assert sum(len(g["input_ids"]) for g in groups) == len(items) == 24 and len(groups) < len(items) / 2
    assert all(g["attention_mask"].all() for g in groups)  # no padding
    inputs = {name: torch.as_tensor(value) for name, value in items[0].items()}
    with torch.no_grad():
        ir = openvino_ir.convert_to_ir(SingleOutput(model, "logits", names), inputs)
    grouped, info = openvino_ir.quantize(ir, items)
    assert (info.calibration_texts, info.calibration_items) == (24, len(groups))
    assert info.calibration_tokens == sum(item["input_ids"].size for item in items)
    advanced = nncf.AdvancedQuantizationParameters(
        smooth_quant_alphas=nncf.AdvancedSmoothQuantParameters(matmul=openvino_ir.SMOOTH_QUANT_ALPHA))
    with openvino_ir._quiet():
        alone = nncf.quantize(ir, nncf.Dataset(items), model_type=nncf.ModelType.TRANSFORMER, subset_size=len(items),
                              fast_bias_correction=True, advanced_parameters=advanced)
    theirs, ours = _ranges(alone), _ranges(grouped)
    assert theirs and sorted(theirs) == sorted(ours)
    for name, values in theirs.items():
        for a, b in zip(values, ours[name], strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6 * max(float(np.abs(a).max()), 1e-6), err_msg=name)


@pytest.mark.slow
def test_cli_export_openvino_int8_and_the_sentence_transformers_layout(tmp_path) -> None:
    from transformers import BertTokenizer

    spec = TinySpec("bert")
    saved = surgery.save_pretrained(uneven(spec), tmp_path / "m")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *(f"w{i}" for i in range(95))]
    BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}).save_pretrained(saved)
    (saved / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (saved / "1_Pooling").mkdir()
    (saved / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                                 "pooling_mode_mean_tokens": True}))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(f"w{(i * j) % 95}" for j in range(i % 7 + 2)) for i in range(60)))
    runner = CliRunner()
    result = runner.invoke(app, ["export", str(saved), "--out", str(tmp_path / "ir"), "--runtime", "openvino-int8",
                                 "--calibration", str(corpus), "--calibration-texts", "40", "--seq", "8"])
    assert result.exit_code == 0, result.output
    assert "int8 drift" in result.stdout and "NNCF transformer" in result.stdout
    files = {p.name for p in (tmp_path / "ir").iterdir()}
    assert {OV_XML, "openvino_model.bin", "config.json", OV_INFO, "tokenizer.json"} <= files
    info = json.loads((tmp_path / "ir" / OV_INFO).read_text())
    assert info["int8_quantization"]["calibration_texts"] == 40 and info["int8_drift"]["mean_cosine"] > 0.9
    result = runner.invoke(app, ["export", str(saved), "--out", str(tmp_path / "st"), "--runtime", "openvino",
                                 "--format", "sentence-transformers"])
    assert result.exit_code == 0, result.output
    assert "backend='openvino'" in result.stdout
    st = tmp_path / "st"
    assert (st / "openvino" / OV_XML).is_file() and (st / "modules.json").is_file()
    assert (st / "1_Pooling" / "config.json").is_file() and (st / "config.json").is_file()
    assert (st / "tokenizer.json").is_file() or (st / "vocab.txt").is_file()


@pytest.mark.slow
def test_cli_bench_runs_the_openvino_runtimes_side_by_side(tmp_path) -> None:
    from transformers import BertTokenizer

    saved = surgery.save_pretrained(tiny_model(TinySpec("bert")), tmp_path / "m")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *(f"w{i}" for i in range(95))]
    BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}).save_pretrained(saved)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(f"w{(i * j) % 95}" for j in range(i % 5 + 2)) for i in range(40)))
    result = CliRunner().invoke(app, [
        "bench", str(saved), "--runtime", "torch", "--runtime", "openvino", "--runtime", "openvino-int8",
        "--calibration", str(corpus), "--batch-size", "2", "--seq-len", "8", "--repeats", "2", "--warmup", "0",
        "--threads", "1", "--json", str(tmp_path / "b.json")])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "b.json").read_text())["models"]
    assert [m["runtime"] for m in rows] == ["torch", "openvino", "openvino-int8"]
    # Every row times its own artefact: the IR files, and the int8 one is another IR than the f32 one.
    assert rows[1]["weights_bytes"] > 0 and rows[2]["weights_bytes"] != rows[1]["weights_bytes"]
    assert "openvino-int8 artefact size" in rows[2]["memory_method"]


# -- openvino-bf16: the same f32 IR, recorded and served with the bf16 hint -----------------------------------
def _bf16_here() -> str | None:
    return get_runtime("openvino-bf16", require_available=False).unavailable()


@pytest.mark.slow
def test_the_ir_records_the_precision_it_was_checked_at(tmp_path) -> None:
    import openvino as ov

    from surgery.runtimes.openvino.openvino_export import PRECISION_KEY, ir_precision

    spec = TinySpec("bert")
    artefact = get_runtime("openvino").write_artefact(tiny_model(spec), tmp_path / "ir", threads=1)
    read = ov.Core().read_model(str(artefact.directory / OV_XML))  # plain openvino, no surgery in between
    assert str(read.get_rt_info(list(PRECISION_KEY)).value) == "f32" and ir_precision(read) == "f32"
    assert artefact.info["inference_precision_hint"] == "f32" and artefact.info["bf16_drift"] is None
    served = get_runtime("openvino").load(artefact.directory, config=tiny_model(spec).config, threads=1)
    assert served.precision == "f32"


@pytest.mark.slow
@pytest.mark.skipif(_bf16_here() is None, reason="this CPU has bf16 products: the refusal is not reachable here")
def test_a_bf16_export_where_openvino_cannot_run_bf16_is_refused_in_one_line(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"compiled the IR for f32, not bf16: this CPU has no bf16 products"):
        export_openvino(tiny_model(TinySpec("bert")), tmp_path / "ir", precision="bf16", batch=2, seq=8, threads=1)
    assert not (tmp_path / "ir").exists()
    with pytest.raises(ConfigError, match="int8 and precision 'bf16' exclude each other"):
        export_openvino(tiny_model(TinySpec("bert")), tmp_path / "ir", precision="bf16", int8=True)


@pytest.mark.slow
@pytest.mark.skipif(_bf16_here() is not None, reason=f"openvino-bf16 is not available here: {_bf16_here()}")
@pytest.mark.parametrize("task", ["base", "seq-cls"])
def test_openvino_bf16_runs_in_bf16_within_its_gate_and_plain_openvino_gets_bf16(tmp_path, task) -> None:
    import openvino as ov

    from surgery.runtimes.openvino.openvino_export import BF16_MIN_COSINE, PRECISION_KEY, served_precision

    spec = TinySpec("bert", task=task)
    model = uneven(spec).eval()
    runtime = get_runtime("openvino-bf16")
    artefact = runtime.write_artefact(model, tmp_path / "ir", threads=1)
    info = artefact.info
    assert info["precision"] == "bf16" and info["inference_precision_hint"] == "bf16"
    assert info["parity"]["max_abs_diff"] < 1e-4  # the conversion itself, checked in f32
    drift = info["bf16_drift"]
    assert BF16_MIN_COSINE <= drift["min_cosine"] < 1.0 and drift["max_abs_diff"] > 0  # it really ran bf16
    served = runtime.load(artefact.directory, config=model.config, threads=1)
    assert served.precision == "bf16"
    # A user who knows nothing of surgery: plain openvino reads the recorded hint and compiles for bf16.
    core = ov.Core()
    xml = str(artefact.directory / OV_XML)
    assert str(core.read_model(xml).get_rt_info(list(PRECISION_KEY)).value) == "bf16"
    plain = core.compile_model(xml, "CPU", {"INFERENCE_NUM_THREADS": 1})
    assert served_precision(plain) == "bf16"
    inputs = tiny_inputs(spec, batch=5, seq=11)
    # Every input the IR has, as a tokenizer gives them: an input left unset runs as an empty tensor, and OpenVINO
    # then returns an empty output without a word (a (0, 0, 32) array for this IR without token_type_ids).
    feeds = {k: v.numpy() for k, v in inputs.items()}
    for port in plain.inputs:
        feeds.setdefault(port.get_any_name(), np.zeros_like(feeds["input_ids"]))
    got = plain.create_infer_request().infer(feeds)[plain.outputs[0]]
    assert got.shape[0] == inputs["input_ids"].shape[0]
    torch.testing.assert_close(torch.from_numpy(got.copy()), main_output(served, inputs), atol=1e-6, rtol=0)


@pytest.mark.skipif(_bf16_here() is None, reason="this CPU has bf16 products")
def test_cli_refuses_openvino_bf16_on_this_cpu_in_one_line(tmp_path) -> None:
    saved = surgery.save_pretrained(tiny_model(TinySpec("bert")), tmp_path / "m")
    result = CliRunner().invoke(app, ["export", str(saved), "--out", str(tmp_path / "o"), "--runtime",
                                      "openvino-bf16"])
    assert result.exit_code == 2 and result.stderr.strip().count("\n") == 0
    assert "openvino-bf16" in result.stderr and "avx512_bf16 or amx_bf16" in result.stderr
    assert not (tmp_path / "o").exists()
