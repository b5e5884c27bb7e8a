"""The training stack: distillation losses against hand computations, the trainer's loss, recovery, prompt tuning.

Tiny random models; every check compares with numbers computed independently here (plain Python
math for the losses), so a wrong direction of the KL or a missing T² fails.
"""

from __future__ import annotations

import copy
import math

import datasets
import pytest
import torch
import torch.nn.functional as F

import surgery
from surgery.core.errors import ConfigError, DataError
from surgery.data.task_data import TaskData
from surgery.strategies import ExpertAttentionStrategy, HeadPruningStrategy, LayerDropStrategy
from surgery.testing import FAMILIES, TinySpec, tiny_inputs, tiny_model
from surgery.training import (
    DistillConfig,
    PaddingCollator,
    RecoveryConfig,
    SurgeryTrainer,
    accuracy,
    default_layer_map,
    distillation_loss,
    hidden_state_loss,
    recording_layer_outputs,
    recover,
    scratch_dir,
    training_arguments,
)


def hand_kd(student: list[list[float]], teacher: list[list[float]], t: float) -> float:
    """T² · mean over rows of Σ_c p_c (log p_c − log q_c), p = softmax(teacher/T), q = softmax(student/T)."""
    total = 0.0
    for s_row, t_row in zip(student, teacher, strict=True):
        zs = sum(math.exp(x / t) for x in s_row)
        zt = sum(math.exp(x / t) for x in t_row)
        for s, te in zip(s_row, t_row, strict=True):
            p, q = math.exp(te / t) / zt, math.exp(s / t) / zs
            total += p * (math.log(p) - math.log(q))
    return t * t * total / len(student)


@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0])
def test_distillation_loss_matches_a_hand_computation(temperature: float) -> None:
    student = [[1.0, -0.5, 2.0], [0.3, 0.1, -1.2]]
    teacher = [[2.5, 0.0, -1.0], [0.0, 1.5, 0.2]]
    got = float(distillation_loss(torch.tensor(student), torch.tensor(teacher), temperature))
    assert got == pytest.approx(hand_kd(student, teacher, temperature), rel=1e-6)
    # KL(teacher ‖ student) is not symmetric: the swapped direction gives another number.
    assert got != pytest.approx(hand_kd(teacher, student, temperature), rel=1e-3)
    assert float(distillation_loss(torch.tensor(teacher), torch.tensor(teacher), temperature)) == pytest.approx(0.0)


def test_hidden_state_loss_matches_a_hand_computation() -> None:
    # Student layer 0 against teacher layer 1; the padded position (mask 0) does not count.
    student = (torch.tensor([[[1.0, 3.0], [2.0, 2.0], [9.0, 9.0]]]),)
    teacher = (torch.zeros(1, 3, 2), torch.tensor([[[0.0, 1.0], [2.0, 0.0], [0.0, 0.0]]]))
    mask = torch.tensor([[1, 1, 0]])
    # position 0: ((1-0)² + (3-1)²)/2 = 2.5; position 1: (0 + 4)/2 = 2; mean over the 2 real positions = 2.25
    assert float(hidden_state_loss(student, teacher, {0: 1}, mask)) == pytest.approx(2.25)
    with pytest.raises(ConfigError, match="layer_map"):
        hidden_state_loss(student, teacher, {})
    with pytest.raises(ConfigError, match=r"teacher has no output for layers \[2\]"):
        hidden_state_loss(student, teacher, {0: 2})


@pytest.mark.parametrize("family", FAMILIES)
def test_layer_outputs_include_replaced_layers(family: str) -> None:
    # Regression: transformers 5 records `hidden_states` by hooking its own layer classes, so an Expert
    # Attention layer was missing and SHRP's hidden-state distillation matched only unconverted layers
    # (with every layer converted, none). The recorder hooks the anatomy's layers instead.
    spec = TinySpec(family, layers=3)
    model = tiny_model(spec)
    surgery.convert(model, ExpertAttentionStrategy(layers=[0, 2]))
    with recording_layer_outputs(model) as layers:
        out = model(**tiny_inputs(spec))
    assert len(layers) == 3 and all(t is not None and t.shape == out.last_hidden_state.shape for t in layers)
    assert any(not torch.equal(layers[0], t) for t in layers[1:])


def test_default_layer_map_follows_layer_drops() -> None:
    assert default_layer_map(3, 3) == {0: 0, 1: 1, 2: 2}
    steps = [{"strategy": "head-prune", "plan": {"heads": {}}},
             {"strategy": "layer-drop", "plan": {"drop": [0, 3]}}, {"strategy": "layer-drop", "plan": {"drop": [1]}}]
    assert default_layer_map(3, 6, steps) == {0: 1, 1: 4, 2: 5}
    with pytest.raises(ConfigError, match="cannot map 2 student layers onto 6"):
        default_layer_map(2, 6)


def rows(n: int = 24, seed: int = 0) -> datasets.Dataset:
    gen = torch.Generator().manual_seed(seed)
    ids = [[2, *torch.randint(5, 99, (int(k),), generator=gen).tolist(), 3]
           for k in torch.randint(2, 8, (n,), generator=gen)]
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": [i % 3 for i in range(n)]})


def test_trainer_loss_is_ce_plus_scaled_kl_plus_hidden_mse() -> None:
    spec = TinySpec("bert", task="seq-cls", layers=2)
    teacher = tiny_model(spec)
    student = copy.deepcopy(teacher)
    surgery.convert(student, HeadPruningStrategy(heads={0: [0, 1]}))
    batch = PaddingCollator(None)([dict(r) for r in rows(4)])
    cfg = DistillConfig(temperature=3.0, alpha=0.3, hidden_weight=0.5, layer_map={0: 0, 1: 1})
    with scratch_dir() as tmp:
        trainer = SurgeryTrainer(model=student, args=training_arguments(tmp, epochs=1), teacher=teacher, distill=cfg)
        student.eval()  # no dropout: the loss is deterministic
        # Built, the Trainer has moved the student to its device (a GPU where there is one): the batch follows.
        batch = {k: v.to(student.device) for k, v in batch.items()}
        loss = float(trainer.compute_loss(student, dict(batch)).detach())
    features = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        s_out = student(**features, output_hidden_states=True)
        t_out = teacher(**features, output_hidden_states=True)
    ce = float(F.cross_entropy(s_out.logits, batch["labels"]))
    kd = hand_kd(s_out.logits.tolist(), t_out.logits.tolist(), 3.0)
    mask = batch["attention_mask"].float()
    mse = sum(float((((s_out.hidden_states[i] - t_out.hidden_states[i]) ** 2).mean(-1) * mask).sum() / mask.sum())
              for i in (1, 2)) / 2
    assert loss == pytest.approx(0.7 * ce + 0.3 * kd + 0.5 * mse, rel=1e-5)


@pytest.mark.slow
def test_recover_distils_the_teacher_into_a_layer_dropped_student() -> None:
    spec = TinySpec("bert", task="seq-cls", layers=3)
    teacher = tiny_model(spec)
    with torch.no_grad():  # a random tiny classifier is almost uniform; sharpen it so there is something to learn
        teacher.classifier.weight.mul_(30.0)
    data = rows(24)
    teacher_labels = teacher(**PaddingCollator(None)([{"input_ids": r} for r in data["input_ids"]])).logits.argmax(-1)
    data = data.remove_columns("labels").add_column("labels", teacher_labels.tolist())
    task = TaskData(data, data, ["a", "b", "c"], batch_size=8)
    student = copy.deepcopy(teacher)
    surgery.convert(student, LayerDropStrategy(layers=[1]))
    with torch.no_grad():  # start far from the teacher: an untrained (zero) head
        student.classifier.weight.zero_()

    def kd_to_teacher() -> float:
        batch = next(iter(task.loader("eval", batch_size=24)))
        with torch.no_grad():
            x = {k: v for k, v in batch.items() if k != "labels"}
            return float(distillation_loss(student(**x).logits, teacher(**x).logits, 1.0))

    before, acc_before = kd_to_teacher(), accuracy(student, task.loader("eval"))
    result = recover(student, teacher, task, RecoveryConfig(epochs=4, alpha=1.0, learning_rate=3e-3, batch_size=8,
                                                            hidden_weight=0.1))
    assert result.layer_map == {0: 0, 1: 2}  # derived from the layer-drop step recorded on the student
    assert result.steps == 12 and len(result.history) == 4
    assert result.accuracy_before == pytest.approx(acc_before)
    after = kd_to_teacher()
    assert after < 0.5 * before  # the student moved towards the teacher
    assert result.accuracy_after == pytest.approx(accuracy(student, task.loader("eval")))
    assert [s.strategy for s in surgery.inspect(student).steps] == ["layer-drop"]  # weights only changed
    assert all(p.requires_grad for p in teacher.parameters())  # the caller's teacher can seed the next student


def test_training_hands_the_student_and_the_teacher_back_on_their_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    # On a machine with a GPU the Trainer moves the student there when it is built, and compute_loss moves the
    # teacher: train() must put both back where the caller had them. This machine has no second device, so
    # the move is simulated through device_of (the suite run on a GPU checks it for real: the DoE, SHRP and
    # recovery tests there feed CPU inputs to the models training handed back).
    from transformers import Trainer

    from surgery.training import trainer as trainer_module

    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2))
    student = copy.deepcopy(teacher)
    gpu = torch.device("cuda", 0)
    where = {id(teacher): torch.device("cpu"), id(student): torch.device("cpu")}
    moves: list[tuple[str, torch.device]] = []
    monkeypatch.setattr(trainer_module, "device_of", lambda m: where.get(id(m)))
    for name, module in (("student", student), ("teacher", teacher)):
        monkeypatch.setattr(module, "to", lambda device, name=name: moves.append((name, device)))

    def train_on_the_gpu(self, *args, **kwargs):
        where[id(student)] = where[id(teacher)] = gpu
        raise RuntimeError("stopped")  # an interrupted run hands them back too

    monkeypatch.setattr(Trainer, "train", train_on_the_gpu)
    with scratch_dir() as tmp:
        built = SurgeryTrainer(model=student, args=training_arguments(tmp, epochs=1), teacher=teacher)
        moves.clear()  # the Trainer placing the student on its device when built
        with pytest.raises(RuntimeError, match="stopped"):
            built.train()
    assert moves == [("student", torch.device("cpu")), ("teacher", torch.device("cpu"))]
    # A teacher attached during training (SHRP's snapshot of the model) goes back with the student.
    snapshot = copy.deepcopy(teacher)
    monkeypatch.setattr(snapshot, "to", lambda device: moves.append(("snapshot", device)))
    where[id(student)] = torch.device("cpu")

    def snapshot_on_the_gpu(self, *args, **kwargs):
        self.teacher, where[id(snapshot)], where[id(student)] = snapshot, gpu, gpu

    monkeypatch.setattr(Trainer, "train", snapshot_on_the_gpu)
    with scratch_dir() as tmp:
        built = SurgeryTrainer(model=student, args=training_arguments(tmp, epochs=1))
        moves.clear()
        built.train()
    assert moves == [("student", torch.device("cpu")), ("snapshot", torch.device("cpu"))]


def test_recover_needs_labelled_task_data_and_a_matching_teacher() -> None:
    model = tiny_model(TinySpec("bert", task="seq-cls"))
    with pytest.raises(DataError, match="needs labelled task data"):
        recover(model, copy.deepcopy(model), [{"input_ids": torch.tensor([[2, 3]])}])  # type: ignore[arg-type]
    task = TaskData(rows(4), rows(4), ["a", "b", "c"])
    with pytest.raises(ConfigError, match="the model has 3 labels but the teacher has 2"):
        recover(model, tiny_model(TinySpec("bert", task="seq-cls"), num_labels=2), task)
