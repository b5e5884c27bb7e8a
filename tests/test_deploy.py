"""ONNX export: ONNX Runtime matches PyTorch (<= 1e-4 in fp32) for every family and strategy, on any shape.

Each export costs seconds (torch.export traces with symbolic shapes), so every family's model carries
several strategies at once (uneven heads, uneven FFN widths, a routed Expert Attention layer with its
data-dependent expert gather, a soft prompt), and one BERT model carries the rest (a Top-1-pruned
expert layer, zero-recovery pruning, a DoE task expert plugged in), exported with --optimize, --int8
and labelled data.
"""

from __future__ import annotations

import importlib
import json
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

import surgery
from surgery.cli.app import app
from surgery.runtimes.onnx import INFO_NAME, ExportParityError, MissingDependencyError, OnnxRuntimeModel, export_onnx
from surgery.runtimes.shared.graph_export import agreement, check_parity, export_target, output_scale
from surgery.strategies import (
    ExpertAttentionStrategy,
    FFNPruningStrategy,
    Top1PruningStrategy,
    ZeroRecoveryPruningStrategy,
)
from surgery.strategies.doe.unplug import TaskExpert, UnplugRuntime
from surgery.testing import FAMILIES, TinySpec, main_output, tiny_inputs, tiny_model
from tests.helpers import identical_graphs_traced_once

TOLERANCE = 1e-4



def assert_parity_on_new_shape(model, graph, spec: TinySpec, output: str) -> None:
    """The graph takes another batch size and length (dynamic axes), with padding, and still agrees."""
    runtime = OnnxRuntimeModel(graph, config=model.config, output=output)
    inputs = tiny_inputs(spec, batch=5, seq=13, seed=7)
    with torch.no_grad():
        expected = main_output(model, inputs)
    got = getattr(runtime(**inputs), output)
    assert got.shape == expected.shape
    assert agreement(expected, got).max_abs_diff <= TOLERANCE


@pytest.mark.slow
@pytest.mark.onnx
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_with_stacked_strategies_exports_at_parity(family: str, uneven_exports) -> None:
    # Uneven heads (1, 4, 3) and FFN widths (9, 0: every neuron gone, 11), a routed Expert Attention layer
    # (argmax + gather per example) and a soft prompt, exported once per session (conftest `uneven_exports`).
    exported = uneven_exports.onnx(family)
    model, spec, report = exported["model"], exported["spec"], exported["report"]
    assert [(layer.heads, layer.ffn_width) for layer in surgery.inspect(model).layers][::2] == [(1, 9), (3, 11)]
    assert report.parity.max_abs_diff <= TOLERANCE and report.parity.min_cosine > 0.9999
    assert report.steps == ["head-prune", "ffn-prune", "expert-attention", "soft-prompt"]
    assert report.task == spec.task and report.dynamic_axes["input_ids"] == ["batch", "sequence"]
    saved = json.loads((exported["dir"] / INFO_NAME).read_text())
    assert saved["parity"]["max_abs_diff"] == report.parity.max_abs_diff and saved["opset"] >= 18
    assert_parity_on_new_shape(model, exported["graph"], spec, report.output)
    if family == "distilbert":  # above a tolerance, the check is one line that says what to change
        runtime = OnnxRuntimeModel(exported["graph"], config=model.config, output=report.output)
        inputs = tiny_inputs(spec)
        with torch.no_grad():
            expected = main_output(model, inputs)
        with pytest.raises(ExportParityError, match=r"^export: ONNX Runtime differs from PyTorch by 1.0\de-03 \(max "
                           r"abs, .*; outputs reach .*, so the limit is .*\) on a padded 3x7 batch; pass a larger "
                           r"--tolerance") as info:
            check_parity(expected + 1e-3, runtime, inputs, tolerance=TOLERANCE)
        assert "\n" not in str(info.value)


@pytest.mark.slow
@pytest.mark.onnx
def test_top1_zero_recovery_and_plugged_doe_expert_export_optimized_and_int8(tmp_path) -> None:
    spec = TinySpec("bert", heads=4, head_dim=8, layers=3, ffn=24, task="seq-cls", seed=3)
    model = tiny_model(spec)
    inputs = tiny_inputs(spec, batch=6)
    surgery.convert(model, ExpertAttentionStrategy(layers=[2]))
    surgery.convert(model, Top1PruningStrategy(keep=1), data=[inputs])
    remove = {0: {"qk": [1, 9], "v": [0], "o": [4, 30], "neurons": [2, 3]}}
    surgery.convert(model, ZeroRecoveryPruningStrategy(module_set="all", remove=remove))
    gen = torch.Generator().manual_seed(0)
    expert = TaskExpert("task", {1: {"qk": [0, 5], "v": [3], "o": [1, 2], "neurons": list(range(0, 24, 3))}},
                        prompt=torch.randn(2, spec.hidden, generator=gen))
    labelled = [{**tiny_inputs(spec, batch=4, seed=s), "labels": torch.tensor([0, 1, 2, 1])} for s in range(2)]
    with UnplugRuntime(model, [expert]).use("task") as plugged:
        report = export_onnx(plugged, tmp_path / "onnx", batch=3, seq=10, optimize=True, int8=True, data=labelled)
        assert report.parity.max_abs_diff <= TOLERANCE
        assert report.optimized and "DynamicQuantizeMatMul" in report.optimized  # int8 MatMuls fused
        # int8 changes the numbers a little, not the function: the drift is recorded, not a failure
        assert report.int8 and report.int8_drift.max_abs_diff > 0 and report.int8_drift.min_cosine > 0.9
        assert report.accuracy_torch is not None and report.accuracy_onnx is not None
        runtime = OnnxRuntimeModel(tmp_path / "onnx" / "model.onnx", config=plugged.config, output="logits")
        with torch.no_grad():
            expected = main_output(plugged, inputs)
        assert agreement(expected, runtime(**inputs).logits).min_cosine > 0.9
    assert report.steps == ["expert-attention", "top1-prune", "zero-recovery-prune"]


class OffByRuntime(torch.nn.Module):
    """Stands in for a graph runtime: serves ``served`` whatever the inputs (check_parity reads ``.output``)."""

    output = "last_hidden_state"

    def __init__(self, served: torch.Tensor) -> None:
        super().__init__()
        self.served = served

    def forward(self, **inputs: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(last_hidden_state=self.served)


def _hidden(magnitude: float, padded: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A 2 x 3 x 4 per-token output whose real tokens reach ``magnitude``; the second example has one padded
    position, holding ``padded`` when given, and its inputs."""
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    values = torch.linspace(-magnitude, magnitude, 24).reshape(2, 3, 4)
    if padded is not None:
        values[1, 2] = padded
    return values, {"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": mask}


def test_fp32_parity_scales_the_tolerance_by_the_outputs_magnitude() -> None:
    # fp32 rounding error grows with the values: 3e-4 on outputs reaching 5 is within 1e-4 x 5 (AVX-512 kernels
    # moved all-MiniLM-L6-v2's hidden states, which reach 5.8, by 1.56e-4, and the old absolute gate refused it)
    expected, inputs = _hidden(5.0)
    found = check_parity(expected, OffByRuntime(expected + 3e-4), inputs, tolerance=1e-4)
    assert 2.9e-4 < found.max_abs_diff < 3.1e-4
    assert output_scale(expected, inputs["attention_mask"]) == pytest.approx(5.0)


def test_fp32_parity_below_magnitude_1_stays_the_absolute_tolerance() -> None:
    expected, inputs = _hidden(0.5)
    with pytest.raises(ExportParityError, match=r"^export: ONNX Runtime differs from PyTorch by 3.0\de-04 \(max abs, "
                       r"min cosine 1.000000; outputs reach 0.5, so the limit is the tolerance 0.0001\) on a padded "
                       r"2x3 batch; pass a larger --tolerance if that is acceptable$") as info:
        check_parity(expected, OffByRuntime(expected + 3e-4), inputs, tolerance=1e-4)
    assert "\n" not in str(info.value)
    # above magnitude 1 the message names the scaled limit and how it was reached
    expected, inputs = _hidden(2.5)
    with pytest.raises(ExportParityError, match=r"by 3.0\de-04 \(max abs, min cosine 1.000000; outputs reach 2.5, so "
                       r"the limit is 2.50e-04 = tolerance 0.0001 x 2.5\) on a padded 2x3 batch; pass a larger"):
        check_parity(expected, OffByRuntime(expected + 3e-4), inputs, tolerance=1e-4)


def test_fp32_parity_padded_positions_do_not_widen_the_limit() -> None:
    # Real tokens reach 0.5, the padded position 50: the limit stays 1e-4, not 5e-3.
    expected, inputs = _hidden(0.5, padded=50.0)
    served = expected.clone()
    served[inputs["attention_mask"].bool()] += 3e-4  # off on real tokens only: the padding matches exactly
    assert output_scale(expected) == 50.0 and output_scale(expected, inputs["attention_mask"]) == 0.5
    with pytest.raises(ExportParityError, match=r"outputs reach 0.5, so the limit is the tolerance 0.0001\)"):
        check_parity(expected, OffByRuntime(served), inputs, tolerance=1e-4)
    # and a difference on padded positions is still compared, at the real tokens' scale
    served = expected.clone()
    served[1, 2] += 3e-4
    with pytest.raises(ExportParityError, match=r"by [23]\.\d+e-04 .*outputs reach 0.5"):
        check_parity(expected, OffByRuntime(served), inputs, tolerance=1e-4)


def test_task_must_match_the_head() -> None:
    with pytest.raises(surgery.ConfigError, match="needs a ForSequenceClassification model but this is a BertModel"):
        export_target(tiny_model(TinySpec("bert")), "seq-cls")
    base, output, task = export_target(tiny_model(TinySpec("bert", task="seq-cls")), "base")
    assert (type(base).__name__, output, task) == ("BertModel", "last_hidden_state", "base")


def test_cli_without_the_extra_says_what_to_install(tmp_path, monkeypatch) -> None:
    real = importlib.import_module

    def without_onnxruntime(name: str, *args, **kwargs):
        if name == "onnxruntime":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", without_onnxruntime)
    saved = surgery.save_pretrained(tiny_model(TinySpec("bert")), tmp_path / "m")
    result = CliRunner().invoke(app, ["export", str(saved), "--out", str(tmp_path / "onnx")])
    assert result.exit_code == 2
    assert result.stderr == ("error: ONNX export needs onnxruntime (not installed); install the extra: "
                             "pip install 'encoder-surgery[onnx]'\n")
    with pytest.raises(MissingDependencyError):
        export_onnx(tiny_model(TinySpec("bert")), tmp_path / "x")


@pytest.mark.slow
@pytest.mark.onnx
def test_cli_bench_across_runtimes_side_by_side(tmp_path, monkeypatch) -> None:
    # Each model is written for ONNX Runtime fp32 and int8 (no calibration: the same fp32 graph, then quantized):
    # traced once per model, each graph still written, checked, quantized and timed.
    identical_graphs_traced_once(monkeypatch)
    spec = TinySpec("bert", task="seq-cls")
    original = surgery.save_pretrained(tiny_model(spec), tmp_path / "original")
    pruned_model = tiny_model(spec)
    surgery.convert(pruned_model, FFNPruningStrategy(neurons={0: list(range(20)), 1: list(range(30))}))
    pruned = surgery.save_pretrained(pruned_model, tmp_path / "pruned")
    result = CliRunner().invoke(app, [
        "bench", str(pruned), "--against", str(original), "--runtime", "torch", "--runtime", "onnxruntime",
        "--runtime", "onnxruntime-int8", "--batch-size", "2", "--seq-len", "8", "--repeats", "2", "--warmup", "0",
        "--json", str(tmp_path / "bench.json")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "bench.json").read_text())
    names = [m["name"] for m in report["models"]]
    assert names == [f"{p} [{r}]" for p in (original, pruned) for r in ("torch", "onnxruntime", "onnxruntime-int8")]
    assert [m["runtime"] for m in report["models"]][:3] == ["torch", "onnxruntime", "onnxruntime-int8"]
    sizes = {m["name"]: m["weights_bytes"] for m in report["models"]}
    assert sizes[f"{pruned} [onnxruntime-int8]"] < sizes[f"{pruned} [onnxruntime]"]  # int8 MatMul weights
    assert len(report["comparisons"]) == 5 and all(c["reference"] == f"{original} [torch]"
                                                   for c in report["comparisons"])


def test_bench_rejects_an_unknown_runtime(tmp_path) -> None:
    saved = surgery.save_pretrained(tiny_model(TinySpec("bert")), tmp_path / "m")
    result = CliRunner().invoke(app, ["bench", str(saved), "--runtime", "tensorrt"])
    assert result.exit_code == 2 and result.stderr.startswith("error: runtime 'tensorrt' is not one of torch")


@pytest.mark.slow
@pytest.mark.onnx
def test_int8_weights_are_scaled_per_output_channel_unless_asked_per_tensor(tmp_path, uneven_exports) -> None:
    import onnx
    from onnx import numpy_helper

    model = tiny_model(TinySpec("bert"))
    # Per channel (the default) from the library; per tensor from the command line's --per-tensor, which passes
    # per_channel=False to the same export_onnx (an export of its own from the library repeated that graph).
    report = export_onnx(model, tmp_path / "int8-True", task="base", int8=True, per_channel=True, batch=2, seq=8)
    assert report.int8_per_channel is True
    surgery.save_pretrained(model, tmp_path / "saved")
    result = CliRunner().invoke(app, ["export", str(tmp_path / "saved"), "--out", str(tmp_path / "int8-False"),
                                      "--runtime", "onnxruntime-int8", "--per-tensor", "--seq", "8"])
    assert result.exit_code == 0, result.output
    assert "per-tensor weights" in result.output
    scales: dict[bool, list[tuple[int, ...]]] = {}
    for per_channel in (True, False):
        out = tmp_path / f"int8-{per_channel}"
        assert json.loads((out / INFO_NAME).read_text())["int8_per_channel"] is per_channel
        graph = onnx.load(str(out / "model.onnx"))
        scales[per_channel] = [numpy_helper.to_array(t).shape for t in graph.graph.initializer
                               if t.name.endswith("_scale")]
    # Per channel: the quantized weights carry one scale per output column; per tensor: a single scale.
    assert scales[True] and any(len(shape) == 1 and shape[0] > 1 for shape in scales[True])
    assert scales[False] and all(int(torch.tensor(shape).prod()) == 1 for shape in scales[False])
    # An fp32 export records no int8 scaling: the session's fp32 export (conftest ``uneven_exports``), not one more.
    assert uneven_exports.onnx("bert")["report"].int8_per_channel is None


@pytest.mark.slow
@pytest.mark.onnx
def test_int8_fp32_keeps_the_named_parts_of_every_layer_in_fp32(tmp_path, monkeypatch) -> None:
    import onnx

    from surgery.runtimes.onnx.onnx_export import part_modules

    # The four exports quantize one model's fp32 graph with different parts left in fp32: it is traced once, and
    # each export still writes, checks and quantizes its own graph.
    reused = identical_graphs_traced_once(monkeypatch)

    model = tiny_model(TinySpec("bert", layers=2))
    _ = surgery.convert(model, FFNPruningStrategy(ratio=0.5))  # uneven widths: parts are found by role, not shape
    assert part_modules(model, ["ffn"]) == {f"encoder.layer.{i}.{n}.dense" for i in (0, 1)
                                            for n in ("intermediate", "output")}
    counts = {}
    for parts in ((), ("ffn",), ("ffn-down",), ("attention", "ffn")):
        report = export_onnx(model, tmp_path / "-".join(parts or ("all",)), task="base", int8=True,
                             int8_fp32=parts, batch=2, seq=8)
        graph = onnx.load(str(tmp_path / "-".join(parts or ("all",)) / "model.onnx"))
        counts[parts] = (report.int8_fp32_nodes, sum(n.op_type == "MatMul" for n in graph.graph.node))
        assert report.int8_fp32 == list(parts)
    # 2 layers: 2 FFN products each; attention adds q, k, v and the output projection.
    assert [counts[p][0] for p in counts] == [0, 4, 2, 12] and len(reused) == 3
    # Every product kept in fp32 is a plain MatMul in the graph again (the score products always are).
    assert counts[("ffn",)][1] - counts[()][1] == 4 and counts[("attention", "ffn")][1] - counts[()][1] == 12
    with pytest.raises(surgery.ConfigError, match="needs --int8"):
        export_onnx(model, tmp_path / "x", task="base", int8_fp32=["ffn"])
    with pytest.raises(surgery.ConfigError, match="'mlp' is not one of"):
        export_onnx(model, tmp_path / "y", task="base", int8=True, int8_fp32=["mlp"])
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@pytest.mark.slow
@pytest.mark.onnx
def test_cli_bench_int8_fp32_benches_the_mixed_precision_graph(tmp_path, monkeypatch, bert_graphs) -> None:
    identical_graphs_traced_once(monkeypatch, bert_graphs)  # both benches quantize the same fp32 graph: traced once
    saved = surgery.save_pretrained(tiny_model(TinySpec("bert")), tmp_path / "m")
    args = ["bench", str(saved), "--batch-size", "2", "--seq-len", "8", "--repeats", "2", "--warmup", "0"]
    int8 = ["--runtime", "onnxruntime-int8"]
    result = CliRunner().invoke(app, [*args, *int8, "--json", str(tmp_path / "full.json")])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, [*args, *int8, "--int8-fp32", "ffn", "--json", str(tmp_path / "mixed.json")])
    assert result.exit_code == 0, result.output
    size = {name: {m["runtime"]: m["weights_bytes"] for m in json.loads((tmp_path / f"{name}.json").read_text())
                   ["models"]} for name in ("full", "mixed")}
    # The FFN weights stay fp32 in the mixed graph, so it is larger than the fully quantized one.
    assert size["mixed"]["onnxruntime-int8"] > size["full"]["onnxruntime-int8"]
    result = CliRunner().invoke(app, [*args, "--int8-fp32", "ffn"])
    assert result.exit_code == 2 and "--runtime onnxruntime-int8" in result.stderr
    result = CliRunner().invoke(app, [*args, *int8, "--int8-fp32", "mlp"])
    assert result.exit_code == 2 and "'mlp' is not one of" in result.stderr


# -- issue 22: the exported tokenizer.json serves as the source model's tokenizer does -------
LONG_TEXTS = [" ".join(f"w{(i * 7 + j) % 90}" for j in range(n)) for i, n in enumerate((75, 3, 40, 33, 12))]


def _source_with_tokenizer(root, *, model_max_length: int, sentence_max: int | None = None):
    """A plain HF directory (tiny BERT, 72 positions) with a word-level tokenizer; a sentence-transformers one too."""
    from transformers import BertTokenizer

    from surgery.embedding import SentenceConfig
    from surgery.embedding.pooling import write_sentence_transformers_files

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {t: i for i, t in enumerate(specials + [f"w{i}" for i in range(94)])}
    model = tiny_model(TinySpec("bert"))
    model.save_pretrained(root)
    BertTokenizer(vocab=vocab, model_max_length=model_max_length).save_pretrained(root)
    if sentence_max is not None:
        write_sentence_transformers_files(SentenceConfig(max_seq_length=sentence_max), root,
                                          model.config.hidden_size)
    return root


def _served_ids(directory) -> list[list[int]]:
    """What a stock server gets: tokenizer.json loaded as it is, by the tokenizers library."""
    from tokenizers import Tokenizer

    return [e.ids for e in Tokenizer.from_file(str(directory / "tokenizer.json")).encode_batch(LONG_TEXTS)]


@pytest.fixture(scope="module")
def bert_graphs() -> dict[str, bytes]:
    """ONNX traces shared by this module's tests that export the tiny BERT (``identical_graphs_traced_once``): the
    int8-fp32 bench and the tokenizer exports write the same model's graph, traced once for all three."""
    return {}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "sentence-transformers"])
def test_exported_tokenizer_json_encodes_long_texts_as_the_source(fmt: str, tmp_path, monkeypatch,
                                                                  bert_graphs) -> None:
    from transformers import AutoTokenizer

    # The tokenizer.json written beside the graph is under test, not the graph: the model is the tiny BERT the
    # int8-fp32 bench exports too, traced once (each export still writes, checks and records its own graph).
    identical_graphs_traced_once(monkeypatch, bert_graphs)
    sentence_max = 40 if fmt == "sentence-transformers" else None
    source = _source_with_tokenizer(tmp_path / "src", model_max_length=48, sentence_max=sentence_max)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["export", str(source), "--out", str(out), "--format", fmt])
    assert result.exit_code == 0, result.output
    tokenizer = AutoTokenizer.from_pretrained(source)
    # The source as its consumers call it: transformers truncates at model_max_length, sentence-transformers
    # at its max_seq_length; both pad to the longest text of the batch.
    expected = tokenizer(LONG_TEXTS, truncation=True, padding=True,
                         **({"max_length": sentence_max} if sentence_max else {}))["input_ids"]
    assert max(len(tokenizer(t)["input_ids"]) for t in LONG_TEXTS) > 48 > 32  # texts longer than both limits
    assert _served_ids(out) == expected
    assert len(expected[0]) == (sentence_max or 48)
    if fmt == "sentence-transformers":
        pytest.importorskip("sentence_transformers")
        from sentence_transformers import SentenceTransformer

        served = SentenceTransformer(str(source), device="cpu").tokenize(LONG_TEXTS)["input_ids"].tolist()
        assert _served_ids(out) == served
        assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == sentence_max
