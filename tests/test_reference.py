"""The reference of a run: a chain of steps distils from and is measured against the original (issue 24)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import surgery
from surgery.cli.app import app
from surgery.cli.embedding_apply import evaluate_against
from surgery.core.errors import ConfigError
from surgery.embedding import load_text_data, read_sentence_config
from surgery.strategies import HeadPruningStrategy, LayerDropStrategy
from surgery.testing import TinySpec, tiny_model
from surgery.training import RecoveryConfig, accuracy
from tests.helpers import EMBEDDING_TEXTS, self_labelled, st_dir, tiny_tokenizer

runner = CliRunner(env={"COLUMNS": "200"})


def _layer_map(report: surgery.SurgeryReport) -> dict[int, int]:
    recovery = report.checks[0].recovery
    assert recovery is not None
    return {int(k): v for k, v in recovery["layer_map"].items()}


@pytest.mark.slow
def test_a_second_step_distils_from_and_is_measured_against_the_original() -> None:
    original = tiny_model(TinySpec("bert", layers=3, task="seq-cls"))
    task = self_labelled(original)  # the original labels its own data: accuracy 1.0
    step1 = copy.deepcopy(original)
    surgery.convert(step1, LayerDropStrategy(layers=[1]))
    settings = RecoveryConfig(epochs=1, hidden_weight=1.0, batch_size=10)

    own = copy.deepcopy(step1)
    against_input = surgery.convert(own, HeadPruningStrategy(heads={0: [0]}), data=task, recovery=settings)
    assert against_input.reference == "input model"
    assert against_input.checks[0].accuracy_before == accuracy(step1, task.loader("eval"))
    assert _layer_map(against_input) == {0: 0, 1: 1}  # distilled from step 1, which has 2 layers

    report = surgery.convert(step1, HeadPruningStrategy(heads={0: [0]}), data=task, recovery=settings,
                             teacher=original)
    assert report.reference == "BertForSequenceClassification passed as teacher"
    assert report.checks[0].accuracy_before == accuracy(original, task.loader("eval")) == 1.0
    assert _layer_map(report) == {0: 0, 1: 2}  # distilled from the original's 3 layers, through the drop
    assert report.checks[0].remaining_drop == pytest.approx(100 * (1.0 - report.checks[0].accuracy_final))


def test_without_recovery_a_step_is_still_measured_against_the_original() -> None:
    original = tiny_model(TinySpec("bert", layers=3, task="seq-cls"))
    task = self_labelled(original)
    step1 = copy.deepcopy(original)
    surgery.convert(step1, LayerDropStrategy(layers=[1]))
    assert surgery.convert(copy.deepcopy(step1), HeadPruningStrategy(heads={0: [0]}), data=task).checks == []
    report = surgery.convert(step1, HeadPruningStrategy(heads={0: [0]}), data=task, teacher=original)
    (check,) = report.checks
    assert check.accuracy_before == 1.0 and check.recovery is None
    assert check.accuracy_after == accuracy(step1, task.loader("eval"))
    assert check.drop == pytest.approx(100 * (1.0 - check.accuracy_after))


@pytest.mark.parametrize(("other", "says"), [(TinySpec("roberta", task="seq-cls"), "family is roberta"),
                                             (TinySpec("bert", heads=2, task="seq-cls"), "hidden size is 16"),
                                             (TinySpec("bert"), "it is a BertModel")])
def test_a_reference_of_another_shape_is_refused_in_one_line(other: TinySpec, says: str) -> None:
    model = tiny_model(TinySpec("bert", task="seq-cls"))
    with pytest.raises(ConfigError) as caught:
        surgery.convert(model, HeadPruningStrategy(heads={0: [0]}), teacher=tiny_model(other))
    assert says in str(caught.value) and "\n" not in str(caught.value)
    assert surgery.inspect(model).layers[0].heads == 4  # refused before anything changed


@pytest.mark.slow
def test_cli_chain_reports_the_embedding_fidelity_against_the_original(tmp_path: Path) -> None:
    source = st_dir(tmp_path / "st", {"pooling_mode_mean_tokens": True}, True)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(EMBEDDING_TEXTS) + "\n")
    heads, both, alone = tmp_path / "heads", tmp_path / "both", tmp_path / "alone"
    common = ["--set", "ratio=0.5", "--data", str(corpus), "--recover-epochs", "1"]
    first = runner.invoke(app, ["apply", str(source), "-s", "head-prune", *common, "-o", str(heads),
                                "--report", str(tmp_path / "h.json")])
    assert first.exit_code == 0, first.output
    assert json.loads((tmp_path / "h.json").read_text())["reference"] == "input model"
    assert "reference input model" in first.stdout
    second = runner.invoke(app, ["apply", str(heads), "-s", "ffn-prune", *common, "--teacher", str(source),
                                 "-o", str(both), "--report", str(tmp_path / "f.json")])
    assert second.exit_code == 0, second.output
    assert f"reference: {source.resolve()}" in second.stderr
    report = json.loads((tmp_path / "f.json").read_text())
    assert report["reference"] == str(source.resolve()) and report["checks"][0]["recovery"]["epochs"] == 1
    # The same chain without --teacher is measured against step 1: a different figure.
    plain = runner.invoke(app, ["apply", str(heads), "-s", "ffn-prune", *common, "-o", str(alone),
                                "--report", str(tmp_path / "a.json")])
    assert plain.exit_code == 0, plain.output
    # Recomputed here, on the held-out texts the command used (same file, seed and tokenizer).
    data = load_text_data(str(corpus), tiny_tokenizer(), batch_size=32, sentence_config=read_sentence_config(source))
    final, original, step1 = (surgery.from_pretrained(d) for d in (both, source, heads))
    vs_original = evaluate_against(original, final, data, tiny_tokenizer(), 64)["mean_cosine"]
    vs_step1 = evaluate_against(step1, final, data, tiny_tokenizer(), 64)["mean_cosine"]
    # Tiny random encoders agree closely (cosines near 1), so the figures differ in the fifth decimal.
    assert report["metrics"]["embedding"]["mean_cosine"] == pytest.approx(vs_original, abs=1e-7)
    assert abs(vs_original - vs_step1) > 1e-6
    assert json.loads((tmp_path / "a.json").read_text())["reference"] == "input model"


def test_cli_teacher_refusals_are_one_line_and_exit_2(tmp_path: Path) -> None:
    source = st_dir(tmp_path / "st", {"pooling_mode_mean_tokens": True}, True)
    narrow = tmp_path / "narrow"
    tiny_model(TinySpec("bert", heads=2)).save_pretrained(narrow)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(EMBEDDING_TEXTS) + "\n")
    base = ["apply", str(source), "-s", "ffn-prune", "--set", "ratio=0.5"]
    cases = [
        ([*base, "--teacher", str(source), "-o", str(tmp_path / "o1")], "--teacher needs --data"),
        ([*base, "--data", str(corpus), "--teacher", str(narrow), "-o", str(tmp_path / "o2")],
         "its hidden size is 16 but the model's is 32"),
        ([*base, "--data", str(corpus), "--teacher", str(tmp_path / "missing"), "-o", str(tmp_path / "o3")],
         "does not exist"),
        ([*base, "--data", str(corpus), "--teacher", str(narrow), "-o", str(narrow), "--overwrite"], "--teacher model"),
    ]
    for args, says in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 4))
