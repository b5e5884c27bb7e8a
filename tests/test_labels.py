"""Labels read the way the model reads them, and a classifier's head is weights like any other (issue 29).

Data labels become the class ids of the model's classification head (its ``id2label``), not the
rank of their text: a 12-class model read ``0, 1, 10, 11, 2, ...`` and was judged at 16.7% while
100% right; a head named ``{0: positive, 1: negative}`` was judged at 0%. A label the head does not
have is refused, naming it, the file and the head's labels. A checkpoint whose config names a
classifier but lacks its head tensors is refused as damaged, not given a random head.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, BertConfig

import surgery
from surgery.cli.app import app
from surgery.core.errors import DataError, ModelLoadError
from surgery.data.task_data import (
    check_label_order,
    fresh_label_names,
    head_label_ids,
    head_label_names,
    load_task_data,
)
from surgery.persist.weight_checks import check_loading_info
from surgery.testing import TinySpec, tiny_model
from tests.helpers import WORDS, runner, tiny_tokenizer, write_rows


# -- the mapping ----------------------------------------------------------------------------------
def test_names_are_names_and_integers_are_ids() -> None:
    assert head_label_ids(["negative", "positive", "negative"], ["positive", "negative"], "d.csv") == [1, 0, 1]
    twelve = [f"LABEL_{i}" for i in range(12)]
    assert head_label_ids([0, 1, 10, 11, 2], twelve, "d.csv") == [0, 1, 10, 11, 2]
    assert head_label_ids([1.0, 0.0, "1", "LABEL_3"], [f"LABEL_{i}" for i in range(4)], "d.csv") == [1, 0, 1, 3]
    # A head named by numbers reads them as names: "5" is the 5th class of a 1..5 star rating, not id 5.
    stars = ["1", "2", "3", "4", "5"]
    assert head_label_ids([1, 5, "3", 2.0], stars, "d.csv") == [0, 4, 2, 1]


@pytest.mark.parametrize(("values", "head", "shown"), [
    ([0, 7], ["neg", "pos"], "label '7' (1 row) is not a label"),
    ([-1, 0, -1], ["LABEL_0", "LABEL_1"], "label '-1' (2 rows) is not a label"),
    ([0.5, 1.5], ["LABEL_0", "LABEL_1", "LABEL_2"], "labels '0.5', '1.5' (2 rows) are not labels"),
    (["pos", "neg"], ["LABEL_0", "LABEL_1"], "labels 'pos', 'neg' (2 rows) are not labels"),
    ([6], ["1", "2", "3", "4", "5"], "label '6' (1 row)"),
])
def test_a_label_the_head_lacks_is_refused_naming_it_the_file_and_the_head(values: list[object], head: list[str],
                                                                          shown: str) -> None:
    with pytest.raises(DataError) as err:
        head_label_ids(values, head, "training data train.csv")
    message = str(err.value)
    assert message.startswith("training data train.csv: ") and shown in message and "\n" not in message
    assert f"which has {len(head)}: {head[0]!r}" in message and "relabel the data" in message


def test_a_new_head_sorts_numeric_labels_numerically() -> None:
    assert fresh_label_names([str(i) for i in range(12)]) == [str(i) for i in range(12)]
    assert fresh_label_names([10, 2, 1.0, -1]) == ["-1", "1", "2", "10"]
    assert fresh_label_names(["b", "a", "10", "2"]) == ["10", "2", "a", "b"]  # not all numbers: as text


def test_head_label_names_follow_id2label_order() -> None:
    assert head_label_names(BertConfig(id2label={1: "negative", 0: "positive"})) == ["positive", "negative"]


def test_data_numbered_another_way_than_the_head_is_refused_before_judging() -> None:
    # What surgery.compress checks when Python hands it task data loaded without head_labels.
    with pytest.raises(DataError, match=r"^compress: the data numbers its labels negative, positive but the model's "
                                        r"classification head reads positive, negative; load it with load_task_data"):
        check_label_order(BertConfig(id2label={0: "positive", 1: "negative"}), ["negative", "positive"],
                          "compress: the data")
    twelve = BertConfig(num_labels=12)
    with pytest.raises(DataError, match="numbers its labels 0, 1, 10, 11, 2, 3"):
        check_label_order(twelve, sorted(str(i) for i in range(12)))
    check_label_order(twelve, [str(i) for i in range(12)])  # numbered as the head reads them
    check_label_order(BertConfig(num_labels=3), ["a", "b", "c"])  # names the head lacks: not a reordering
    check_label_order(BertConfig(id2label={0: "positive", 1: "negative"}), ["positive", "negative"])


# -- the loader -----------------------------------------------------------------------------------
def _rows(labels: list[object], seed: int = 0) -> list[dict[str, object]]:
    rng = random.Random(seed)
    return [{"text": " ".join(rng.choices(WORDS, k=6)), "label": label} for label in labels]


def test_the_loader_reads_labels_through_the_head(tmp_path: Path) -> None:
    twelve = write_rows(tmp_path / "twelve.csv", _rows([i % 12 for i in range(144)]))
    data = load_task_data(twelve, tiny_tokenizer(), head_labels=[f"LABEL_{i}" for i in range(12)], max_length=16)
    ids = list(data.train["labels"]) + list(data.eval["labels"])
    assert sorted(ids) == sorted(i % 12 for i in range(144)) and data.label_names[10] == "LABEL_10"
    # Without a head, numbers sort as numbers: label 10 is id 10, not id 2.
    fresh = load_task_data(twelve, tiny_tokenizer(), max_length=16)
    assert fresh.label_names == [str(i) for i in range(12)]
    assert sorted(list(fresh.train["labels"]) + list(fresh.eval["labels"])) == sorted(ids)

    named = write_rows(tmp_path / "named.csv", _rows(["positive", "negative"] * 10))
    data = load_task_data(named, tiny_tokenizer(), head_labels=["positive", "negative"], max_length=16)
    assert data.label_names == ["positive", "negative"] and data.info["labels_from"].startswith("the model")
    texts = {r["text"]: r["label"] for r in _rows(["positive", "negative"] * 10)}
    decoded = tiny_tokenizer().batch_decode([list(ids) for ids in data.train["input_ids"]], skip_special_tokens=True)
    # "positive" is id 0, as the head reads it (the order of their text would make it 1).
    assert [texts[t] for t in decoded] == [["positive", "negative"][i] for i in data.train["labels"]]


def test_the_eval_file_is_checked_against_the_head_too(tmp_path: Path) -> None:
    train = write_rows(tmp_path / "train.csv", _rows([0, 1] * 10))
    dev = write_rows(tmp_path / "dev.csv", _rows([0, 1, 2, 1]))
    with pytest.raises(DataError, match=r"^evaluation data .*dev.csv: label '2' \(1 row\) is not a label"):
        load_task_data(train, tiny_tokenizer(), eval_data=dev, head_labels=["LABEL_0", "LABEL_1"], max_length=16)
    # A head with more labels than the data has is fine: a data set need not hold every class.
    data = load_task_data(train, tiny_tokenizer(), head_labels=["a", "b", "c"], max_length=16)
    assert data.num_labels == 3 and set(data.train["labels"]) == {0, 1}


# -- end to end: compress reports the true accuracy ------------------------------------------------
def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=6)) for _ in range(n)]  # 8 tokens each: nothing is truncated


def _own_predictions(model: torch.nn.Module, texts: list[str]) -> list[int]:
    enc = tiny_tokenizer()(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits.argmax(-1).tolist()


def _classifier(root: Path, num_labels: int, id2label: dict[int, str] | None) -> torch.nn.Module:
    model = tiny_model(TinySpec("bert", task="seq-cls", layers=2), num_labels=num_labels,
                       **({"id2label": id2label, "label2id": {v: k for k, v in id2label.items()}} if id2label else {}))
    with torch.no_grad():  # a head centred on these texts' pooled outputs: its predictions spread over the classes
        pooled = model.bert(**tiny_tokenizer()(_texts(64, 9), padding=True, return_tensors="pt")).pooler_output
        model.classifier.weight.div_(pooled.std(0).clamp_min(1e-6))
        model.classifier.bias.copy_(-model.classifier.weight @ pooled.mean(0))
    model.save_pretrained(root)
    tiny_tokenizer().save_pretrained(root)
    return model


@pytest.mark.slow
@pytest.mark.parametrize("case", ["twelve", "not-alphabetical"])
def test_compress_reports_the_true_accuracy_of_a_perfect_classifier(case: str, tmp_path: Path,
                                                                   timed_by_tables: None) -> None:
    id2label = None if case == "twelve" else {0: "positive", 1: "negative"}
    model = _classifier(tmp_path / "model", 12 if case == "twelve" else 2, id2label)
    files = {}
    for name, n, seed in (("train", 96, 0), ("dev", 48, 1)):
        texts = _texts(n, seed)
        predicted = _own_predictions(model, texts)
        labels: list[object] = predicted if id2label is None else [id2label[p] for p in predicted]
        files[name] = write_rows(tmp_path / f"{name}.csv", [{"text": t, "label": y} for t, y in zip(texts, labels,
                                                                                                    strict=True)])
    if case == "twelve":  # the case of the issue: labels past 9, where text order and id order differ
        assert max(predicted) >= 10 and len(set(predicted)) >= 6, set(predicted)
    else:
        assert set(labels) == {"positive", "negative"}
    out = tmp_path / "out"
    result = runner.invoke(app, ["compress", str(tmp_path / "model"), "--data", str(files["train"]), "--eval-data",
                                 str(files["dev"]), "--speedup", "1.3", "--no-train", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "compress.json").read_text())
    assert report["original"]["accuracy"] == pytest.approx(1.0)
    unchanged = next(c for c in report["candidates"] if c["origin"] == "unchanged")
    assert unchanged["accuracy"] == pytest.approx(1.0)


def test_compress_refuses_a_label_the_head_lacks_in_one_line(tmp_path: Path) -> None:
    _classifier(tmp_path / "model", 2, {0: "positive", 1: "negative"})
    data = write_rows(tmp_path / "train.csv", _rows(["positive", "negative", "neutral"] * 8))
    result = runner.invoke(app, ["compress", str(tmp_path / "model"), "--data", str(data), "--speedup", "1.5",
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "label 'neutral' (8 rows) is not a label of the model's classification head" in lines[0]
    assert "train.csv" in lines[0] and "'positive', 'negative'" in lines[0]
    assert not (tmp_path / "out").exists()


# -- a classifier's head is weights like any other ---------------------------------------------------
def _headless(root: Path, drop: str) -> Path:
    _classifier(root, 2, None)
    weights = load_file(root / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith(drop)}, str(root / "model.safetensors"),
              metadata={"format": "pt"})
    return root


@pytest.mark.parametrize("drop", ["classifier.", "classifier.bias"])
def test_a_classifier_without_its_head_tensors_is_refused_as_damaged(drop: str, tmp_path: Path) -> None:
    path = _headless(tmp_path / "model", drop)
    with pytest.raises(ModelLoadError) as err:
        surgery.from_pretrained(path)
    message = str(err.value)
    assert message.startswith(f"{path / 'model.safetensors'}: config.json names BertForSequenceClassification")
    assert "classifier.bias" in message and "damaged" in message
    assert ("classifier.weight" in message) == (drop == "classifier.")
    # The bare encoder still loads from it: nothing is made up then.
    assert type(surgery.from_pretrained(path, model_class=AutoModel)).__name__ == "BertModel"


def test_cli_refuses_the_headless_classifier_instead_of_a_random_head(tmp_path: Path) -> None:
    path = _headless(tmp_path / "model", "classifier.")
    data = write_rows(tmp_path / "train.csv", _rows([0, 1] * 12))
    for args in (["compress", str(path), "--data", str(data), "--speedup", "1.5", "--out", str(tmp_path / "o")],
                 ["inspect", str(path)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "lack 2 of its head tensor(s) (classifier.bias, classifier.weight)" in lines[0]
        assert "note:" not in result.stderr
    assert not (tmp_path / "o").exists()


def test_the_loading_info_check_catches_a_head_the_header_could_not_show() -> None:
    # Weights read without a safetensors header (a pickled checkpoint) are checked after loading.
    model = tiny_model(TinySpec("bert", task="seq-cls"))
    model.config.architectures = ["BertForSequenceClassification"]
    info = {"missing_keys": ["classifier.weight", "classifier.bias"], "unexpected_keys": []}
    with pytest.raises(ModelLoadError, match=r"^m: config.json names BertForSequenceClassification but the weights "
                                             r"lack 2 of its head tensor\(s\) \(classifier.bias, classifier.weight\)"):
        check_loading_info(model, info, Path("m"))
    # A new head asked for (a bare encoder given a classifier) is not damage.
    assert check_loading_info(model, info, Path("m"), new_head=["classifier.weight", "classifier.bias"]) == []
