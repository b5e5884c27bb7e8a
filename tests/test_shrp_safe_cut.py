"""Safe Top-1 pruning: progressive expert dropping, concentration pressure, recovery after the cut."""

from __future__ import annotations

import math
import random
from pathlib import Path

import datasets
import pytest
import torch

import surgery
from surgery.core.errors import ConfigError
from surgery.core.manifest import steps_of
from surgery.data.task_data import TaskData
from surgery.orchestration.pipeline import PipelineSession
from surgery.strategies import ShrpPipeline
from surgery.strategies.shrp import ShrpTrainer, ShrpTrainingState, halving_sizes, shrp_training_arguments
from surgery.strategies.shrp.config import DEEP_CONVERSION_SETTINGS
from surgery.strategies.shrp.expert_attention import (
    ExpertAttentionStrategy,
    concentration_loss,
    entropy,
    expert_layers,
)
from surgery.strategies.shrp.shrp import SMALL_TRAINING_SET, training_set_warning
from surgery.testing import TinySpec, main_output, tiny_inputs, tiny_model
from surgery.training import DistillConfig


def _task(n: int = 48, seq: int = 8) -> TaskData:
    """Labelled random sequences (label: is the first real token odd?): 32 to train on, 16 to evaluate."""
    rng = random.Random(1)
    rows = [[2, *(rng.randrange(3, 99) for _ in range(seq - 1))] for _ in range(n)]
    table = datasets.Dataset.from_dict({"input_ids": rows, "labels": [r[1] % 2 for r in rows]})
    return TaskData(table.select(range(32)), table.select(range(32, n)), ["even", "odd"], batch_size=8)


def test_halving_sizes() -> None:
    assert halving_sizes(12) == [6, 3, 2, 1]
    assert halving_sizes(4) == [2, 1]
    assert halving_sizes(5, keep=2) == [3, 2]
    assert halving_sizes(1) == []


@pytest.mark.slow
def test_progressive_dropping_leaves_one_expert_and_the_cut_changes_nothing(tmp_path: Path) -> None:
    spec = TinySpec("bert", task="seq-cls", layers=2)
    model = tiny_model(spec, num_labels=2)
    task = _task()
    strategy = ShrpPipeline(layers=[1, 0], extra_epochs=2, expert_dropping="halve", learning_rate=1e-3,
                            bench=False, eval_each_epoch=False)
    session = PipelineSession(model)
    layers = strategy.convert_layers(model, session)
    strategy.train(model, session, task, layers, [1, 0], task.loader("eval"))
    strategy.train_stage2(model, session, task, layers, task.loader("eval"))
    # Every layer went 4 -> 2 -> 1 experts while training, each drop keeping experts it had allowed.
    drops = session.metrics["expert_drops"]
    for i in (0, 1):
        mine = [d for d in drops if d["layer"] == i]
        assert [len(d["kept"]) for d in mine] == [2, 1]
        assert set(mine[1]["kept"]) <= set(mine[0]["kept"])
    # Drops happen in the first half of stage 2 (dropping_end=0.5): the survivor trains afterwards.
    assert max(d["step"] for d in drops) <= 4  # 2 epochs x 4 steps, half of it
    inputs = tiny_inputs(spec, batch=5)
    model.eval()
    before = main_output(model, inputs)
    strategy.cut(model, session, task.loader("eval"))
    for _, layer in expert_layers(model):
        assert layer.num_experts == 1 and layer.router is None
    # The pruned model is the model that was trained last: same outputs for every input.
    torch.testing.assert_close(main_output(model, inputs), before)
    assert session.metrics["accuracy_pruned"] == session.metrics["accuracy_moe"]
    out = surgery.save_pretrained(model, tmp_path / "m")
    torch.testing.assert_close(main_output(surgery.from_pretrained(out), inputs), before)


def test_a_masked_expert_is_never_picked() -> None:
    spec = TinySpec("bert")
    model = tiny_model(spec)
    surgery.convert(model, ExpertAttentionStrategy(layers=[0]))
    layer = model.encoder.layer[0]
    with torch.no_grad():
        layer.router.bias.copy_(torch.tensor([0.0, 100.0, 0.0, 0.0]))  # everything prefers expert 1
    layer.restrict_experts([0, 3])
    model(**tiny_inputs(spec, batch=6))
    assert set(layer.last_choice.tolist()) <= {0, 3}
    assert float(layer.last_probs.detach()[:, [1, 2]].sum()) == 0.0
    with pytest.raises(surgery.core.errors.PlanError):
        layer.restrict_experts([])


def test_concentration_loss_matches_hand_computation() -> None:
    spec = TinySpec("bert", layers=2)
    model = tiny_model(spec)
    surgery.convert(model, ExpertAttentionStrategy(layers=[0, 1]))
    model(**tiny_inputs(spec, batch=3))
    eps = 1e-7
    by_hand = []
    for _, layer in expert_layers(model):
        rows = layer.last_probs.tolist()
        mean = [sum(r[e] for r in rows) / len(rows) for e in range(4)]
        by_hand.append(-sum(p * math.log(p + eps) for p in mean))
    assert float(concentration_loss(model).detach()) == pytest.approx(sum(by_hand) / 2, rel=1e-5)
    assert float(entropy(torch.tensor([1.0, 0.0, 0.0]))) == pytest.approx(0.0, abs=1e-6)
    assert float(entropy(torch.full((4,), 0.25))) == pytest.approx(math.log(4), rel=1e-6)


def test_trainer_adds_the_weighted_concentration_term(tmp_path: Path) -> None:
    model = tiny_model(TinySpec("bert", task="seq-cls", layers=2), num_labels=2)
    surgery.convert(model, ExpertAttentionStrategy(layers=[1]))
    task = _task()
    batch = next(iter(task.loader("train")))
    args = shrp_training_arguments(ShrpPipeline(num_layers=1).config, 1, str(tmp_path))
    losses = {}
    for weight in (0.0, 0.5):
        trainer = ShrpTrainer(model=model, args=args, shrp_state=ShrpTrainingState(concentration_weight=weight))
        model.train()
        torch.manual_seed(0)
        on_device = {k: v.to(model.device) for k, v in batch.items()}  # where the Trainer put the model
        losses[weight] = float(trainer.compute_loss(model, on_device))
        term = float(concentration_loss(model).detach())
    assert losses[0.5] == pytest.approx(losses[0.0] + 0.5 * term, rel=1e-5)


def test_training_set_warning_threshold() -> None:
    assert training_set_warning(SMALL_TRAINING_SET) is None
    line = training_set_warning(SMALL_TRAINING_SET - 1)
    assert line is not None and f"only {SMALL_TRAINING_SET - 1} training examples" in line and "\n" not in line


@pytest.mark.slow
def test_recovery_after_the_cut_is_reported_and_reloads(tmp_path: Path) -> None:
    spec = TinySpec("bert", task="seq-cls", layers=2)
    model = tiny_model(spec, num_labels=2)
    # 32 training examples: far below what the suite needed, so the run warns and the report says so.
    with pytest.warns(UserWarning, match="only 32 training examples"):
        report = surgery.convert(model, ShrpPipeline(layers=[1], extra_epochs=1, concentration_weight=0.5,
                                                     recover_epochs=1, learning_rate=1e-3, bench=False),
                                 data=_task())
    assert report.metrics["data_warning"] == training_set_warning(32)
    assert {"accuracy_moe", "accuracy_pruned", "accuracy_recovered"} <= set(report.metrics)
    assert [h["stage"] for h in report.metrics["history"]] == [1, 2]
    inputs = tiny_inputs(spec)
    out = surgery.save_pretrained(model, tmp_path / "m")
    torch.testing.assert_close(main_output(surgery.from_pretrained(out), inputs), main_output(model, inputs))


def test_stage2_mechanisms_need_stage2_epochs() -> None:
    assert ShrpPipeline(num_layers=1).config.expert_dropping == "halve"  # the default: an exact cut
    ShrpPipeline(num_layers=1, extra_epochs=0)  # no stage 2: nothing to drop in, the cut is taken as before
    with pytest.raises(ConfigError, match="extra_epochs"):
        ShrpPipeline(num_layers=1, extra_epochs=0, concentration_weight=0.1)


def test_distillation_teacher_is_the_model_when_conversion_begins() -> None:
    spec = TinySpec("bert", task="seq-cls", layers=2)
    model = tiny_model(spec, num_labels=2)
    task = _task()
    strategy = ShrpPipeline(layers=[1], finetune_epochs=1, extra_epochs=1, distill_alpha=0.5, learning_rate=1e-3,
                            bench=False, eval_each_epoch=False)
    session = PipelineSession(model)
    layers = strategy.convert_layers(model, session)
    strategy.train(model, session, task, layers, [1], task.loader("eval"))
    teacher = session.context.artefacts["teacher"]
    # Taken after stage 0 and before layer 1 switched over: it still runs the original layer, so it
    # differs from the input model (stage 0 trained it) and from the converted student.
    layer = next(layer for _, layer in expert_layers(teacher))
    assert not layer.active
    inputs = tiny_inputs(spec, batch=4)
    assert not torch.allclose(main_output(teacher, inputs), main_output(model, inputs))
    losses = {}
    for alpha in (0.0, 1.0):
        trainer = ShrpTrainer(model=model, args=shrp_training_arguments(strategy.config, 1, "/tmp/unused"),
                              shrp_state=ShrpTrainingState(teacher=teacher),
                              distill=DistillConfig(alpha=alpha))
        batch = next(iter(task.loader("train")))
        losses[alpha] = float(trainer.compute_loss(model.train(), dict(batch)).detach())
    assert losses[0.0] != losses[1.0]  # the teacher's KL replaces the labels' CE at alpha=1


@pytest.mark.slow
def test_deep_conversions_take_the_measured_settings_unless_set() -> None:
    spec = TinySpec("bert", task="seq-cls", layers=2)
    settings = dict(extra_epochs=1, learning_rate=1e-3, bench=False, eval_each_epoch=False)
    models = [tiny_model(spec, num_labels=2) for _ in range(3)]
    with pytest.warns(UserWarning, match="training examples"):
        deep = surgery.convert(models[0], ShrpPipeline(num_layers=2, **settings), data=_task())
        half = surgery.convert(models[1], ShrpPipeline(num_layers=1, **settings), data=_task())
        mine = surgery.convert(models[2], ShrpPipeline(num_layers=2, expander_gain=1.0, distill_alpha=0.0,
                                                       **settings), data=_task())

    def gains(model: torch.nn.Module) -> set[float]:  # as recorded for replay in the saved model's manifest
        return {s["config"]["expander_gain"] for s in steps_of(model) if s["strategy"] == "expert-attention"}

    # 2 of 2 layers is more than half: distillation from the model before conversion and a small Expander γ.
    assert deep.metrics["deep_conversion_settings"] == DEEP_CONVERSION_SETTINGS
    assert gains(models[0]) == {DEEP_CONVERSION_SETTINGS["expander_gain"]}
    assert deep.config["distill_alpha"] == 0.0  # the report's config is what the user asked for
    assert "deep_conversion_settings" not in half.metrics  # half the layers: the defaults as they are
    assert gains(models[1]) == {1.0}
    # What the user set wins; only the unset setting is filled in.
    assert mine.metrics["deep_conversion_settings"] == {"distill_hidden_weight": 1.0}
    assert gains(models[2]) == {1.0}
