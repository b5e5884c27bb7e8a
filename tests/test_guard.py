"""The guard against silent loss: a forced loss is measured, recovered within a budget, reported and warned.

The forced loss: the tiny classifier's labels are its own predictions (100% before), and a test
strategy zeroes the classification head so it predicts the rarest label (at most a third right).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import surgery
from surgery.core.report import LayerChange
from surgery.core.run import RunContext
from surgery.core.strategy import Data, Plan, Strategy, StrategyConfig
from surgery.orchestration.pipeline import Pipeline, PipelineSession
from surgery.strategies import SoftPromptStrategy
from surgery.testing import TinySpec, tiny_model
from surgery.training import RecoveryConfig
from tests.helpers import self_labelled


class ZeroHead(Strategy):
    """Zero the classifier's last Linear; its bias favours class ``plan['label']`` (a structural-looking loss)."""

    name = "zero-head"

    def plan(self, model: nn.Module, data: Data | None = None, context: RunContext | None = None) -> Plan:
        return {"label": int(getattr(data, "rarest", 0))}

    def apply(self, model: nn.Module, plan: Plan) -> list[LayerChange]:
        head = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
        with torch.no_grad():
            head.weight.zero_()
            head.bias.zero_()
            head.bias[int(plan["label"])] = 1.0
        return []


class Steps(Pipeline):
    """A pipeline that runs the given strategies as recorded steps."""

    name = "steps"
    config_class = StrategyConfig

    def __init__(self, steps: list[Strategy]) -> None:
        super().__init__()
        self.steps = steps

    def run(self, model: nn.Module, data: Data | None, session: PipelineSession) -> None:
        for strategy in self.steps:
            session.step(strategy, data=data)


@pytest.mark.slow
def test_a_direct_step_that_loses_more_than_max_drop_is_recovered_and_reported() -> None:
    model = tiny_model(TinySpec("bert", task="seq-cls"))
    task = self_labelled(model)
    weak = RecoveryConfig(epochs=1, max_drop=1.0, learning_rate=1e-7, batch_size=10)
    report = surgery.convert(model, ZeroHead(), data=task, recovery=weak)
    (check,) = report.checks
    assert check.accuracy_before == 1.0 and check.accuracy_after <= 1 / 3 + 1e-9
    assert check.drop == pytest.approx(100 * (1 - check.accuracy_after))
    assert check.recovery is not None and check.recovery["epochs"] == 1 and check.recovery["steps"] == 3
    assert check.exceeded and check.remaining_drop > 1.0  # a budget too small to bring it back
    assert report.warnings == [report.checks[0].warning()]
    assert "step 0 (zero-head) lost" in report.warnings[0] and "max_drop 1" in report.warnings[0]

    model = tiny_model(TinySpec("bert", task="seq-cls"))
    strong = RecoveryConfig(epochs=8, max_drop=1.0, learning_rate=3e-2, batch_size=10, alpha=0.5)
    (check,) = surgery.convert(model, ZeroHead(), data=task, recovery=strong).checks
    assert check.accuracy_final > check.accuracy_after + 0.3  # recovery brought most of it back


def test_a_step_within_max_drop_is_not_recovered() -> None:
    model = tiny_model(TinySpec("bert", task="seq-cls"))
    task = self_labelled(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = surgery.convert(model, surgery.strategies.HeadPruningStrategy(heads={}), data=task,
                             recovery=RecoveryConfig(epochs=1, max_drop=1.0))
    (check,) = report.checks
    assert check.drop == 0.0 and check.recovery is None and not check.exceeded and report.warnings == []
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # weights untouched


def test_pipeline_steps_are_measured_and_a_trained_after_step_never_warns() -> None:
    model = tiny_model(TinySpec("bert", task="seq-cls"))
    task = self_labelled(model)
    pipeline = Steps([SoftPromptStrategy(length=2), ZeroHead()])
    report = surgery.convert(model, pipeline, data=task, recovery=RecoveryConfig(epochs=0, max_drop=5.0))
    prompt, zero = report.checks
    assert (prompt.step, prompt.strategy, prompt.trained_after, prompt.exceeded) == (0, "soft-prompt", True, False)
    assert (zero.step, zero.strategy, zero.trained_after, zero.exceeded) == (1, "zero-head", False, True)
    assert zero.recovery is None  # a budget of 0 epochs: measured and reported only
    assert [w.split(" lost")[0] for w in report.warnings] == ["step 1 (zero-head)"]

    # Without recovery settings a pipeline still measures every step, and nothing is "exceeded".
    model = tiny_model(TinySpec("bert", task="seq-cls"))
    report = surgery.convert(model, Steps([ZeroHead()]), data=task)
    assert report.checks[0].drop > 50 and report.warnings == []


def test_cli_prints_one_warning_line_and_strict_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import surgery.training
    from surgery.cli.app import app
    from tests.helpers import labelled_rows, tiny_tokenizer, write_rows  # the CLI tests' tiny tokenizer and data

    model = tiny_model(TinySpec("bert", task="base"))
    model.save_pretrained(tmp_path / "m")
    tiny_tokenizer().save_pretrained(tmp_path / "m")
    data = write_rows(tmp_path / "train.csv", labelled_rows(40))
    # The forced loss of this test: the guard's two measurements say 90% before, 40% after.
    base = ["apply", str(tmp_path / "m"), "-s", "layer-drop", "--set", "count=1", "--data", str(data),
            "--max-drop", "2", "--recover-epochs", "0"]
    runner = CliRunner(env={"COLUMNS": "200"})
    for strict, code in ((False, 0), (True, 3)):
        values = iter([0.9, 0.4])
        # The guard imports accuracy from surgery.training when it runs, so the patch is seen there.
        monkeypatch.setattr(surgery.training, "accuracy", lambda *a, _v=values, **k: next(_v))
        args = [*base, "-o", str(tmp_path / f"out{strict}")] + (["--strict"] if strict else [])
        result = runner.invoke(app, args)
        assert result.exit_code == code, result.output
        warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
        assert warnings == ["warning: accuracy loss remains: step 0 (layer-drop) lost 50.0 accuracy points, more "
                            "than max_drop 2; no recovery ran"]
        assert "Accuracy per step" in result.stdout
        assert surgery.inspect(surgery.from_pretrained(tmp_path / f"out{strict}")).num_layers == 1

    result = runner.invoke(app, ["apply", str(tmp_path / "m"), "-s", "layer-drop", "--set", "count=1",
                                 "--max-drop", "1", "-o", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--recover-epochs, --max-drop and --refit need --data" in result.stderr


