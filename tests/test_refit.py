"""Least-squares refit of the output projections: exact on what it can reproduce, never worse, every family."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import surgery
from surgery.anatomy import adapter_for
from surgery.strategies import FFNPruningStrategy, HeadPruningStrategy, LayerDropStrategy
from surgery.testing import FAMILIES, TinySpec, main_output, tiny_inputs, tiny_model
from surgery.training.refit import (
    TeacherOutputs,
    changed_projections,
    projection,
    projection_name,
    refit_projections,
    refit_targets,
    residual_sums,
)
from tests.helpers import one_family_fast


def _batches(spec: TinySpec, n: int = 4) -> list[dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    return [tiny_inputs(spec, batch=16) for _ in range(n)]


def _run_watched(handles: list[Any], batches: list[dict[str, torch.Tensor]], *models: torch.nn.Module
                 ) -> list[torch.Tensor]:
    """Every batch through ``models`` for the hooks in ``handles``, which are removed after; the real-token masks."""
    with torch.no_grad():
        for batch in batches:
            for model in models:
                model(**batch)
    for handle in handles:
        handle.remove()
    return [b["attention_mask"].bool() for b in batches]


@pytest.mark.parametrize("family", FAMILIES)
def test_refit_lowers_the_error_of_every_cut_projection_and_reloads(family: str, tmp_path) -> None:
    spec = TinySpec(family, layers=2, heads=4, ffn=37)
    teacher = tiny_model(spec).eval()
    student = copy.deepcopy(teacher)
    surgery.convert(student, HeadPruningStrategy(heads={1: [0, 2]}))
    surgery.convert(student, FFNPruningStrategy(neurons={0: list(range(0, 37, 2))}))
    batches = _batches(spec)
    result = refit_projections(student, teacher, batches)
    assert set(result.projections) == {"1:o", "0:down"}
    for before, after in result.error.values():
        assert after < before
    # Shapes are unchanged, so the saved model rebuilds by replay and loads the refitted weights strictly.
    inputs = batches[0]
    out = surgery.save_pretrained(student, tmp_path / "m")
    torch.testing.assert_close(main_output(surgery.from_pretrained(out), inputs), main_output(student, inputs))


def test_refit_is_the_least_squares_solution() -> None:
    # With no ridge, the refitted down projection's output has zero correlation left with its
    # inputs: the residual is orthogonal to [x, 1] (the normal equations), checked independently here.
    spec = TinySpec("bert", layers=1, heads=4, ffn=37)
    teacher = tiny_model(spec).eval()
    student = copy.deepcopy(teacher)
    adapter_for(student).remove_units(0, {"neurons": list(range(20))})
    batches = _batches(spec, 8)
    refit_projections(student, teacher, batches, ridge=0.0)
    xs, ys = [], []
    mine, theirs = projection(student, 0, "down"), projection(teacher, 0, "down")
    handles = [mine.register_forward_pre_hook(lambda _m, a: xs.append(a[0])),
               theirs.register_forward_hook(lambda _m, _a, o: ys.append(o))]
    masks = _run_watched(handles, batches, student, teacher)
    x = torch.cat([t[m] for t, m in zip(xs, masks, strict=True)]).double()
    y = torch.cat([t[m] for t, m in zip(ys, masks, strict=True)]).double()
    x1 = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    residual = y - (x @ mine.weight.detach().double().T + mine.bias.detach().double())
    assert float((x1.T @ residual).abs().max()) < 1e-6 * float((x1.T @ y).abs().max())


@pytest.mark.parametrize("family", ["bert", "modernbert"])  # post-LN (a norm reads each sum), pre-LN (layer output)
def test_the_residual_refit_is_the_least_squares_solution_for_the_sum_it_feeds(family: str) -> None:
    # The default (residual=True) solves the down projection for the original's residual sum, not its own output:
    # with no ridge, what is left of (the original's sum - the student's) has zero correlation with [x, 1], checked
    # here from full forwards. The heads cut below it change the stream the FFN adds to, so the two targets differ.
    spec = TinySpec(family, layers=2, heads=4, ffn=37)
    teacher = tiny_model(spec).eval()
    student = copy.deepcopy(teacher)
    adapter_for(student).remove_units(1, {"neurons": list(range(20)), "heads": [0, 1]})
    batches = _batches(spec, 8)
    plain = copy.deepcopy(student)
    refit_projections(plain, teacher, batches, ridge=0.0, residual=False)
    refit_projections(student, teacher, batches, ridge=0.0)  # residual=True, the default
    found: dict[str, list[torch.Tensor]] = {"x": [], "mine": [], "theirs": []}

    def sum_hook(model: torch.nn.Module, key: str) -> Any:
        where = residual_sums(model, 1)["down"]
        if isinstance(where, torch.nn.Module):
            return where.register_forward_pre_hook(lambda _m, a: found[key].append(a[0]))
        return adapter_for(model).layers()[1].register_forward_hook(
            lambda _m, _a, o: found[key].append(o[0] if isinstance(o, tuple) else o))

    mine = projection(student, 1, "down")
    handles = [mine.register_forward_pre_hook(lambda _m, a: found["x"].append(a[0])),
               sum_hook(student, "mine"), sum_hook(teacher, "theirs")]
    masks = _run_watched(handles, batches, student, teacher)

    def rows(key: str) -> torch.Tensor:
        return torch.cat([t[m] for t, m in zip(found[key], masks, strict=True)]).double()

    x = rows("x")
    x1 = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1) if mine.bias is not None else x  # ModernBERT: none
    left = rows("theirs") - rows("mine")
    assert float((x1.T @ left).abs().max()) < 1e-6 * float((x1.T @ rows("theirs")).abs().max())
    assert not torch.allclose(mine.weight, projection(plain, 1, "down").weight)  # not the plain solution


@pytest.mark.parametrize("family", FAMILIES)
def test_residual_sums_name_where_each_family_adds_its_projections(family: str) -> None:
    model = tiny_model(TinySpec(family, layers=2))
    norms = adapter_for(model).layer(1).norms
    expected = ({"o": norms["ffn"], "down": "layer output"} if family == "modernbert"  # pre-LN
                else {"o": norms["attention"], "down": norms["ffn"]})
    assert residual_sums(model, 1) == expected


def test_a_replaced_layer_gives_no_residual_sums() -> None:
    from surgery.strategies import ExpertAttentionStrategy

    spec = TinySpec("bert", layers=2, heads=4, ffn=37)
    teacher = tiny_model(spec).eval()
    routed = copy.deepcopy(teacher)
    surgery.convert(routed, ExpertAttentionStrategy())  # every layer replaced by a routed one
    assert residual_sums(routed, 0) == {} and residual_sums(routed, 1) == {}


def test_only_cut_projections_change_by_default_and_layer_drop_maps_layers() -> None:
    spec = TinySpec("bert", layers=4, heads=4, ffn=37)
    teacher = tiny_model(spec).eval()
    student = copy.deepcopy(teacher)
    surgery.convert(student, LayerDropStrategy(layers=[1, 3]))
    surgery.convert(student, FFNPruningStrategy(neurons={1: [0, 1, 2]}))  # student layer 1 was teacher layer 2
    assert changed_projections(student, teacher, {0: 0, 1: 2}) == [(1, "down")]
    kept = copy.deepcopy(student)
    result = refit_projections(student, teacher, _batches(spec))
    assert result.projections == ["1:down"]
    for name in ("o", "down"):
        assert torch.equal(projection(student, 0, name).weight, projection(kept, 0, name).weight)
    assert torch.equal(projection(student, 1, "o").weight, projection(kept, 1, "o").weight)
    assert not torch.equal(projection(student, 1, "down").weight, projection(kept, 1, "down").weight)


@pytest.mark.slow
def test_recovery_refits_first_when_asked_for_both_objectives() -> None:
    import datasets
    from transformers import BertTokenizer

    from surgery.data.task_data import TaskData
    from surgery.embedding.objective import recover_embeddings
    from surgery.embedding.texts import load_text_data
    from surgery.training import RecoveryConfig, recover

    spec = TinySpec("bert", task="seq-cls", layers=2, heads=4, ffn=37)
    teacher = tiny_model(spec, num_labels=2).eval()
    student = copy.deepcopy(teacher)
    surgery.convert(student, FFNPruningStrategy(neurons={0: list(range(20))}))
    rows = datasets.Dataset.from_dict({"input_ids": [[2, 5 + i % 7, 9, 3] for i in range(64)],
                                       "labels": [i % 2 for i in range(64)]})
    result = recover(student, teacher, TaskData(rows, rows, ["a", "b"]), RecoveryConfig(epochs=0, refit=True))
    assert result.refit is not None and result.refit.projections == ["0:down"]
    assert result.accuracy_after == result.accuracy_refit is not None and result.steps == 0
    assert recover(copy.deepcopy(student), teacher, TaskData(rows, rows, ["a", "b"]), epochs=0).refit is None

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b", "c"]
    tok = BertTokenizer(vocab={t: i for i, t in enumerate(words)})
    texts = [" ".join("abc"[(i >> j) % 3] for j in range(6)) for i in range(64)]
    plain = tiny_model(TinySpec("bert", layers=2, heads=4, ffn=37)).eval()
    cut = copy.deepcopy(plain)
    surgery.convert(cut, HeadPruningStrategy(heads={1: [0]}))
    done = recover_embeddings(cut, plain, load_text_data(texts, tok, batch_size=8),
                              RecoveryConfig(epochs=1, batch_size=8, refit=True))
    assert done.refit is not None and done.refit.projections == ["1:o"] and done.steps > 0


def test_cli_refit_alone_is_the_recovery_and_is_reported(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from surgery.cli.app import app
    from tests.helpers import labelled_rows, tiny_tokenizer, write_rows  # the CLI tests' tiny tokenizer and data

    model = tiny_model(TinySpec("bert", task="base", heads=4))
    model.save_pretrained(tmp_path / "m")
    tiny_tokenizer().save_pretrained(tmp_path / "m")
    data = write_rows(tmp_path / "train.csv", labelled_rows(40))
    result = CliRunner().invoke(app, ["apply", str(tmp_path / "m"), "-s", "head-prune", "--set", "heads={0: [1, 2]}",
                                      "--data", str(data), "--refit", "-o", str(tmp_path / "out"),
                                      "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    recovery = json.loads((tmp_path / "r.json").read_text())["checks"][0]["recovery"]
    assert recovery["epochs"] == 0 and recovery["refit"]["projections"] == ["0:o"]
    assert surgery.from_pretrained(tmp_path / "out") is not None


def _cut_everywhere(spec: TinySpec, *, drop: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A tiny teacher and a copy with heads and neurons cut in every layer (and layer 1 dropped)."""
    teacher = tiny_model(spec).eval()
    student = copy.deepcopy(teacher)
    for layer in range(spec.layers):
        adapter_for(student).remove_units(layer, {"neurons": list(range(layer, 30, 3)), "heads": [layer % spec.heads]})
    if drop:
        surgery.convert(student, LayerDropStrategy(layers=[1]))
    return teacher, student


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("family", one_family_fast())
def test_refit_solves_on_the_activations_a_full_forward_computes(family: str, residual: bool) -> None:
    # The refit runs each layer from cached hidden states (the layers below are fixed by then), not the
    # whole model per projection: every activation it reads must still be, bit for bit, what a full
    # forward of the model, with the weights it had at that moment, computes on one of the batches.
    spec = TinySpec(family, layers=4, heads=4, ffn=37)
    teacher, student = _cut_everywhere(spec, drop=True)
    batches = [tiny_inputs(spec, batch=5, seq=9, seed=s) for s in range(3)]
    for batch in batches:
        batch["attention_mask"][0, 6:] = 0  # padding: its positions are left out of the solve
    models = {"student": student, "teacher": teacher}
    pristine = {who: copy.deepcopy(model) for who, model in models.items()}  # no hooks: the references' models
    fired: list[tuple[str, str, bool, torch.Tensor, dict[str, torch.Tensor]]] = []

    def watch(who: str, name: str, inputs: bool) -> Any:
        model = models[who]

        def keep(value: torch.Tensor) -> None:
            state = {k: v.clone() for k, v in model.state_dict().items()}
            fired.append((who, name, inputs, value.detach().clone(), state))
        module = model.get_submodule(name)
        if inputs:
            return module.register_forward_pre_hook(lambda _m, a: keep(a[0]))
        return module.register_forward_hook(lambda _m, _a, o: keep(o))

    layer_map, targets = refit_targets(student, teacher)
    handles = [watch("student", projection_name(student, layer, name), True) for layer, name in targets]
    handles += [watch("teacher", projection_name(teacher, layer_map[layer], name), False) for layer, name in targets]
    try:
        result = refit_projections(student, teacher, batches, residual=residual)
    finally:
        for handle in handles:
            handle.remove()
    assert len(result.projections) >= 4 and {who for who, *_ in fired} == {"student", "teacher"}
    for who, name, inputs, value, state in fired:
        model = pristine[who]
        model.load_state_dict(state)
        found: list[torch.Tensor] = []
        module = model.get_submodule(name)
        handle = (module.register_forward_pre_hook(lambda _m, a, f=found: f.append(a[0])) if inputs
                  else module.register_forward_hook(lambda _m, _a, o, f=found: f.append(o)))
        with torch.no_grad():
            for batch in batches:
                model(**batch)
        handle.remove()
        assert any(torch.equal(value, ref) for ref in found), f"{who} {name}: not what a full forward computes"


def test_refit_runs_the_layers_below_a_projection_once_per_batch() -> None:
    # Eight cut projections: a forward from the embeddings for each ran the teacher's first layer eight
    # times per batch; from cached hidden states it runs twice (recording the calls, then once).
    spec = TinySpec("bert", layers=4, heads=4, ffn=37)
    teacher, student = _cut_everywhere(spec, drop=False)
    batches = _batches(spec, 3)
    calls = {"teacher": 0, "student": 0}
    hooks = [adapter_for(model).layers()[0].register_forward_hook(
        lambda *_a, who=who: calls.__setitem__(who, calls[who] + 1)) for who, model in (("teacher", teacher),
                                                                                       ("student", student))]
    result = refit_projections(student, teacher, batches)
    for hook in hooks:
        hook.remove()
    assert len(result.projections) == 8
    assert calls["teacher"] == 2 * len(batches)
    assert calls["student"] <= 4 * len(batches)  # recording, the runs for its own two projections, advancing


def _layer_calls(model: torch.nn.Module) -> tuple[list[int], list[Any]]:
    """A counter of ``model``'s encoder layer calls, and the hooks to remove."""
    count = [0]
    hooks = [layer.register_forward_hook(lambda *_a: count.__setitem__(0, count[0] + 1))
             for layer in adapter_for(model).layers()]
    return count, hooks


@pytest.mark.parametrize("residual", [True, False])
def test_a_second_cut_refits_against_kept_teacher_outputs_without_running_the_teacher_bit_for_bit(
        residual: bool) -> None:
    spec = TinySpec("bert", layers=3, heads=4, ffn=37)
    teacher, first = _cut_everywhere(spec, drop=False)
    second = copy.deepcopy(first)
    adapter_for(second).remove_units(1, {"heads": [0]})  # another cut of the same teacher
    alone = copy.deepcopy(second)
    batches = _batches(spec, 3)
    kept = TeacherOutputs(teacher, batches)
    refit_projections(first, teacher, batches, residual=residual, teacher_outputs=kept)
    assert kept.layers == [0, 1, 2] and kept.misses == 3 and kept.hits == 0
    runs, hooks = _layer_calls(teacher)
    with_kept = refit_projections(second, teacher, batches, residual=residual, teacher_outputs=kept)
    for hook in hooks:
        hook.remove()
    assert runs[0] == 0 and kept.hits == 3  # the teacher did not run at all
    without = refit_projections(alone, teacher, batches, residual=residual)
    assert with_kept.projections == without.projections and with_kept.error == without.error
    for (name, a), b in zip(second.state_dict().items(), alone.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_teacher_outputs_past_their_bytes_are_computed_again_from_the_layers_below() -> None:
    # Room for one layer: the first is kept, the teacher's pass for the others starts from the embeddings and runs
    # the kept layer too (its hidden states are not kept), and every solve is the same as without a cache.
    spec = TinySpec("bert", layers=3, heads=4, ffn=37)
    teacher, first = _cut_everywhere(spec, drop=False)
    second, alone = copy.deepcopy(first), copy.deepcopy(first)
    batches = _batches(spec, 2)
    probe = TeacherOutputs(teacher, batches)
    refit_projections(copy.deepcopy(first), teacher, batches, teacher_outputs=probe)
    one_layer = probe.nbytes // 3
    kept = TeacherOutputs(teacher, batches, max_bytes=one_layer)
    refit_projections(first, teacher, batches, teacher_outputs=kept)
    assert kept.layers == [0] and 0 < kept.nbytes <= one_layer
    refit_projections(second, teacher, batches, teacher_outputs=kept)
    assert (kept.hits, kept.misses) == (1, 5)
    refit_projections(alone, teacher, batches)
    for (name, a), b in zip(second.state_dict().items(), alone.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    nothing = TeacherOutputs(teacher, batches, max_bytes=0)
    refit_projections(copy.deepcopy(first), teacher, batches, teacher_outputs=nothing)
    assert nothing.layers == [] and nothing.nbytes == 0


def test_teacher_outputs_serve_only_their_teacher_and_batches() -> None:
    spec = TinySpec("bert", layers=2, heads=4, ffn=37)
    teacher, student = _cut_everywhere(spec, drop=False)
    batches = _batches(spec, 2)
    kept = TeacherOutputs(teacher, batches)
    assert kept.serves(teacher, list(batches))
    other = [dict(b) for b in _batches(spec, 2)]  # equal values, other tensors: not what was kept
    assert not kept.serves(teacher, other) and not kept.serves(copy.deepcopy(teacher), batches)
    assert not kept.serves(teacher, batches[:1])
    with pytest.raises(ValueError, match="another teacher or other batches"):
        refit_projections(student, teacher, other, teacher_outputs=kept)
