"""save_stock: a surgered model as a plain Hugging Face directory that transformers loads without surgery."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from transformers import AutoModel, BertTokenizer

import surgery
from surgery.compress.stock_export import save_stock, stock_structure_problem
from surgery.core.errors import StockFormatError
from surgery.core.manifest import MANIFEST_NAME
from surgery.embedding import SentenceConfig, embed_texts
from surgery.embedding.pooling import write_sentence_config
from surgery.persist.tokenizer_files import has_tokenizer
from surgery.strategies import ExpertAttentionStrategy, FFNPruningStrategy, HeadPruningStrategy, LayerDropStrategy
from surgery.testing import FAMILIES, TinySpec, main_output, tiny_inputs, tiny_model


def _auto_class(task: str) -> type:
    return AutoModel if task == "base" else transformers.AutoModelForSequenceClassification


def _cut(spec: TinySpec, drop: list[int]) -> torch.nn.Module:
    model = tiny_model(spec)
    surgery.convert(model, FFNPruningStrategy(ratio=0.5, scope="layer"))
    surgery.convert(model, LayerDropStrategy(layers=drop))
    return model


def _load_stock(cls: type, out: Path) -> torch.nn.Module:
    loaded, info = cls.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return loaded.eval()


@pytest.mark.parametrize("task", ["base", "seq-cls"])
@pytest.mark.parametrize("family", FAMILIES)
def test_uniform_ffn_and_dropped_layer_load_in_plain_transformers(family: str, task: str, tmp_path: Path) -> None:
    spec = TinySpec(family, layers=3, ffn=20, task=task)  # type: ignore[arg-type]
    model = _cut(spec, [1])
    assert stock_structure_problem(model) is None
    out = save_stock(model, tmp_path / "stock")
    assert not (out / MANIFEST_NAME).exists()
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [type(model).__name__]
    loaded = _load_stock(_auto_class(task), out)
    assert type(loaded) is type(model)
    assert loaded.config.num_hidden_layers == 2 and model.config.num_hidden_layers == 3
    inputs = tiny_inputs(spec)
    with torch.no_grad():
        torch.testing.assert_close(main_output(loaded, inputs), main_output(model, inputs), atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_dropping_the_first_layer_is_written_or_refused_never_wrong(family: str, tmp_path: Path) -> None:
    # ModernBERT's first layer has no attention norm: another layer cannot stand in its place in a
    # stock model. Whatever a family allows, a written directory must reproduce the model exactly.
    spec = TinySpec(family, layers=3, ffn=20)
    model = _cut(spec, [0])
    problem = stock_structure_problem(model)
    if problem is not None:
        with pytest.raises(StockFormatError):
            save_stock(model, tmp_path / "stock")
        assert not (tmp_path / "stock").exists()
        return
    loaded = _load_stock(AutoModel, save_stock(model, tmp_path / "stock"))
    inputs = tiny_inputs(spec)
    with torch.no_grad():
        torch.testing.assert_close(main_output(loaded, inputs), main_output(model, inputs), atol=1e-5, rtol=0)


def test_modernbert_keeps_each_layers_attention_pattern(tmp_path: Path) -> None:
    model = _cut(TinySpec("modernbert", layers=4, ffn=20), [1])
    before = model.config.layer_types
    out = save_stock(model, tmp_path / "stock")
    assert json.loads((out / "config.json").read_text())["layer_types"] == [before[0], before[2], before[3]]


def _head_pruned(spec: TinySpec) -> torch.nn.Module:
    model = tiny_model(spec)
    surgery.convert(model, HeadPruningStrategy(ratio=0.5))
    return model


def _uneven_ffn(spec: TinySpec) -> torch.nn.Module:
    model = tiny_model(spec)
    surgery.convert(model, FFNPruningStrategy(neurons={0: [0, 1, 2]}))
    return model


def _expert_attention(spec: TinySpec) -> torch.nn.Module:
    model = tiny_model(spec)
    surgery.convert(model, ExpertAttentionStrategy(layers=[0]))
    return model


@pytest.mark.parametrize(("make", "says"), [(_head_pruned, "heads were pruned"),
                                            (_uneven_ffn, "FFN widths differ"),
                                            (_expert_attention, "a module a strategy put there")])
@pytest.mark.parametrize("family", FAMILIES)
def test_structures_a_stock_config_cannot_say_are_refused_and_nothing_is_written(
        family: str, make: object, says: str, tmp_path: Path) -> None:
    model = make(TinySpec(family))  # type: ignore[operator]
    with pytest.raises(StockFormatError) as caught:
        save_stock(model, tmp_path / "stock")
    message = str(caught.value)
    assert says in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []  # no directory, no temporary sibling, no lock


def test_an_existing_directory_is_not_replaced_without_overwrite(tmp_path: Path) -> None:
    model = _cut(TinySpec("bert", layers=3), [2])
    out = tmp_path / "stock"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(surgery.core.errors.OutputPathError):
        save_stock(model, out)
    assert (out / "mine.txt").read_text() == "keep"
    with pytest.raises(surgery.core.errors.OutputPathError, match="holds files surgery did not write"):
        save_stock(model, out, overwrite=True)  # the user's own directory, even with overwrite
    (out / "mine.txt").unlink()
    save_stock(model, out)
    (out / "extra.txt").write_text("x")
    with pytest.raises(surgery.core.errors.OutputPathError, match=r"extra\.txt is not a file surgery wrote"):
        save_stock(model, out, overwrite=True)  # a file the user added to a stock output is never deleted
    assert (out / "extra.txt").read_text() == "x"
    (out / "extra.txt").unlink()
    weights = (out / "model.safetensors").stat().st_mtime_ns
    save_stock(model, out, overwrite=True)  # the stock output as surgery wrote it (its manifest) is replaced
    assert (out / "config.json").exists() and (out / "model.safetensors").stat().st_mtime_ns != weights


def test_tokenizer_and_sentence_files_come_from_the_source_directory(tmp_path: Path) -> None:
    sentence_transformers = pytest.importorskip("sentence_transformers")
    spec = TinySpec("bert", layers=3, ffn=20)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(60)]
    tokenizer = BertTokenizer(vocab={t: i for i, t in enumerate(words)})
    sentence = SentenceConfig(modes=("mean",), normalize=True)
    source = surgery.save_pretrained(tiny_model(spec), tmp_path / "source", tokenizer=tokenizer,
                                     extra=lambda d: write_sentence_config(sentence, d))
    model = surgery.from_pretrained(source)
    surgery.convert(model, FFNPruningStrategy(ratio=0.5, scope="layer"))
    surgery.convert(model, LayerDropStrategy(layers=[1]))
    out = save_stock(model, tmp_path / "stock")
    assert has_tokenizer(out) and {"modules.json", "1_Pooling"} <= {p.name for p in out.iterdir()}
    texts = ["w1 w2 w3", "w4 w5", "w7 w8 w9 w10 w11"]
    stock = sentence_transformers.SentenceTransformer(str(out), device="cpu")
    got = torch.as_tensor(stock.encode(texts, convert_to_numpy=True))
    want = embed_texts(model, tokenizer, texts, sentence)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_cli_export_format_stock_writes_or_refuses_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from surgery.cli.app import app

    runner = CliRunner(env={"COLUMNS": "200"})
    spec = TinySpec("bert", layers=3, ffn=20)
    cut, heads = _cut(spec, [2]), _head_pruned(spec)
    for model, name in ((cut, "cut"), (heads, "heads")):
        surgery.save_pretrained(model, tmp_path / name)
    result = runner.invoke(app, ["export", str(tmp_path / "cut"), "--format", "stock", "-o", str(tmp_path / "s1")])
    assert result.exit_code == 0, result.output
    loaded = _load_stock(AutoModel, tmp_path / "s1")
    inputs = tiny_inputs(spec)
    with torch.no_grad():
        torch.testing.assert_close(main_output(loaded, inputs), main_output(cut, inputs), atol=1e-5, rtol=0)
    for args, says in (([str(tmp_path / "heads")], "heads were pruned"),
                       ([str(tmp_path / "cut"), "--runtime", "openvino"], "--runtime belong to the ONNX formats")):
        refused = runner.invoke(app, ["export", *args, "--format", "stock", "-o", str(tmp_path / "s2")])
        assert refused.exit_code == 2 and says in refused.stderr, refused.output
        assert len(refused.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s2").exists()
