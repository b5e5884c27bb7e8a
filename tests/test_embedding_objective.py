"""The embedding objective on tiny models of every family: importance, recovery, SHRP, CLI, interop."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import datasets
import pytest
import torch
from typer.testing import CliRunner

import surgery
from surgery.cli.app import app
from surgery.core.errors import ConfigError
from surgery.data.task_data import PaddingCollator, TaskData
from surgery.embedding import SentenceConfig, embed_texts, load_text_data
from surgery.embedding.evaluate import embed_batch, mean_cosine
from surgery.embedding.objective import (
    EMBEDDING_HIDDEN_WEIGHT,
    TEACHER_EMBEDDING,
    EmbeddingDistillConfig,
    distillation_rows,
    embedding_loss,
    embedding_trainer,
    neighbour_loss,
    recover_embeddings,
)
from surgery.embedding.pooling import SURGERY_FILE, read_sentence_config
from surgery.strategies.pruning.head_prune import HeadPruningStrategy
from surgery.strategies.pruning.layer_drop import LayerDropStrategy
from surgery.strategies.shrp import ShrpPipeline
from surgery.strategies.shrp.embedding_shrp import EMBEDDING_EXPANDER_GAIN
from surgery.strategies.shrp.expert_attention import ExpertAttentionStrategy
from surgery.testing import TinySpec, tiny_model
from surgery.training import RecoveryConfig, recover, scratch_dir, training_arguments
from tests.helpers import EMBEDDING_TEXTS, one_family_fast, st_dir, tiny_tokenizer

runner = CliRunner(env={"COLUMNS": "200"})


def text_data(batch_size: int = 8):
    data = load_text_data(EMBEDDING_TEXTS, tiny_tokenizer(), batch_size=batch_size)
    data.sentence_config = SentenceConfig(normalize=True)
    return data


def test_embedding_loss_is_mse_plus_one_minus_cosine() -> None:
    s, t = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 2.0]])
    expected = ((1.0 + 4.0) / 2) + 1.0  # MSE over the two coordinates, plus 1 - cos(90°)
    assert float(embedding_loss(s, t)) == pytest.approx(expected)
    assert float(embedding_loss(s, t, mse_weight=0.5, cosine_weight=0.0)) == pytest.approx(1.25)


@pytest.mark.slow
def test_embedding_recovery_matches_hidden_states_unless_told_not_to() -> None:
    data = text_data()
    teacher = tiny_model(TinySpec("bert", layers=2))
    student = copy.deepcopy(teacher)
    surgery.convert(student, HeadPruningStrategy(ratio=0.5))
    default = recover_embeddings(copy.deepcopy(student), teacher, data, RecoveryConfig(epochs=1, batch_size=8))
    assert default.hidden_weight == EMBEDDING_HIDDEN_WEIGHT == 1.0 and default.layer_map == {0: 0, 1: 1}
    off = recover_embeddings(copy.deepcopy(student), teacher, data,
                             RecoveryConfig(epochs=1, batch_size=8, hidden_weight=0.0))
    assert off.hidden_weight == 0.0 and off.layer_map is None
    # The two runs differ only by the hidden-state term, and it adds to the training loss.
    assert default.history[-1]["loss"] > default.history[-1]["kd"]
    assert off.history[-1]["loss"] == pytest.approx(off.history[-1]["kd"])
    # After a layer-drop (measured level there) the default is off; set explicitly, it maps the layers.
    dropped = copy.deepcopy(teacher)
    surgery.convert(dropped, LayerDropStrategy(count=1))
    assert recover_embeddings(copy.deepcopy(dropped), teacher, data,
                              RecoveryConfig(epochs=1, batch_size=8)).hidden_weight == 0.0
    assert recover_embeddings(dropped, teacher, data, RecoveryConfig(epochs=1, batch_size=8, hidden_weight=1.0)
                              ).layer_map is not None


def test_neighbour_loss_against_a_hand_computation() -> None:
    # Three texts; the student swaps which of texts 1 and 2 is text 0's nearer neighbour.
    teacher = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    student = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.8, 0.6]])
    tau = 0.5
    cos_t, cos_s = teacher @ teacher.T, student @ student.T  # rows are unit vectors already
    expected = 0.0
    for i in range(3):
        others = [j for j in range(3) if j != i]
        p = torch.softmax(cos_t[i, others] / tau, dim=0)
        q = torch.softmax(cos_s[i, others] / tau, dim=0)
        expected += float((p * (p / q).log()).sum()) / 3
    assert float(neighbour_loss(student, teacher, temperature=tau)) == pytest.approx(expected, rel=1e-5)
    assert expected > 0
    # Cosine-based, so the scale of either side does not matter; a batch of one has no neighbours.
    assert float(neighbour_loss(3 * teacher, teacher, temperature=tau)) == pytest.approx(0.0, abs=1e-6)
    assert float(neighbour_loss(student[:1], teacher[:1])) == 0.0


@pytest.mark.slow
def test_the_neighbour_term_trains_and_is_refused_for_a_task_model() -> None:
    data = text_data()
    teacher = tiny_model(TinySpec("bert", layers=2))
    student = tiny_model(TinySpec("bert", layers=2, seed=1))
    config = data.sentence_config
    target = embed_texts(teacher, data.tokenizer, EMBEDDING_TEXTS, config)

    def ranking_distance() -> float:
        return float(neighbour_loss(embed_texts(student, data.tokenizer, EMBEDDING_TEXTS, config), target))

    before = ranking_distance()
    # The neighbour term alone (no MSE, no cosine) must move the student's neighbour ranking toward the teacher's.
    with scratch_dir() as tmp:
        trainer = embedding_trainer(student, teacher, data, training_arguments(tmp, epochs=3, batch_size=8,
                                                                               learning_rate=1e-3),
                                    embedding=EmbeddingDistillConfig(mse_weight=0.0, cosine_weight=0.0,
                                                                     similarity_weight=1.0))
        trainer.train()
    assert ranking_distance() < 0.8 * before
    result = recover_embeddings(student, teacher, data, RecoveryConfig(epochs=1, batch_size=8, similarity_weight=0.5))
    assert result.steps == 3  # the 24 training texts (the rest are held out) in batches of 8
    task_model = tiny_model(TinySpec("bert", task="seq-cls"))
    rows = datasets.Dataset.from_dict({"input_ids": [[2, 5, 3], [2, 6, 7, 3]], "labels": [0, 1]})
    with pytest.raises(surgery.ConfigError, match="similarity_weight"):
        recover(task_model, copy.deepcopy(task_model), TaskData(rows, rows, ["a", "b"]),
                RecoveryConfig(epochs=1, similarity_weight=1.0))


@pytest.mark.parametrize("family", one_family_fast())
def test_pruned_student_recovers_its_teachers_embeddings(family: str) -> None:
    data = text_data()
    teacher = tiny_model(TinySpec(family, layers=2))
    # A student far from its teacher (another seed), so the distance is well above Adam's step noise;
    # label-free importance (embedding sensitivity) picks its heads, then recovery on unlabelled text.
    student = tiny_model(TinySpec(family, layers=2, seed=1))
    surgery.convert(student, HeadPruningStrategy(ratio=0.5, importance="gradient", max_batches=2), data=data)
    config = data.sentence_config
    target = embed_texts(teacher, data.tokenizer, EMBEDDING_TEXTS, config)

    def distance() -> float:
        return float(embedding_loss(embed_texts(student, data.tokenizer, EMBEDDING_TEXTS, config), target))

    before = distance()
    result = recover_embeddings(student, teacher, data, RecoveryConfig(epochs=3, learning_rate=1e-3, batch_size=8))
    assert result.steps == 3 * 3 and result.history[-1]["loss"] is not None
    assert distance() < 0.8 * before, family


def test_cached_teacher_embeddings_train_the_student_exactly_as_the_live_teacher() -> None:
    # After a layer-drop nothing but the teacher's sentence embeddings is read: computed once per run, not per step.
    data = text_data()
    teacher = tiny_model(TinySpec("bert", layers=3)).eval()
    student = copy.deepcopy(teacher)
    surgery.convert(student, LayerDropStrategy(count=1))
    config = RecoveryConfig(epochs=1, batch_size=8, learning_rate=1e-3)
    rows, collator = distillation_rows(teacher, data, config, hidden_weight=0.0)
    live_rows, _ = distillation_rows(teacher, data, config.model_copy(update={"cache_teacher": False}),
                                                 hidden_weight=0.0)
    assert TEACHER_EMBEDDING in rows.column_names and TEACHER_EMBEDDING not in live_rows.column_names
    batch = collator([rows[i] for i in range(len(rows))])
    target = embed_texts(teacher, data.tokenizer, data.train_texts, data.sentence_config)
    torch.testing.assert_close(batch[TEACHER_EMBEDDING], target, atol=1e-5, rtol=1e-5)
    # The same run, cached or live: the same steps and the same weights at the end; the teacher ran once per
    # batch of the caching pass against once per step.
    calls: list[int] = []
    teacher.register_forward_hook(lambda *_: calls.append(1))
    trained, steps, teacher_calls = {}, {}, {}
    for cache in (True, False):
        torch.manual_seed(0)
        trained[cache] = copy.deepcopy(student)
        calls.clear()
        steps[cache] = recover_embeddings(trained[cache], teacher, data,
                                          config.model_copy(update={"cache_teacher": cache})).steps
        teacher_calls[cache] = len(calls)
    assert steps[True] == steps[False] == teacher_calls[False] > 1
    assert teacher_calls[True] == -(-len(data.train) // 32)
    for a, b in zip(trained[True].parameters(), trained[False].parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    # A student that kept every layer reads the teacher's layers too: nothing is cached for it.
    kept, _ = distillation_rows(teacher, data, config, hidden_weight=1.0)
    assert TEACHER_EMBEDDING not in kept.column_names


def test_masked_copies_of_the_texts_are_distilled_and_refused_without_a_mask_token() -> None:
    from transformers import BertTokenizer

    data = text_data()
    teacher = tiny_model(TinySpec("bert", layers=2)).eval()
    config = RecoveryConfig(epochs=1, batch_size=8, masked_copies=2, mask_rate=0.5)
    rows, _ = distillation_rows(teacher, data, config, hidden_weight=0.0)
    n = len(data.train)
    mask = data.tokenizer.mask_token_id
    assert len(rows) == 3 * n and all(mask not in r["input_ids"] for r in rows.select(range(n)))
    assert sum(r["input_ids"].count(mask) for r in rows.select(range(n, 3 * n))) > n  # about half the words masked
    # Each copy's target is the teacher's embedding of the masked text itself.
    copies = rows.select(range(n, 3 * n))
    live = PaddingCollator(data.tokenizer)([{k: v for k, v in r.items() if k != TEACHER_EMBEDDING} for r in copies])
    expected, _ = embed_batch(teacher, live, data.sentence_config)
    torch.testing.assert_close(torch.tensor(copies[TEACHER_EMBEDDING]), expected, atol=1e-5, rtol=1e-5)
    result = recover_embeddings(copy.deepcopy(teacher), teacher, data, config)
    assert result.steps == -(-3 * n // 8)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *sorted({w for t in EMBEDDING_TEXTS for w in t.split()})]
    plain = load_text_data(EMBEDDING_TEXTS, BertTokenizer(vocab={t: i for i, t in enumerate(words)}, mask_token=None))
    with pytest.raises(ConfigError, match="masked_copies"):
        distillation_rows(teacher, plain, config, hidden_weight=0.0)


@pytest.mark.slow
def test_layer_drop_recovery_matches_hidden_states_through_the_drop() -> None:
    data = text_data()
    teacher = tiny_model(TinySpec("bert", layers=4))
    student = copy.deepcopy(teacher)
    report = surgery.convert(student, LayerDropStrategy(count=2), data=data,
                             recovery=RecoveryConfig(epochs=1, hidden_weight=1.0, batch_size=8))
    recovery = report.checks[0].recovery
    assert recovery is not None and recovery["layer_map"] == {"0": 0, "1": 2}  # kept layers 0, 2 of the teacher
    assert EmbeddingDistillConfig(hidden_weight=1.0).mse_weight == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "mpnet"])
def test_shrp_distils_embeddings_and_reloads(tmp_path: Path, family: str) -> None:
    data = text_data(batch_size=16)
    model = tiny_model(TinySpec(family, layers=2))
    report = surgery.convert(model, ShrpPipeline(num_layers=1, extra_epochs=1, bench=False), data=data)
    assert report.metrics["objective"] == "embedding" and report.metrics["router_input"] == "mean"
    assert [s["strategy"] for s in report.plan["steps"]] == ["expert-attention", "top1-prune"]
    assert 0.0 <= report.metrics["embedding_pruned"]["recall_at_k"] <= 1.0
    cls = ShrpPipeline(num_layers=1, extra_epochs=0, bench=False, router_input="cls")
    assert surgery.convert(tiny_model(TinySpec(family, layers=2)), cls, data=data).metrics["router_input"] == "cls"
    out = surgery.save_pretrained(model, tmp_path / "m")
    expected = embed_texts(model, data.tokenizer, EMBEDDING_TEXTS, data.sentence_config)
    torch.testing.assert_close(embed_texts(surgery.from_pretrained(out), data.tokenizer, EMBEDDING_TEXTS,
                                           data.sentence_config), expected)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "mpnet", "deberta-v2"])
def test_embedding_shrp_starts_close_to_its_teacher(family: str) -> None:
    # Regression: the Expander's LayerNorm started at the paper's γ=1, so every converted layer added a
    # unit-variance update that swamped its input; real MiniLM-L6 with 3 converted layers started at
    # mean cosine 0.04 to its teacher and stayed near 0.08 after training. Here γ=1 gives 0.58-0.73.
    data = text_data(batch_size=16)
    teacher = tiny_model(TinySpec(family, layers=2))
    model = copy.deepcopy(teacher)
    report = surgery.convert(model, ShrpPipeline(num_layers=1, extra_epochs=0, bench=False), data=data)
    assert report.metrics["expander_gain"] == EMBEDDING_EXPANDER_GAIN
    assert report.metrics["embedding_converted"]["mean_cosine"] >= 0.9, report.metrics["embedding_converted"]
    config = data.sentence_config
    target = embed_texts(teacher, data.tokenizer, EMBEDDING_TEXTS, config)

    def converted_cosine(gain: float) -> float:
        student = copy.deepcopy(teacher)
        surgery.convert(student, ExpertAttentionStrategy(layers=[1], router_input="mean", expander_gain=gain))
        return mean_cosine(embed_texts(student, data.tokenizer, EMBEDDING_TEXTS, config), target)

    assert converted_cosine(EMBEDDING_EXPANDER_GAIN) >= 0.9 > converted_cosine(1.0) + 0.1
    explicit = ShrpPipeline(num_layers=1, extra_epochs=0, bench=False, expander_gain=1.0)
    assert surgery.convert(copy.deepcopy(teacher), explicit, data=data).metrics["expander_gain"] == 1.0


@pytest.mark.slow
def test_dropout_off_means_every_dropout_off() -> None:
    # Regression: "dropout off" put nn.Dropout modules in eval mode, but attention reads its dropout
    # probability from its own training flag (HF attention, Expert Attention), so attention dropout
    # stayed on and a student identical to its teacher saw a nonzero loss.
    data = text_data()
    teacher = tiny_model(TinySpec("bert", layers=2), attention_probs_dropout_prob=0.5)
    student = copy.deepcopy(teacher)
    surgery.convert(student, ExpertAttentionStrategy(layers=[1]))
    surgery.convert(teacher, ExpertAttentionStrategy(layers=[1]))
    student.load_state_dict(teacher.state_dict())
    for p in student.parameters():
        p.requires_grad_(True)
    with scratch_dir() as tmp:
        trainer = embedding_trainer(student, teacher, data, training_arguments(tmp, epochs=1, batch_size=8,
                                                                               learning_rate=1e-9))
        trainer.train()
    assert trainer.stats.steps > 0 and trainer.stats.loss_sum / trainer.stats.steps < 1e-9, trainer.stats.loss_sum
    assert [m.p for m in student.modules() if isinstance(m, torch.nn.Dropout)].count(0.5) > 0  # restored


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None, reason="needs sentence-transformers")
def test_cli_detects_the_embedding_objective_and_saves_an_encodable_model(tmp_path: Path) -> None:
    from surgery.runtimes.sentence_interop import to_sentence_transformer

    source = st_dir(tmp_path / "st", {"pooling_mode_mean_tokens": True}, True)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(EMBEDDING_TEXTS) + "\n")
    out = tmp_path / "out"
    result = runner.invoke(app, ["apply", str(source), "-s", "shrp", "--set", "num_layers=1", "--set",
                                 "extra_epochs=0", "--set", "bench=false", "--data", str(corpus), "-o", str(out),
                                 "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    assert "objective: embedding" in result.stderr and "unlabelled texts" in result.stderr
    metrics = json.loads((tmp_path / "r.json").read_text())["metrics"]
    assert set(metrics["embedding"]) >= {"mean_cosine", "recall_at_k"}
    assert (out / SURGERY_FILE).is_file() and read_sentence_config(out).normalize
    model = surgery.from_pretrained(out)
    expected = embed_texts(model, tiny_tokenizer(), EMBEDDING_TEXTS[:5], read_sentence_config(out))
    encoded = torch.tensor(to_sentence_transformer(out).encode(EMBEDDING_TEXTS[:5]))
    torch.testing.assert_close(encoded, expected, atol=1e-5, rtol=1e-5)


def test_cli_objective_override_and_task_default(tmp_path: Path) -> None:
    source = st_dir(tmp_path / "st", {"pooling_mode_mean_tokens": True}, True)
    rows = tmp_path / "rows.csv"
    rows.write_text("text,label\n" + "".join(f"{t},{i % 2}\n" for i, t in enumerate(EMBEDDING_TEXTS)))
    args = ["apply", str(source), "-s", "head-prune", "--set", "ratio=0.25", "--data", str(rows), "--dry-run"]
    task = runner.invoke(app, [*args, "--set", "objective=task"])
    assert task.exit_code == 0 and "objective: task (--set objective=task)" in task.stderr
    auto = runner.invoke(app, args)
    assert auto.exit_code == 0 and "objective: embedding" in auto.stderr, auto.output
    bad = runner.invoke(app, [*args, "--set", "objective=both"])
    assert bad.exit_code == 2 and "objective='both'" in bad.stderr
    plain = tmp_path / "plain"
    tiny_model(TinySpec("bert")).save_pretrained(plain)
    tiny_tokenizer().save_pretrained(plain)
    result = runner.invoke(app, ["apply", str(plain), "-s", "head-prune", "--set", "ratio=0.25", "--data", str(rows),
                                 "--dry-run"])
    assert result.exit_code == 0 and "objective: task (not a sentence-transformers directory" in result.stderr


def test_auto_detection_keeps_the_task_objective_for_classifier_only_strategies(tmp_path: Path) -> None:
    from transformers import AutoConfig

    from surgery.cli.embedding_apply import choose_objective
    from surgery.strategies.doe import DoEPipeline

    source = st_dir(tmp_path / "st", {"pooling_mode_mean_tokens": True}, True)
    config = AutoConfig.from_pretrained(source)
    assert choose_objective(source, config, None, ShrpPipeline).name == "embedding"
    doe = choose_objective(source, config, None, DoEPipeline)
    assert doe.name == "task" and "doe trains a classifier only" in doe.reason
    assert choose_objective(source, config, "embedding", DoEPipeline).name == "embedding"  # asked for explicitly


@pytest.mark.slow
def test_cli_head_and_ffn_pruning_with_recovery_on_plain_text(tmp_path: Path) -> None:
    """The README's embedding recipe: two pruning commands, each distilling the embeddings back on a .txt file."""
    source = st_dir(tmp_path / "st", {"pooling_mode_mean_tokens": True}, True)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(EMBEDDING_TEXTS) + "\n")
    heads, both = tmp_path / "heads", tmp_path / "both"
    for strategy, src, out, report in (("head-prune", source, heads, "h.json"), ("ffn-prune", heads, both, "f.json")):
        result = runner.invoke(app, ["apply", str(src), "-s", strategy, "--set", "ratio=0.5", "--set",
                                     "importance=gradient", "--data", str(corpus), "--recover-epochs", "1",
                                     "-o", str(out), "--report", str(tmp_path / report)])
        assert result.exit_code == 0, result.output
        assert "objective: embedding" in result.stderr
        checks = json.loads((tmp_path / report).read_text())["checks"]
        assert checks and checks[0]["recovery"]["epochs"] == 1, checks
    model = surgery.from_pretrained(both)
    anatomy = surgery.inspect(model)
    original = surgery.inspect(surgery.from_pretrained(source))
    assert sum(la.heads for la in anatomy.layers) == sum(la.heads for la in original.layers) // 2
    assert sum(la.ffn_width for la in anatomy.layers) == sum(la.ffn_width for la in original.layers) // 2
    assert read_sentence_config(both).normalize  # the pooling files travel with every save


@pytest.mark.slow
@pytest.mark.onnx
@pytest.mark.parametrize("family", ["bert", "deberta-v2"])
def test_export_sentence_transformers_directory_encodes_like_the_surgered_model(tmp_path: Path, family: str) -> None:
    import numpy as np
    import onnxruntime as ort

    source = st_dir(tmp_path / "st", {"pooling_mode_mean_tokens": True}, normalize=True,
                    model=tiny_model(TinySpec(family)))
    pruned = tmp_path / "pruned"
    result = runner.invoke(app, ["apply", str(source), "--strategy", "head-prune", "--set", "ratio=0.5",
                                 "--out", str(pruned)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "export"
    result = runner.invoke(app, ["export", str(pruned), "--out", str(out), "--format", "sentence-transformers"])
    assert result.exit_code == 0, result.output
    assert "backend='onnx'" in result.output and "sentence-transformers[onnx]" in result.output
    # Stock module names only: nothing in the directory points back to surgery.
    modules = json.loads((out / "modules.json").read_text())
    assert [m["type"] for m in modules] == [f"sentence_transformers.models.{k}" for k in
                                            ("Transformer", "Pooling", "Normalize")]
    assert (out / "onnx" / "model.onnx").is_file() and (out / "tokenizer.json").is_file()
    assert not (out / "surgery.json").exists() and not (out / SURGERY_FILE).exists()
    config = read_sentence_config(out)
    assert config is not None and config.describe() == "mean pooling, L2-normalised" and config.max_seq_length == 16
    # The graph plus the written pooling give the surgered model's embeddings.
    model = surgery.from_pretrained(pruned)
    tok = tiny_tokenizer()
    expected = embed_texts(model, tok, EMBEDDING_TEXTS[:6], config)
    batch = tok(EMBEDDING_TEXTS[:6], padding=True, return_tensors="np")
    session = ort.InferenceSession(str(out / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {i.name: batch[i.name].astype(np.int64) for i in session.get_inputs()}
    (hidden,) = session.run(["last_hidden_state"], feeds)
    from surgery.embedding.pooling import pool
    got = pool(torch.from_numpy(hidden), torch.from_numpy(batch["attention_mask"]), config)
    assert torch.allclose(got, expected, atol=1e-4)
    # Without the ONNX backend, stock sentence-transformers finds no torch weights and fails loudly.
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer
    with pytest.raises((OSError, ValueError, EnvironmentError)):
        SentenceTransformer(str(out), device="cpu")


def test_export_sentence_transformers_refuses_a_plain_model(tmp_path: Path) -> None:
    saved = surgery.save_pretrained(tiny_model(TinySpec("bert")), tmp_path / "plain")
    result = runner.invoke(app, ["export", str(saved), "--out", str(tmp_path / "x"), "--format",
                                 "sentence-transformers"])
    assert result.exit_code == 2 and "not a sentence-embedding model" in result.output
    assert not (tmp_path / "x").exists()
    result = runner.invoke(app, ["export", str(saved), "--out", str(tmp_path / "x"), "--format", "tflite"])
    assert result.exit_code == 2 and "--format 'tflite'" in result.output


def test_a_time_limit_ends_embedding_recovery_at_the_first_step_past_it() -> None:
    data = text_data()
    teacher = tiny_model(TinySpec("bert", layers=2))
    student = copy.deepcopy(teacher)
    surgery.convert(student, HeadPruningStrategy(ratio=0.5))
    limited = recover_embeddings(copy.deepcopy(student), teacher, data,
                                 RecoveryConfig(epochs=3, batch_size=8, max_seconds=0.0))
    assert limited.steps == 1 and limited.time_limit_reached
    full = recover_embeddings(student, teacher, data, RecoveryConfig(epochs=3, batch_size=8))
    assert full.steps > 1 and not full.time_limit_reached
