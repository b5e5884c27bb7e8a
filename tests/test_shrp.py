"""The ``shrp`` pipeline end to end on tiny models and generated data (library and CLI)."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import datasets
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

import surgery
from surgery.core.errors import DataError
from surgery.data.task_data import TaskData
from surgery.strategies import ShrpPipeline
from surgery.strategies.shrp.expert_attention import ExpertAttentionLayer
from surgery.testing import TinySpec, main_output, tiny_inputs, tiny_model

WORDS = ["good", "great", "fine", "bad", "awful", "poor", "film", "plot", "the", "a"]


def _task(n: int = 48, seq: int = 8) -> TaskData:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 99, (n, seq), generator=gen)
    ids[:, 0] = 2
    rows = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": [[1] * seq] * n,
                                       "labels": (ids[:, 1] > 50).long().tolist()})
    return TaskData(rows.select(range(n - 16)), rows.select(range(n - 16, n)), ["neg", "pos"], batch_size=16)


@pytest.mark.slow
def test_pipeline_records_steps_trains_prunes_and_reloads(tmp_path: Path) -> None:
    spec = TinySpec("bert", task="seq-cls", layers=3)
    model = tiny_model(spec, num_labels=2)
    events = []
    report = surgery.convert(model, ShrpPipeline(layers=[2, 0], extra_epochs=1, learning_rate=1e-3,
                                                 bench_repeats=1, bench_seq_len=8, bench_batch_size=4),
                             data=_task(), progress=events.append)
    assert [s["strategy"] for s in report.plan["steps"]] == ["expert-attention", "top1-prune"]
    history = report.metrics["history"]
    assert [h["epoch"] for h in history] == [1, 2, 3]
    assert [h["converted"] for h in history] == [1, 2, 2] and [h["stage"] for h in history] == [1, 1, 2]
    assert all({"loss", "acc", "usage", "eval_acc"} <= set(h) for h in history)
    assert any(e.task == "epoch 1/3" and e.info.get("usage") for e in events)
    for key in ("accuracy_input", "accuracy_moe", "accuracy_pruned", "usage", "bench"):
        assert key in report.metrics
    layers = [layer for layer in model.bert.encoder.layer if isinstance(layer, ExpertAttentionLayer)]
    assert len(layers) == 2 and all(layer.bypass is None and not layer.routed for layer in layers)
    assert report.params_after.without_embeddings < report.params_before.without_embeddings
    inputs = tiny_inputs(spec)
    out = surgery.save_pretrained(model, tmp_path / "m")
    assert [s["strategy"] for s in json.loads((out / "surgery.json").read_text())["steps"]] == [
        "expert-attention", "top1-prune"]
    torch.testing.assert_close(main_output(surgery.from_pretrained(out), inputs), main_output(model, inputs))


@pytest.mark.slow
def test_finetune_epochs_run_the_original_model_before_the_first_conversion() -> None:
    model = tiny_model(TinySpec("bert", task="seq-cls", layers=2), num_labels=2)
    strategy = ShrpPipeline(layers=[1], finetune_epochs=1, extra_epochs=1, learning_rate=1e-3, bench=False)
    assert surgery.plan(model, strategy)["epochs"] == 3
    history = surgery.convert(model, strategy, data=_task()).metrics["history"]
    assert [(h["epoch"], h["stage"], h["converted"]) for h in history] == [(1, 0, 0), (2, 1, 1), (3, 2, 1)]
    assert history[0]["usage"] == {}  # no routed layer ran while fine-tuning
    assert history[1]["usage"] and sum(history[1]["usage"]["1"]) == 32  # every training sequence routed


def test_wrong_data_is_a_one_line_error() -> None:
    model = tiny_model(TinySpec("bert", task="seq-cls"), num_labels=2)
    for bad in (None, [tiny_inputs(TinySpec("bert"))]):
        with pytest.raises(DataError, match="needs labelled task data") as err:
            surgery.convert(model, ShrpPipeline(num_layers=1), data=bad)
        assert "\n" not in str(err.value)
    with pytest.raises(DataError, match="num_labels=2"):
        surgery.convert(tiny_model(TinySpec("bert", task="seq-cls")), ShrpPipeline(num_layers=1), data=_task())


def _tiny_model_dir(root: Path) -> Path:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(root / "vocab.txt"))
    # The head names the data's labels (pos/neg): data labels are read through id2label (issue 29).
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=24, max_position_embeddings=32, id2label={0: "neg", 1: "pos"},
                        label2id={"neg": 0, "pos": 1})
    model_dir = root / "tiny"
    BertForSequenceClassification(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir


@pytest.mark.slow
def test_cli_apply_shrp_end_to_end(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from surgery.cli.app import app

    rng = random.Random(0)
    with (tmp_path / "train.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for _ in range(60):
            label = rng.choice(["pos", "neg"])
            words = rng.sample(WORDS[:3] if label == "pos" else WORDS[3:6], 2) + rng.sample(WORDS[6:], 2)
            writer.writerow([" ".join(words), label])
    model_dir = _tiny_model_dir(tmp_path)
    result = CliRunner().invoke(app, [
        "apply", str(model_dir), "--strategy", "shrp", "--data", str(tmp_path / "train.csv"),
        "--out", str(tmp_path / "out"), "--set", "num_layers=1", "--set", "extra_epochs=1",
        "--set", "bench=false", "--set", "learning_rate=0.001", "--max-length", "8"])
    assert result.exit_code == 0, result.output
    reloaded = surgery.from_pretrained(tmp_path / "out")
    assert isinstance(reloaded.bert.encoder.layer[1], ExpertAttentionLayer)
    assert not reloaded.bert.encoder.layer[1].routed


# About 15 s. It used to hang about one run in fifteen at exit (torch's gloo teardown, see
# surgery.core.distributed.leave_process_group); the timeout makes a hang a failure, not a blocked suite.
@pytest.mark.slow
@pytest.mark.multiprocess
def test_ddp_two_process_gloo_smoke() -> None:
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "experiments" / "shrp" / "ddp_smoke_shrp.py"
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(script)],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # gloo on the CPU, GPU or not
    assert result.returncode == 0, result.stderr[-2000:]
    assert "weights identical across ranks: True" in result.stdout
