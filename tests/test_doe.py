"""DoE properties on tiny models of every family: pruning, zero-recovery, attribution, prompts, DoE end to end."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import datasets
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import surgery
from surgery.anatomy import adapter_for
from surgery.anatomy.slicing import ZeroRecoveryLinear
from surgery.data.task_data import TaskData
from surgery.scoring.importance import gold_logit_objective
from surgery.strategies.doe import DoEPipeline, run_doe
from surgery.strategies.doe.prompt_tuning import evaluate
from surgery.strategies.doe.soft_prompt import SoftPromptStrategy, prompt_of
from surgery.strategies.doe.zero_recovery_prune import ZeroRecoveryPruningStrategy, module_scores
from surgery.testing import FAMILIES, TinySpec, main_output, tiny_inputs, tiny_model, tiny_specs

SETS = st.sampled_from(["ffn", "attention", "dense", "all"])


def _proj(attention, part):
    """The Linear computing ``part`` and the row offset of that part in it (written out: the reference)."""
    if attention.qkv is not None:
        return attention.qkv, {"q": 0, "k": 1, "v": 2}[part] * attention.num_heads * attention.head_dim
    return {"q": attention.query, "k": attention.key, "v": attention.value}[part], 0


def masked(model, remove):
    """Reference: the same units zeroed (rows of q/k/v/o, down columns) in a copy."""
    m = copy.deepcopy(model)
    adapter = adapter_for(m)
    with torch.no_grad():
        for layer, groups in remove.items():
            parts = adapter.layer(int(layer))
            for group, units in groups.items():
                if group == "neurons":
                    parts.ffn.down.weight[:, units] = 0
                    continue
                linears = [(parts.attention.output, 0)] if group == "o" else [
                    _proj(parts.attention, p) for p in (("q", "k") if group == "qk" else ("v",))]
                for lin, offset in linears:
                    rows = [offset + u for u in units]
                    lin.weight[rows] = 0
                    if lin.bias is not None:
                        lin.bias[rows] = 0
    return m


@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data(), module_set=SETS)
def test_keep_all_is_identity(family, data, module_set) -> None:
    spec = data.draw(tiny_specs(families=(family,)))
    model, x = tiny_model(spec), tiny_inputs(spec)
    ref = main_output(model, x)
    surgery.convert(model, ZeroRecoveryPruningStrategy(module_set=module_set, ratio=0.0, importance="random"))
    assert torch.equal(main_output(model, x), ref)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data(), module_set=SETS, ratio=st.floats(0.05, 1.0))
def test_pruning_equals_masking_and_keeps_width(family, data, module_set, ratio) -> None:
    spec = data.draw(tiny_specs(families=(family,)))
    model, x = tiny_model(spec), tiny_inputs(spec)
    report = surgery.convert(model, ZeroRecoveryPruningStrategy(module_set=module_set, ratio=ratio, importance="random",
                                                          seed=spec.seed))
    reference = masked(tiny_model(spec), report.plan["remove"])
    out = main_output(model, x)
    assert out.shape == main_output(reference, x).shape
    assert torch.allclose(out, main_output(reference, x), atol=1e-5)
    adapter = adapter_for(model)
    for i in range(adapter.num_layers):
        for mod in adapter.layer(i).module.modules():
            if isinstance(mod, ZeroRecoveryLinear):  # computes fewer rows, emits full width
                assert mod.weight.shape[0] <= mod.out_features
                assert mod(torch.zeros(1, mod.in_features)).shape[-1] == mod.out_features


@pytest.mark.parametrize("kept_fraction", [0.25, 0.9])  # the sliced+scatter path and the zero-padded dense path
def test_zero_recovery_linear_equals_a_masked_linear_with_the_same_gradients(kept_fraction) -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 20)
    kept = sorted(torch.randperm(20)[: int(kept_fraction * 20)].tolist())
    zr = ZeroRecoveryLinear.from_linear(lin, kept)
    assert (len(kept) > zr.dense_above * 20) == (kept_fraction > zr.dense_above)
    mask = torch.zeros(20, 1)
    mask[kept] = 1
    x = torch.randn(3, 5, 16)
    expected = torch.nn.functional.linear(x, lin.weight * mask, lin.bias * mask[:, 0])
    out = zr(x)
    assert torch.allclose(out, expected, atol=1e-6)
    removed = [j for j in range(20) if j not in kept]
    assert torch.equal(out[..., removed], torch.zeros_like(out[..., removed]))
    (out * torch.arange(20.0)).sum().backward()
    weighted = x.reshape(-1, 16).sum(0)  # d(sum_j j * out_j)/dW_j = j * sum_tokens x
    assert torch.allclose(zr.weight.grad, torch.tensor(kept, dtype=torch.float)[:, None] * weighted, atol=1e-4)
    assert torch.allclose(zr.bias.grad, torch.tensor(kept, dtype=torch.float) * 15)


@pytest.mark.parametrize("family", FAMILIES)
def test_attribution_ranks_an_inert_neuron_last(family) -> None:
    spec = TinySpec(family, task="seq-cls", layers=1, ffn=12)
    model = tiny_model(spec)
    ffn = adapter_for(model).layer(0).ffn
    with torch.no_grad():
        ffn.down.weight[:, 5] = 0  # neuron 5 can no longer influence anything
    batch = {**tiny_inputs(spec), "labels": torch.tensor([0, 1, 2])}
    scores = module_scores(model, "ffn", [batch], objective=gold_logit_objective)[(0, "neurons")]
    assert scores[5] == 0 and int(scores.argmin()) == 5 and bool((scores[torch.arange(12) != 5] > 0).all())


@pytest.mark.parametrize("family", FAMILIES)
def test_soft_prompt_replays_on_reload(family, tmp_path) -> None:
    spec = TinySpec(family, task="seq-cls")
    model, x = tiny_model(spec), tiny_inputs(spec)
    surgery.convert(model, SoftPromptStrategy(length=3))
    with torch.no_grad():
        prompt_of(model).weight.normal_()
    surgery.convert(model, ZeroRecoveryPruningStrategy(module_set="all", ratio=0.4, importance="random"))
    out = main_output(model, x)
    assert out.shape == (3, 3)
    again = surgery.from_pretrained(surgery.save_pretrained(model, tmp_path / "m"))
    assert torch.allclose(main_output(again, x), out, atol=1e-6)


def toy_data(tokenizer=None, n_train: int = 64, n_eval: int = 32) -> TaskData:
    gen = torch.Generator().manual_seed(0)

    def make(n: int) -> datasets.Dataset:
        ids, labels = [], []
        for _ in range(n):
            y = int(torch.randint(0, 2, (1,), generator=gen))
            body = torch.randint(9 + 45 * y, 54 + 45 * y, (int(torch.randint(3, 8, (1,), generator=gen)),),
                                 generator=gen).tolist()
            ids.append([2, *body, 3])
            labels.append(y)
        return datasets.Dataset.from_dict({"input_ids": ids, "labels": labels})

    return TaskData(train=make(n_train), eval=make(n_eval), label_names=["neg", "pos"], tokenizer=tokenizer,
                    batch_size=16)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_doe_end_to_end_replays_on_reload(family, tmp_path) -> None:
    spec = TinySpec(family, task="seq-cls", layers=2, ffn=16)
    model = tiny_model(spec, num_labels=2)
    strategy = DoEPipeline(epochs=1, condense_epochs=1, batch_size=16, lr=5e-2, head_lr=1e-2, margin=100.0)
    events = []
    # run_doe is surgery.convert plus the results that are not figures (the expert, the tuned prompt).
    result = run_doe(model, toy_data(), strategy.config, progress=events.append)
    metrics = result.report.metrics
    assert metrics["pruning_rate"] == 1.0  # margin 100 accepts every probe: the search must climb to 1
    assert [p["p"] for p in metrics["search"]["probes"]] == [0.5, 0.75, 0.9, 0.95, 1.0]
    assert {e.task for e in events} >= {"prompt-tuning", "attribution", "search"}
    assert [s["strategy"] for s in surgery.inspect(model).model_dump()["steps"]] == ["soft-prompt",
                                                                                     "zero-recovery-prune"]
    widths = [layer.ffn_width for layer in surgery.inspect(model).layers]
    assert widths == [1, 1]  # min_keep=1 per layer
    x = tiny_inputs(spec)
    again = surgery.from_pretrained(surgery.save_pretrained(model, tmp_path / "m"))
    assert torch.allclose(main_output(again, x), main_output(model, x), atol=1e-6)
    assert result.expert is not None and result.expert.prompt.shape[0] == 20
    # The prompt-tuned full model (before the search) can be rebuilt from what the run handed back.
    full = tiny_model(spec, num_labels=2)
    surgery.convert(full, SoftPromptStrategy(length=20))
    result.restore_tuned(full)
    data = toy_data()
    assert evaluate(full, strategy.task_for(full, data), data.loader("eval", batch_size=64)) == pytest.approx(
        metrics["full_accuracy"])
    assert set(adapter_for(full).task_head_parameters()) <= set(result.tuned)  # a BERT pooler included


def _cli_workspace(tmp_path: Path) -> tuple[Path, list[str]]:
    """A tiny saved BERT classifier with a word-level tokenizer, and its vocabulary's words."""
    from transformers import BertTokenizer

    words = [f"w{i}" for i in range(90)]
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]))
    tokenizer = BertTokenizer(str(tmp_path / "vocab.txt"))
    # Its head names the labels of the data below: data labels are read through id2label (issue 29).
    model = tiny_model(TinySpec("bert", task="seq-cls", layers=2, ffn=16), vocab_size=95, num_labels=2,
                       id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
    surgery.save_pretrained(model, tmp_path / "model", tokenizer=tokenizer)
    return tmp_path / "model", words


def _write_task(path: Path, words: list[str], labels: list[str], seed: int, n: int = 80) -> Path:
    """Separable data: label k draws its words from the k-th slice of the vocabulary."""
    gen = torch.Generator().manual_seed(seed)
    width = len(words) // len(labels)
    lines = ["text,label"]
    for _ in range(n):
        y = int(torch.randint(0, len(labels), (1,), generator=gen))
        picks = torch.randint(width * y, width * (y + 1), (5,), generator=gen)
        lines.append(" ".join(words[int(i)] for i in picks) + f",{labels[y]}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_cli_apply_doe_on_generated_data(tmp_path) -> None:
    from typer.testing import CliRunner

    from surgery.cli.app import app

    model_dir, words = _cli_workspace(tmp_path)
    train = _write_task(tmp_path / "train.csv", words, ["neg", "pos"], seed=0)
    result = CliRunner().invoke(app, ["apply", "--strategy", "doe", str(model_dir), "--data", str(train), "--out",
                                      str(tmp_path / "out"), "--set", "epochs=1", "--set", "margin=100",
                                      "--batch-size", "16"])
    assert result.exit_code == 0, result.output
    again = surgery.from_pretrained(tmp_path / "out")
    assert [s.strategy for s in surgery.inspect(again).steps] == ["soft-prompt", "zero-recovery-prune"]


@pytest.mark.slow
def test_cli_experts_build_and_show_two_tasks(tmp_path) -> None:
    from typer.testing import CliRunner

    from surgery.cli.app import app
    from surgery.strategies.doe.unplug import UnplugRuntime

    model_dir, words = _cli_workspace(tmp_path)
    a = _write_task(tmp_path / "a.csv", words, ["neg", "pos"], seed=0)
    b = _write_task(tmp_path / "b.csv", words[::-1], ["plot", "review"], seed=1)
    runner = CliRunner()
    fast = ["--set", "epochs=1", "--set", "margin=100", "--set", "max_probes=2", "--batch-size", "16"]
    result = runner.invoke(app, ["experts", "build", str(model_dir), "--task", f"sent={a}", "--task", f"kind={b}",
                                 "--out", str(tmp_path / "rt"), "--report", str(tmp_path / "r.json"), *fast])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "rt" / "experts").iterdir()) == [
        "kind.json", "kind.safetensors", "sent.json", "sent.safetensors"]
    report = json.loads((tmp_path / "r.json").read_text())
    assert set(report["tasks"]) == {"sent", "kind"} and report["tasks"]["kind"]["labels"] == ["plot", "review"]
    assert all(t["pruning_rate"] > 0 and t["plug_ms"] > 0 for t in report["tasks"].values())
    runtime = UnplugRuntime.load(tmp_path / "rt")
    x = {"input_ids": torch.tensor([[2, 7, 8, 9, 3]])}
    full = main_output(runtime.model, x)
    for name in ("sent", "kind"):
        with runtime.use(name) as model:
            assert model(**x).logits.shape == (1, 2)
    assert torch.equal(main_output(runtime.model, x), full)
    shown = runner.invoke(app, ["experts", "show", str(tmp_path / "rt"), "--json"])
    assert shown.exit_code == 0, shown.output
    rows = json.loads(shown.stdout)
    assert set(rows) == {"sent", "kind"} and rows["kind"]["labels"] == ["plot", "review"]

    three = _write_task(tmp_path / "c.csv", words, ["x", "y", "z"], seed=2)
    for args, message in (
        (["--task", f"sent={a}", "--task", f"three={three}"], "tasks have different numbers of labels"),
        (["--task", f"sent={a}", "--eval-task", f"other={b}"], "--eval-task: ['other'] name no --task"),
        (["--task", f"sent={a}", "--set", "task_name=x"], "task_name: each task is named by its --task"),
    ):
        bad = runner.invoke(app, ["experts", "build", str(model_dir), *args, "--out", str(tmp_path / "bad"), *fast])
        assert bad.exit_code == 2 and bad.stderr.startswith(f"error: {message}"), bad.output
        assert "Traceback" not in bad.output and not (tmp_path / "bad").exists()
