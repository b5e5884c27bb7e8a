"""Activation smoothing before int8 (SmoothQuant): exact in fp32, in the exported graph, and it lowers
the int8 error of activations with outlier channels."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from typer.testing import CliRunner

import surgery
from surgery.cli.app import app
from surgery.runtimes.onnx import export_onnx
from surgery.runtimes.onnx.onnx_export import part_modules
from surgery.runtimes.shared.smooth import SmoothedLinear, smooth_linears, smoothing_scale, text_calibration_batches
from surgery.strategies import FFNPruningStrategy, HeadPruningStrategy
from surgery.testing import FAMILIES, TinySpec, main_output, tiny_inputs, tiny_model


@settings(max_examples=40, deadline=None)
@given(d_in=st.integers(1, 24), d_out=st.integers(1, 24), bias=st.booleans(), seed=st.integers(0, 2**16),
       alpha=st.floats(0.0, 1.0))
def test_a_smoothed_linear_computes_the_same_function(d_in: int, d_out: int, bias: bool, seed: int,
                                                      alpha: float) -> None:
    torch.manual_seed(seed)
    linear = nn.Linear(d_in, d_out, bias=bias)
    x = torch.randn(5, d_in) * torch.logspace(-1, 1.5, d_in)  # uneven channels, as in a real encoder
    scale = smoothing_scale(x.abs().amax(0), linear.weight, alpha)
    assert scale.shape == (d_in,) and bool((scale > 0).all())
    assert torch.allclose(SmoothedLinear(linear, scale)(x), linear(x), rtol=1e-5, atol=1e-5)


def test_smoothing_scale_leaves_dead_channels_alone_and_refuses_a_bad_alpha() -> None:
    scale = smoothing_scale(torch.tensor([9.0, 0.0, 4.0]), torch.tensor([[1.0, 1.0, 0.0]]), alpha=0.5)
    assert scale.tolist() == [3.0, 1.0, 1.0]  # 0 activation and 0 weight columns keep scale 1
    with pytest.raises(surgery.ConfigError, match="alpha must be between 0 and 1"):
        smoothing_scale(torch.ones(2), torch.ones(2, 2), alpha=1.5)
    with pytest.raises(surgery.ConfigError, match="positive"):
        SmoothedLinear(nn.Linear(2, 2), torch.tensor([1.0, 0.0]))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_is_smoothed_through_its_anatomy_and_keeps_its_outputs(family: str) -> None:
    spec = TinySpec(family, layers=2, heads=4, head_dim=4, ffn=12)
    model = tiny_model(spec).eval()
    surgery.convert(model, HeadPruningStrategy(heads={0: [1]}))     # uneven heads
    surgery.convert(model, FFNPruningStrategy(neurons={1: [0, 5]}))  # uneven widths
    expected_names = part_modules(model, ["attention", "ffn"])
    probe = tiny_inputs(spec, batch=3, seq=9, seed=11)
    with torch.no_grad():
        before = main_output(model, probe)
        info = smooth_linears(model, [tiny_inputs(spec, seed=s) for s in range(3)], alpha=0.85)
        after = main_output(model, probe)
    assert info.modules == len(expected_names) > 0 and info.calibration_batches == 3
    assert all(isinstance(model.get_submodule(n), SmoothedLinear) for n in expected_names)
    assert torch.allclose(after, before, atol=1e-5), (after - before).abs().max()


def _fake_int8(x: torch.Tensor) -> torch.Tensor:
    """ONNX Runtime's DynamicQuantizeLinear: one asymmetric uint8 scale per tensor, range including 0."""
    low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    step = (high - low) / 255
    zero = round(-low / step)
    return ((x / step).round() + zero).clamp(0, 255).sub(zero) * step


def test_smoothing_lowers_the_int8_activation_error_of_outlier_channels() -> None:
    # One channel ten times larger than the rest, as before every attention and FFN-up projection of
    # all-MiniLM-L6-v2 (experiments/int8/results/int8_error_sources.json): it sets the per-tensor int8 scale of
    # the input.
    torch.manual_seed(0)
    spec = TinySpec("bert", layers=1, heads=4, head_dim=16, ffn=128)
    model = tiny_model(spec).eval()
    with torch.no_grad():
        model.embeddings.LayerNorm.weight[3] = 12.0
    batches = [tiny_inputs(spec, batch=8, seq=12, seed=s) for s in range(4)]
    smoothed = copy.deepcopy(model)
    smooth_linears(smoothed, batches, alpha=0.85)
    captured: dict[str, torch.Tensor] = {}
    query = model.encoder.layer[0].attention.self.query
    handle = query.register_forward_hook(lambda _m, inputs, _o: captured.setdefault("x", inputs[0]))
    with torch.no_grad():
        model(**batches[0])
    handle.remove()
    x = captured["x"]
    exact = query(x)
    plain_error = (query.weight @ (_fake_int8(x) - x).transpose(-1, -2)).norm()
    wrapped = smoothed.encoder.layer[0].attention.self.query
    assert isinstance(wrapped, SmoothedLinear)
    flat = x * wrapped.inv_scale
    smoothed_error = (wrapped.linear.weight @ (_fake_int8(flat) - flat).transpose(-1, -2)).norm()
    assert torch.allclose(wrapped(x), exact, atol=1e-4)
    assert smoothed_error < 0.6 * plain_error, (float(smoothed_error), float(plain_error))


@pytest.mark.slow
@pytest.mark.onnx
def test_export_with_calibration_puts_the_smoothing_in_the_graph_and_records_it(tmp_path) -> None:
    import onnx

    spec = TinySpec("bert", layers=2)
    model = tiny_model(spec)
    batches = [tiny_inputs(spec, seed=s) for s in range(2)]
    plain = export_onnx(model, tmp_path / "plain", int8=True, batch=2, seq=8)
    smoothed = export_onnx(model, tmp_path / "smooth", int8=True, batch=2, seq=8, calibration=batches,
                           smooth_alpha=0.7, int8_fp32=["ffn-down"])
    assert plain.int8_smoothing is None
    info = smoothed.int8_smoothing
    # 2 layers x (q, k, v, attention output, FFN up); the FFN down products stay fp32, so unsmoothed.
    assert info is not None and info.alpha == 0.7 and info.modules == 10 and info.calibration_batches == 2
    assert smoothed.parity.max_abs_diff <= 1e-4  # the fp32 graph, smoothing included, matches PyTorch

    def quantized_inputs(name: str) -> list[str]:
        """The operator producing each input that ONNX Runtime quantizes at run time."""
        nodes = onnx.load(str(tmp_path / name / "model.onnx")).graph.node
        producer = {out: node.op_type for node in nodes for out in node.output}
        return [producer.get(n.input[0], "input") for n in nodes if n.op_type == "DynamicQuantizeLinear"]

    # Without smoothing the quantized inputs come from LayerNorm, attention and GELU; with it, every
    # one is the smoothing Mul. Per layer: one shared by q, k and v, the attention output, the FFN up.
    assert "Mul" not in quantized_inputs("plain")
    assert quantized_inputs("smooth") == ["Mul"] * 6
    saved = json.loads((tmp_path / "smooth" / "surgery-onnx.json").read_text())
    assert saved["int8_smoothing"]["modules"] == 10
    with pytest.raises(surgery.ConfigError, match="need --int8"):
        export_onnx(model, tmp_path / "x", calibration=batches)
    assert not (tmp_path / "x").exists()


def test_calibration_batches_take_a_seeded_sample() -> None:
    from transformers import BertTokenizer

    tok = BertTokenizer(vocab={t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b"])})
    texts = [" ".join(["a"] * (i % 5 + 1)) for i in range(100)]
    first = text_calibration_batches(texts, tok, max_texts=50, batch_size=16)
    again = text_calibration_batches(texts, tok, max_texts=50, batch_size=16)
    assert [b["input_ids"].shape[0] for b in first] == [16, 16, 16, 2]
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first, again, strict=True))
    with pytest.raises(surgery.ConfigError, match="at least one text"):
        text_calibration_batches([], tok)


def saved_with_corpus(tmp_path):
    """A tiny saved BERT with a word-level tokenizer, and an 80-line corpus in its vocabulary."""
    from transformers import BertTokenizer

    saved = surgery.save_pretrained(tiny_model(TinySpec("bert")), tmp_path / "m")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *(f"w{i}" for i in range(95))]
    BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}).save_pretrained(saved)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(f"w{(i * j) % 95}" for j in range(i % 7 + 2)) for i in range(80)))
    return saved, corpus


@pytest.mark.slow
@pytest.mark.onnx
def test_cli_export_int8_with_calibration(tmp_path) -> None:
    saved, corpus = saved_with_corpus(tmp_path)
    args = ["export", str(saved), "--seq", "8", "--batch", "2"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "o"), "--runtime", "onnxruntime-int8",
                                      "--calibration", str(corpus),
                                      "--calibration-texts", "40"])
    assert result.exit_code == 0, result.output
    assert "activations smoothed (alpha 0.85" in result.stdout and "calibration" in result.stdout
    info = json.loads((tmp_path / "o" / "surgery-onnx.json").read_text())["int8_smoothing"]
    assert info["calibration_batches"] == 2 and info["modules"] == 12
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "p"), "--runtime", "onnxruntime-int8"])
    assert result.exit_code == 0 and "--calibration YOUR_TEXTS" in result.stdout
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "q"), "--calibration", str(corpus)])
    assert result.exit_code == 2 and "pick an int8 runtime" in result.stderr and not (tmp_path / "q").exists()
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "r"), "--runtime", "onnxruntime-int8",
                                      "--calibration", str(tmp_path / "missing.txt")])
    assert result.exit_code == 2 and "missing.txt" in result.stderr and not (tmp_path / "r").exists()


@pytest.mark.slow
@pytest.mark.onnx
def test_cli_bench_int8_with_calibration_benches_the_smoothed_graph(tmp_path) -> None:
    saved, corpus = saved_with_corpus(tmp_path)
    args = ["bench", str(saved), "--batch-size", "2", "--seq-len", "8", "--repeats", "2", "--warmup", "0"]
    result = CliRunner().invoke(app, [*args, "--runtime", "torch", "--runtime", "onnxruntime-int8", "--calibration",
                                      str(corpus), "--json", str(tmp_path / "b.json")])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "b.json").read_text())["models"]
    assert [m["runtime"] for m in rows] == ["torch", "onnxruntime-int8"] and "int8" in rows[1]["name"]
    result = CliRunner().invoke(app, [*args, "--calibration", str(corpus)])
    assert result.exit_code == 2 and "add --runtime onnxruntime-int8" in result.stderr


@pytest.mark.slow
@pytest.mark.onnx
def test_sentence_transformers_export_smooths_too(tmp_path) -> None:
    from transformers import AutoTokenizer

    from surgery.embedding import SentenceConfig
    from surgery.runtimes.sentence_interop import export_sentence_transformers
    from surgery.runtimes.shared.smooth import text_calibration_batches

    saved, corpus = saved_with_corpus(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(saved)
    batches = text_calibration_batches(corpus.read_text().splitlines(), tokenizer, max_texts=32)
    report = export_sentence_transformers(surgery.from_pretrained(saved), tmp_path / "st", tokenizer=tokenizer,
                                          sentence_config=SentenceConfig(normalize=True), int8=True,
                                          calibration=batches, smooth_alpha=0.8)
    assert report.int8_smoothing is not None and report.int8_smoothing.alpha == 0.8
    assert (tmp_path / "st" / "onnx" / "model.onnx").is_file()
