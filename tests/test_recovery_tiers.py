"""Recovery tiers that fit a CPU: bf16 where the CPU has it, the teacher computed once, block-wise reconstruction,
and each tier's estimate shown before it runs.

Tiny random models; the checks are behaviours (the order of progress events, a count of teacher
forward calls, a layer-output error that must fall, the precision a run was given), never absolute times.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import math

import pytest
import torch

from surgery.anatomy import adapter_for
from surgery.compress import training_tier
from surgery.core.errors import ConfigError
from surgery.core.progress import ProgressEvent
from surgery.measure import machine
from surgery.testing import FAMILIES, TinySpec, tiny_inputs, tiny_model, tiny_task_data
from surgery.training import RecoveryConfig, recover
from surgery.training.blockwise import BlockwiseConfig, output_errors, reconstruct_layers


def cut(model: torch.nn.Module, heads: int = 2, neurons: int = 25) -> torch.nn.Module:
    """A copy of ``model`` with ``heads`` heads and ``neurons`` FFN neurons removed from every layer."""
    student = copy.deepcopy(model)
    adapter = adapter_for(student)
    for i in range(adapter.num_layers):
        adapter.remove_units(i, {"heads": list(range(heads)), "neurons": list(range(neurons))})
    return student


def test_each_tier_shows_its_estimate_before_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(training_tier, "MAX_EPOCHS", 2)  # a tiny model's flat accuracy never ends it early
    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    student = cut(teacher)
    events: list[ProgressEvent] = []
    out = training_tier.train_tiers(student, teacher, tiny_task_data(), 1e6, batch_size=8, progress=events.append,
                                    bf16=False)
    assert out["tiers_run"] == ["blockwise", "distil"]
    tasks = [e.task for e in events]
    for tier, own in (("blockwise", "block-wise reconstruction"), ("distil", "recovery epoch")):
        shown = next(i for i, e in enumerate(events) if e.task == "compress: training tier" and e.info["tier"] == tier)
        first_own = next(i for i, t in enumerate(tasks) if t.startswith(own))
        assert shown < first_own, (tier, tasks)
        assert events[shown].info["estimated_s"] > 0
    for record in out["tiers"]:
        assert record["estimated_seconds"] > 0 and record["seconds"] > 0
        assert record["accuracy_before"] is not None and record["accuracy_after"] is not None
    # The distillation tier was given whole Trainer steps within MAX_EPOCHS epochs.
    assert 0 < out["tiers"][1]["steps"] <= training_tier.MAX_EPOCHS * out["estimates"]["distil"]["steps"]


def test_no_tier_runs_when_none_fits_and_a_short_budget_skips_the_dearer_one() -> None:
    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    student = cut(teacher)
    none = training_tier.train_tiers(student, teacher, tiny_task_data(), 1e-6, batch_size=8, bf16=False)
    assert none["tiers_run"] == [] and none["note"].startswith("no recovery tier fits")
    estimates = none["estimates"]
    # Room for the distillation tier's minimum but not for block-wise reconstruction: only distillation runs.
    d = estimates["distil"]
    room = d["fixed_seconds"] + training_tier.MIN_DISTIL_STEPS * d["step_seconds"] * 1.5
    if room < estimates["blockwise"]["seconds"]:
        some = training_tier.train_tiers(student, teacher, tiny_task_data(), room, batch_size=8, bf16=False)
        assert "blockwise" not in some["tiers_run"]


@pytest.mark.parametrize("native", [True, False])
def test_bf16_training_follows_the_gpu_where_torch_sees_one(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    # The Trainer trains on the GPU whatever the CPU has: a GPU before Ampere (bf16 only emulated, refused by the
    # Trainer) trains in fp32 even on a CPU with avx512_bf16; the torch-bf16 runtime (on the CPU unless told
    # otherwise) then asks the CPU.
    from surgery.runtimes.shared.runtime import bf16_missing

    info = machine.machine_info().model_copy(update={"flags": ["avx512f", "avx512_bf16"]})
    monkeypatch.setattr(machine, "machine_info", lambda *a, **k: info)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    asked: list[bool] = []
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: asked.append(including_emulation) or native)
    assert training_tier.bf16_training() is native
    assert bf16_missing() is None  # natively on the GPU, or else on this CPU
    bare = info.model_copy(update={"flags": ["avx2"]})
    monkeypatch.setattr(machine, "machine_info", lambda *a, **k: bare)
    reason = bf16_missing()
    assert (reason is None) if native else ("no CUDA device with native bf16" in (reason or ""))
    assert training_tier.bf16_training() is native
    assert asked and not any(asked)  # emulated bf16 never counts


def test_the_tiers_are_timed_where_the_trainer_trains_and_handed_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # compress holds its student on the CPU; on a machine with a GPU the Trainer trains there. Steps timed where the
    # student sat priced the tiers many times over what they cost on the GPU (and block-wise reconstruction ran on
    # the CPU). The student and the teacher go to the Trainer's device for the timing and the tiers, then back.
    # This machine has no GPU: the move is simulated (device_of answers from a table that .to updates), the
    # arithmetic stays on the CPU.
    from surgery.training import trainer as trainer_module

    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2))
    student = copy.deepcopy(teacher)
    where = {id(student): torch.device("cpu"), id(teacher): torch.device("cpu")}
    moves: list[tuple[str, str]] = []
    monkeypatch.setattr(trainer_module, "device_of", lambda m: where.get(id(m)))
    for name, module in (("student", student), ("teacher", teacher)):
        def to(device: torch.device, name: str = name, module: torch.nn.Module = module) -> torch.nn.Module:
            moves.append((name, torch.device(device).type))
            where[id(module)] = torch.device(device)
            return module

        monkeypatch.setattr(module, "to", to)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(training_tier, "bf16_training", lambda: False)
    timed: list[str] = []
    real = training_tier.timed_forward

    def timed_forward(model: torch.nn.Module, batch: dict, *, bf16: bool = False) -> float:
        timed.append(where[id(model)].type)
        return real(model, batch, bf16=bf16)

    monkeypatch.setattr(training_tier, "timed_forward", timed_forward)
    # A millisecond: the forwards that size the tiers' floors are timed, and no tier fits.
    out = training_tier.train_tiers(student, teacher, tiny_task_data(8), 1e-3, batch_size=4)
    assert out["tiers_run"] == [] and timed == ["cuda", "cuda"]
    assert moves == [("student", "cuda"), ("teacher", "cuda"), ("student", "cpu"), ("teacher", "cpu")]
    assert trainer_module.training_device().type == "cuda"  # what training_arguments sets use_cpu by


@pytest.mark.parametrize("flags, expected", [(["avx512f", "avx512_bf16"], True), (["avx512f", "amx_bf16"], True),
                                             (["avx2", "avx512f"], False)])
def test_bf16_is_chosen_only_where_the_cpu_has_it(monkeypatch: pytest.MonkeyPatch, flags: list[str],
                                                  expected: bool) -> None:
    info = machine.machine_info().model_copy(update={"flags": flags})
    monkeypatch.setattr(machine, "machine_info", lambda *a, **k: info)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert training_tier.bf16_training() is expected
    seen: list[bool] = []
    recover_module = importlib.import_module("surgery.training.recover")  # the module, not the function
    real_fit = recover_module.fit

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(bool(args[2].bf16))  # type: ignore[attr-defined]  # the Trainer's own switch
        return real_fit(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(recover_module, "fit", spy)
    monkeypatch.setattr(training_tier, "MAX_EPOCHS", 2)
    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    out = training_tier.train_tiers(cut(teacher), teacher, tiny_task_data(), 1e6, batch_size=8,
                                    order=("distil",))
    assert out["bf16"] is expected and seen == [expected]
    assert out["estimates"]["distil"]["bf16"] is expected


def count_forwards(model: torch.nn.Module) -> list[int]:
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_the_teacher_runs_once_per_run_not_once_per_step() -> None:
    data = tiny_task_data(48, batch_size=8)
    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    cached_student, live_student = cut(teacher), cut(teacher)
    calls = count_forwards(teacher)
    cached = recover(cached_student, teacher, data, RecoveryConfig(epochs=3, batch_size=8, cache_teacher=True))
    once = calls[0]
    # One inference pass over the 48 training rows (batches of 32), whatever the epochs and steps.
    assert once == math.ceil(48 / 32) and cached.steps == 3 * 6
    calls[0] = 0
    live = recover(live_student, teacher, data, RecoveryConfig(epochs=3, batch_size=8, cache_teacher=False))
    assert calls[0] == live.steps == 18
    # The same training, numerically: the teacher is frozen and deterministic in eval mode.
    assert [round(h["loss"], 4) for h in cached.history] == [round(h["loss"], 4) for h in live.history]
    for a, b in zip(cached_student.parameters(), live_student.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_the_bf16_trainer_switch_trains_on_a_cpu() -> None:
    data = tiny_task_data(32, batch_size=8)
    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    student = cut(teacher)
    dtypes: list[torch.dtype] = []
    adapter_for(student).layer(0).ffn.down.register_forward_hook(lambda _m, _a, out: dtypes.append(out.dtype))
    result = recover(student, teacher, data, RecoveryConfig(epochs=1, batch_size=8, bf16=True))
    assert result.steps == 4 and math.isfinite(result.history[-1]["loss"])
    assert torch.bfloat16 in dtypes  # the Trainer's autocast ran the student's products in bf16
    assert all(p.dtype == torch.float32 for p in student.parameters())  # autocast: the weights stay fp32
    # After training the model is fp32 again: accelerate's autocast wrapper of forward is removed, so the
    # judging, export and timing that follow see the model as it is (it stayed bf16 before restore_forward).
    dtypes.clear()
    with torch.no_grad():
        student(**tiny_inputs(TinySpec("bert")))
    assert dtypes == [torch.float32]


@pytest.mark.parametrize("family", FAMILIES)
def test_blockwise_reconstruction_lowers_every_cut_layers_output_error(family: str) -> None:
    spec = TinySpec(family, layers=2, heads=4, ffn=37)
    teacher = tiny_model(spec).eval()
    student = cut(teacher)
    batches = [tiny_inputs(spec, batch=8, seed=s) for s in range(3)]
    before = output_errors(student, teacher, batches)
    result = reconstruct_layers(student, teacher, batches, BlockwiseConfig(steps=60, learning_rate=1e-3))
    after = output_errors(student, teacher, batches)
    assert result.layers and all(after[s] < before[s] for s in before), (before, after, result.error)
    for layer, (b, a) in result.error.items():
        assert a <= b, layer
    # Shapes never change: the cut is still the cut.
    assert adapter_for(student).layer(0).ffn.down.in_features == 37 - 25


def test_blockwise_follows_a_layer_drop_through_the_layer_map() -> None:
    spec = TinySpec("bert", layers=3, heads=4, ffn=37)
    teacher = tiny_model(spec).eval()
    student = copy.deepcopy(teacher)
    del adapter_for(student).layers()[1]  # layer 1 gone: student layers 0, 1 map to teacher layers 0, 2
    student.config.num_hidden_layers = 2
    batches = [tiny_inputs(spec, batch=8, seed=s) for s in range(2)]
    mapping = {0: 0, 1: 2}
    before = output_errors(student, teacher, batches, layer_map=mapping)
    reconstruct_layers(student, teacher, batches, BlockwiseConfig(steps=60, learning_rate=1e-3), layer_map=mapping)
    after = output_errors(student, teacher, batches, layer_map=mapping)
    assert before[0] == 0.0 and after[1] < before[1]


def test_distillation_stops_after_epochs_below_the_best_and_keeps_the_best(monkeypatch: pytest.MonkeyPatch) -> None:
    recover_module = importlib.import_module("surgery.training.recover")
    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    student = cut(teacher)
    # Before training, then epochs 1-8. Epoch 3 equals epoch 2's best (a plateau goes on and the later is kept);
    # epochs 4-6 measure below it, so the run ends after epoch 6 of 8 and never sees epoch 7's 0.9.
    scripted = iter([0.4, 0.5, 0.7, 0.7, 0.6, 0.65, 0.6, 0.9, 0.9])
    snapshots: list[list[torch.Tensor]] = []

    def scripted_accuracy(model: torch.nn.Module, loader: object) -> float:
        snapshots.append([p.detach().cpu().clone() for p in model.parameters()])  # trained on a GPU where there is one
        return next(scripted)

    monkeypatch.setattr(recover_module, "accuracy", scripted_accuracy)
    result = recover(student, teacher, tiny_task_data(32, batch_size=8),
                     RecoveryConfig(epochs=8, batch_size=8, keep_best=True, patience=3))
    assert [h["accuracy"] for h in result.history] == [0.5, 0.7, 0.7, 0.6, 0.65, 0.6]
    assert result.stopped_early and result.steps == 6 * 4
    assert result.best_epoch == 3 and result.accuracy_after == 0.7
    for p, kept in zip(student.parameters(), snapshots[3], strict=True):  # snapshots[k]: after epoch k
        assert torch.equal(p, kept)
    for other in (snapshots[2], snapshots[6]):  # neither the earlier equal epoch nor the last one
        assert any(not torch.equal(k, o) for k, o in zip(snapshots[3], other, strict=True))


def test_keep_best_without_an_eval_split_is_refused() -> None:
    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    data = dataclasses.replace(tiny_task_data(16, batch_size=8), eval=None)
    with pytest.raises(ConfigError, match="keep_best and patience"):
        recover(cut(teacher), teacher, data, RecoveryConfig(epochs=1, batch_size=8, patience=2))


def test_the_training_tier_spends_the_budget_past_a_few_epochs_but_measures_only_what_it_is_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # compress hands the tier the search part of dev; the tier's measurements read that split and nothing else.
    measured: list[int] = []
    recover_module = importlib.import_module("surgery.training.recover")
    real = recover_module.accuracy

    def counting(model: torch.nn.Module, loader: object) -> float:
        measured.append(len(loader.dataset))  # type: ignore[attr-defined]
        return real(model, loader)

    monkeypatch.setattr(recover_module, "accuracy", counting)
    monkeypatch.setattr(training_tier, "PATIENCE", 100)  # the budget, not patience, ends this run
    data = tiny_task_data(32, batch_size=8)
    search = dataclasses.replace(data, eval=data.eval.select(range(5)))
    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    out = training_tier.train_tiers(cut(teacher), teacher, search, 1e6, batch_size=8, order=("distil",), bf16=False)
    record = out["tiers"][0]
    # An unbounded budget runs to MAX_EPOCHS, past the 6 epochs the tier used to stop at.
    assert record["epochs_run"] == training_tier.MAX_EPOCHS > 6 and not record["stopped_early"]
    assert record["steps"] == training_tier.MAX_EPOCHS * out["estimates"]["distil"]["steps"]
    assert measured and set(measured) == {5}
    assert len(record["curve"]) == record["epochs_run"] and all(0 <= e["train_acc"] <= 1 for e in record["curve"])


def test_masked_copies_are_labelled_by_the_teacher_on_the_masked_text() -> None:
    from tests.helpers import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    data = dataclasses.replace(tiny_task_data(32, batch_size=8), tokenizer=tokenizer)
    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    student = cut(teacher)  # before the hook: a deep copy would carry it
    seen: list[list[int]] = []
    teacher.register_forward_pre_hook(lambda _m, _a, kw: seen.extend(kw["input_ids"].tolist()), with_kwargs=True)
    result = recover(student, teacher, data, RecoveryConfig(epochs=1, batch_size=8, masked_copies=2))
    assert result.steps == 3 * 32 // 8  # the rows and two masked copies, one epoch
    assert len(seen) == 3 * 32  # the teacher's one cached pass covered every copy
    mask = tokenizer.mask_token_id
    masked_rows = [row for row in seen if mask in row]
    assert 0 < len(masked_rows) <= 64 and all(row[0] == tokenizer.cls_token_id for row in masked_rows)
    masked = sum(row.count(mask) for row in seen)
    real = sum(sum(1 for t in row if t not in (tokenizer.pad_token_id, mask)) for row in seen[32:]) + masked
    assert 0.05 < masked / (real - 2 * 2 * 32) < 0.3  # about 15% of the copies' non-special tokens


def test_masked_copies_without_a_mask_token_are_refused() -> None:
    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    with pytest.raises(ConfigError, match="masked copies"):
        recover(cut(teacher), teacher, tiny_task_data(16, batch_size=8),
                RecoveryConfig(epochs=1, batch_size=8, masked_copies=1))


def test_the_distillation_estimate_counts_the_masked_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers import tiny_tokenizer

    monkeypatch.setattr(training_tier, "MASKED_COPIES", 2)  # off by default; the estimate must count them when on

    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    plain = tiny_task_data(32, batch_size=8)
    with_mask = dataclasses.replace(plain, tokenizer=tiny_tokenizer())
    assert training_tier.masked_copies_for(plain) == 0
    assert training_tier.masked_copies_for(with_mask) == training_tier.MASKED_COPIES
    steps = [training_tier.estimate_distil(cut(teacher), teacher, d, 8).steps for d in (plain, with_mask)]
    assert steps[1] == (1 + training_tier.MASKED_COPIES) * steps[0]


def test_embedding_distillation_is_priced_with_the_teacher_where_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # The embedding objective reads the teacher's layers for a student that kept every layer (its teacher runs at
    # every step) and only its sentence embeddings after a layer-drop (computed once for the run, masked copies too).
    import surgery
    from surgery.embedding import SentenceConfig, load_text_data
    from surgery.strategies.pruning.layer_drop import LayerDropStrategy
    from tests.helpers import EMBEDDING_TEXTS, tiny_tokenizer

    data = load_text_data(EMBEDDING_TEXTS, tiny_tokenizer(), batch_size=8)
    data.sentence_config = SentenceConfig(normalize=True)
    teacher = tiny_model(TinySpec("bert", layers=3)).eval()
    dropped = copy.deepcopy(teacher)
    surgery.convert(dropped, LayerDropStrategy(count=1))
    assert training_tier.teacher_each_step(cut(teacher), teacher, data)
    assert not training_tier.teacher_each_step(dropped, teacher, data)
    live = training_tier.estimate_distil(cut(teacher), teacher, data, 8)
    cached = training_tier.estimate_distil(dropped, teacher, data, 8)
    assert live.fixed_seconds == 0 and cached.fixed_seconds > 0 and live.steps == cached.steps
    monkeypatch.setattr(training_tier, "EMBEDDING_MASKED_COPIES", 2)
    assert training_tier.masked_copies_for(data) == 2
    assert training_tier.estimate_distil(dropped, teacher, data, 8).steps == 3 * cached.steps
    run = training_tier.distil(dropped, teacher, data, epochs=1, batch_size=8)
    assert run.steps == 3 * cached.steps and run.hidden_weight == 0.0


def test_the_hidden_state_term_of_a_task_distillation_runs_the_teacher_each_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    data = tiny_task_data(32, batch_size=8)
    logits_only = training_tier.estimate_distil(cut(teacher), teacher, data, 8)
    assert logits_only.fixed_seconds > 0  # the teacher's logits once per run
    monkeypatch.setattr(training_tier, "TASK_HIDDEN_WEIGHT", 1.0)
    with_hidden = training_tier.estimate_distil(cut(teacher), teacher, data, 8)
    assert with_hidden.fixed_seconds == 0 and with_hidden.steps == logits_only.steps  # the teacher in every step
    student = cut(teacher)
    run = training_tier.distil(student, teacher, data, epochs=1, batch_size=8)
    assert run.hidden_weight == 1.0 and run.layer_map == {0: 0, 1: 1}
    monkeypatch.setattr(training_tier, "TASK_HIDDEN_WEIGHT", 0.0)
    assert training_tier.distil(cut(teacher), teacher, data, epochs=1, batch_size=8).hidden_weight == 0.0


def test_a_time_limit_ends_distillation_at_the_first_step_past_it_and_the_cut_epoch_is_still_measured() -> None:
    # Sized in steps from a timed step, a run overruns when the machine gets busier; the limit holds the budget.
    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    data = tiny_task_data(32, batch_size=8)
    unlimited = recover(cut(teacher), teacher, data, RecoveryConfig(epochs=2, batch_size=8))
    assert unlimited.steps == 8 and not unlimited.time_limit_reached
    limited = recover(cut(teacher), teacher, data, RecoveryConfig(epochs=2, batch_size=8, max_seconds=0.0,
                                                                  keep_best=True))
    assert limited.steps == 1 and limited.time_limit_reached
    # The Trainer ran the epoch's callbacks after the stop: the short epoch was measured and kept as the best.
    assert len(limited.history) == 1 and limited.history[0]["accuracy"] is not None and limited.best_epoch == 1


def test_a_time_limit_ends_blockwise_reconstruction_and_leaves_the_layers_above_untouched() -> None:
    spec = TinySpec("bert", layers=2, heads=4, ffn=37)
    teacher = tiny_model(spec).eval()
    student = cut(teacher)
    weights = {k: v.clone() for k, v in student.state_dict().items()}
    batches = [tiny_inputs(spec, batch=8, seed=s) for s in range(2)]
    result = reconstruct_layers(student, teacher, batches, BlockwiseConfig(steps=60, max_seconds=0.0))
    assert result.time_limit_reached and result.steps == 0 and result.error == {}
    assert all(torch.equal(v, weights[k]) for k, v in student.state_dict().items())
    full = reconstruct_layers(cut(teacher), teacher, batches, BlockwiseConfig(steps=5))
    assert full.steps == 10 and not full.time_limit_reached


def test_each_tier_is_limited_to_the_time_left_when_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    given: dict[str, float | None] = {}
    real_distil, real_blockwise = training_tier.distil, training_tier.reconstruct_layers

    def distil(*args: object, max_seconds: float | None = None, **kwargs: object) -> object:
        given["distil"] = max_seconds
        return real_distil(*args, max_seconds=max_seconds, **kwargs)  # type: ignore[arg-type]

    def blockwise(student: object, teacher: object, batches: object, config: BlockwiseConfig, **kw: object) -> object:
        given["blockwise"] = config.max_seconds
        return real_blockwise(student, teacher, batches, config, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(training_tier, "distil", distil)
    monkeypatch.setattr(training_tier, "reconstruct_layers", blockwise)
    monkeypatch.setattr(training_tier, "MAX_EPOCHS", 2)  # a tiny model's flat accuracy never ends it early
    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    out = training_tier.train_tiers(cut(teacher), teacher, tiny_task_data(), 500.0, batch_size=8, bf16=False)
    assert out["tiers_run"] == ["blockwise", "distil"]
    blockwise_seconds = out["tiers"][0]["seconds"]
    # Each limit is what was left of the 500 s: less the timed steps, and for distillation less block-wise's run.
    assert 0 < given["blockwise"] < 500.0  # type: ignore[operator]
    assert given["distil"] == pytest.approx(given["blockwise"] - blockwise_seconds, abs=0.05)  # type: ignore[operator]
    assert all(record["time_limit_reached"] is False for record in out["tiers"])


def test_a_tier_whose_untimed_part_cannot_fit_is_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    # A timed step at 32 x 512 tokens on BERT-base widths is a minute and gigabytes: at the end of a budget it is
    # not taken when the forwards alone say no tier fits.
    timed: list[str] = []
    monkeypatch.setattr(training_tier, "timed_distil_step", lambda *a, **k: timed.append("distil") or 1.0)
    monkeypatch.setattr(training_tier, "layer_step_seconds", lambda *a, **k: timed.append("blockwise") or [1.0])
    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    out = training_tier.train_tiers(cut(teacher), teacher, tiny_task_data(), 1e-6, batch_size=8, bf16=False)
    assert timed == [] and out["tiers_run"] == []
    assert [e["timed"] for e in out["estimates"].values()] == [False, False]
    assert "at least" in out["note"]
    spent = training_tier.train_tiers(cut(teacher), teacher, tiny_task_data(), -5.0, batch_size=8, bf16=False)
    assert spent["tiers_run"] == [] and spent["estimates"] == {} and "no time left" in spent["note"]
    roomy = training_tier.train_tiers(cut(teacher), teacher, tiny_task_data(), 1e6, batch_size=8, bf16=False,
                                      order=())
    assert roomy["tiers_run"] == [] and timed == []  # tiers not asked for are not timed either


def test_a_micro_batched_distillation_step_is_the_whole_batch_step() -> None:
    # Gradient accumulation over equal micro-batches of a per-example mean loss: the same optimiser step.
    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    data = tiny_task_data()
    trained = []
    for micro in (None, 2):
        student = cut(teacher)
        for module in student.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        result = recover(student, teacher, data, RecoveryConfig(epochs=1, batch_size=8, max_steps=1, seed=3,
                                                                micro_batch=micro, cache_teacher=True))
        assert result.steps == 1
        trained.append(student)
    for a, b in zip(trained[0].parameters(), trained[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-4)
    moved = any(not torch.equal(a, b) for a, b in zip(trained[0].parameters(), cut(teacher).parameters(),
                                                      strict=True))
    assert moved  # a step was taken


def test_distillation_runs_in_micro_batches_that_fit_the_activation_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from surgery.compress import mask_fisher

    seen: list[int | None] = []
    real = training_tier.distil

    def distil(*args: object, micro_batch: int | None = None, **kwargs: object) -> object:
        seen.append(micro_batch)
        return real(*args, micro_batch=micro_batch, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(training_tier, "distil", distil)
    monkeypatch.setattr(training_tier, "MAX_EPOCHS", 2)  # a tiny model never stops early; 8 steps at least
    teacher = tiny_model(TinySpec("bert", task="seq-cls", layers=2)).eval()
    wide = training_tier.train_tiers(cut(teacher), teacher, tiny_task_data(), 1e6, batch_size=8, bf16=False,
                                     order=("distil",))
    monkeypatch.setattr(mask_fisher, "BACKWARD_ACTIVATION_BYTES", 1)  # one row at a time
    narrow = training_tier.train_tiers(cut(teacher), teacher, tiny_task_data(), 1e6, batch_size=8, bf16=False,
                                       order=("distil",))
    assert wide["micro_batch"] is None and narrow["micro_batch"] == 1
    assert narrow["estimates"]["distil"]["micro_batch"] == 1 and seen == [None, 1]
    assert narrow["tiers_run"] == ["distil"] and narrow["tiers"][0]["steps"] > 0
