"""Untrusted model directories and data (issue 35): paths stay inside the model directory, bad values and
unsupported heads are one line, flag errors come before torch, live locks and thin calibration are said early.

Every case here failed before its fix (a file read from outside, a traceback, a misleading message, a
silent run); the command line runs in-process (typer's CliRunner) except where the question is which
modules a process imported before it answered.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import click
import pytest
import torch
import typer
from transformers import BertConfig, BertForSequenceClassification, BertForTokenClassification

from surgery.cli.app import app
from surgery.cli.console import CliState
from surgery.cli.export_command import calibration_texts_batches
from surgery.core.errors import ModelLoadError
from surgery.data.data_diagnosis import QUANTIZER_SUBSET, DataWarning
from surgery.data.task_data import load_task_data
from surgery.embedding.pooling import read_sentence_config
from surgery.measure.bench import bench_models
from surgery.persist.atomic import output_lock
from surgery.persist.tokenizer_files import read_tokenizer
from surgery.persist.untrusted import check_safetensors_dir
from surgery.runtimes.shared.benched_model import BenchedRuntimeModel
from surgery.runtimes.torch.torch_runtime import TorchBf16Runtime
from surgery.testing import TinySpec, tiny_model
from tests.helpers import labelled_rows, run_cli, runner, saved_classifier, st_dir, tiny_tokenizer, write_rows

#: Content of the config.json outside the model directory: it must never be read, so never echoed.
SECRET = "SECRET-OUTSIDE-CONTENT"


def one_error(result: object, *expected: str) -> str:
    """The single ``error:`` line of a CLI result that exited 2, checked to contain every ``expected`` text."""
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith(("note: ", "warning: "))]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (result.exit_code,
                                                                                           result.output)
    assert "Traceback" not in result.output
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


# -- 1. paths named in a model directory stay inside it ----------------------------------------------
@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the model whose config.json is a valid pooling config carrying a secret."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True, "note": SECRET}))
    return folder


@pytest.mark.parametrize("how", ["relative", "absolute", "link"])
def test_the_pooling_path_cannot_lead_out_of_the_model_directory(tmp_path: Path, outside: Path, how: str) -> None:
    model = st_dir(tmp_path / "st", {"pooling_mode_mean_tokens": True}, normalize=True)
    modules = json.loads((model / "modules.json").read_text())
    if how == "link":  # the folder the entry names is a link out
        shutil.rmtree(model / "1_Pooling")
        (model / "1_Pooling").symlink_to(outside, target_is_directory=True)
    else:
        modules[1]["path"] = "../outside" if how == "relative" else str(outside)
        (model / "modules.json").write_text(json.dumps(modules))
    # The outside config is valid (cls pooling): before, it was used silently (or echoed when broken).
    with pytest.raises(ModelLoadError, match="outside the model directory") as caught:
        read_sentence_config(model)
    message = str(caught.value)
    assert SECRET not in message and ("modules.json" in message or "1_Pooling" in message)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(f"w{i} w{i + 1} w{i + 2}" for i in range(40)))
    result = runner.invoke(app, ["apply", str(model), "-s", "head-prune", "--set", "ratio=0.5", "--data", str(texts),
                                 "-o", str(tmp_path / "out")])
    assert SECRET not in one_error(result, "outside the model directory")
    assert not (tmp_path / "out").exists()


def test_no_link_out_of_a_model_directory_is_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"max_seq_length": 8, "note": SECRET}))
    model = tmp_path / "m"
    tiny_model(TinySpec("bert")).save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    (model / "sentence_bert_config.json").symlink_to(secret)
    for args in (["inspect", str(model)], ["export", str(model), "-o", str(tmp_path / "o"), "--seq", "8"]):
        line = one_error(runner.invoke(app, args), "sentence_bert_config.json is a link to", "outside the model")
        assert SECRET not in line
    with pytest.raises(ModelLoadError, match=r"is a link to .*outside the model directory"):
        read_tokenizer(model)
    # A link inside the directory is fine.
    (model / "sentence_bert_config.json").unlink()
    (model / "st.json").write_text(json.dumps({"max_seq_length": 8}))
    (model / "sentence_bert_config.json").symlink_to(model / "st.json")
    assert read_tokenizer(model) is not None


def test_a_hub_cache_snapshot_links_to_its_own_blobs(tmp_path: Path) -> None:
    """The Hugging Face cache layout: every file of snapshots/<rev> is a link to ../../blobs/<hash>."""
    built = st_dir(tmp_path / "built", {"pooling_mode_cls_token": True}, normalize=False)
    repo = tmp_path / "hub" / "models--org--st"
    snapshot, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    blobs.mkdir(parents=True)
    for number, file in enumerate(sorted(p for p in built.rglob("*") if p.is_file())):
        blob = blobs / f"{number:040x}"
        shutil.copyfile(file, blob)
        link = snapshot / file.relative_to(built)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    assert read_sentence_config(snapshot).modes == ("cls",) and read_tokenizer(snapshot) is not None
    (snapshot / "stray.json").symlink_to(tmp_path / "built" / "modules.json")  # not one of its blobs
    with pytest.raises(ModelLoadError, match=r"stray\.json is a link to"):
        read_tokenizer(snapshot)


def test_tokenizer_and_shard_names_cannot_lead_out(tmp_path: Path, outside: Path) -> None:
    model = tmp_path / "m"
    tiny_model(TinySpec("bert")).save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({
        **config, "fast_tokenizer_files": ["../outside/tokenizer.4.0.json"]}))
    with pytest.raises(ModelLoadError, match=r"tokenizer_config\.json names '\.\./outside/tokenizer\.4\.0\.json'"):
        read_tokenizer(model)
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../outside/config.json"}}))
    with pytest.raises(ModelLoadError, match=r"names '\.\./outside/config\.json', which leads outside"):
        check_safetensors_dir(model)


# -- 2. one line for each traceback and weak case ----------------------------------------------------
@pytest.mark.parametrize("value", ["abc", -5, 0, True, 2.5])
def test_a_bad_max_seq_length_is_refused_naming_the_file_and_field(tmp_path: Path, value: object) -> None:
    model = st_dir(tmp_path / "st", {"pooling_mode_mean_tokens": True}, normalize=True)
    (model / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": value}))
    result = runner.invoke(app, ["inspect", str(model)])
    one_error(result, "sentence_bert_config.json: max_seq_length must be a positive integer", repr(value))
    with pytest.raises(ModelLoadError, match="max_seq_length must be a positive integer"):
        read_sentence_config(model)


def _head(root: Path, kind: str) -> Path:
    config = tiny_model(TinySpec("bert")).config.to_dict()
    labels = {"id2label": {0: "neg", 1: "pos"}, "label2id": {"neg": 0, "pos": 1}}
    if kind == "token":
        model = BertForTokenClassification(BertConfig(**{**config, **labels}))
    elif kind == "multi-label":
        model = BertForSequenceClassification(BertConfig(**{**config, **labels,
                                                            "problem_type": "multi_label_classification"}))
    else:
        model = BertForSequenceClassification(BertConfig(**{**config, "num_labels": 1}))
    model.save_pretrained(root / kind)
    tiny_tokenizer().save_pretrained(root / kind)
    return root / kind


@pytest.mark.parametrize(("kind", "said"), [("token", "is a token classifier (BertForTokenClassification"),
                                            ("multi-label", "is a multi-label classifier"),
                                            ("regression", "is a regression head (num_labels 1)")])
def test_heads_that_are_not_single_label_classifiers_are_refused_wherever_data_is_judged(
        tmp_path: Path, kind: str, said: str) -> None:
    model = str(_head(tmp_path, kind))
    data = str(write_rows(tmp_path / "train.csv", labelled_rows(40)))
    out = str(tmp_path / "out")
    for args in (["export", model, "-o", out, "--seq", "8", "--data", data],
                 ["apply", model, "-s", "head-prune", "--set", "ratio=0.5", "--data", data, "-o", out],
                 ["bench", model, "--data", data, "--repeats", "1", "--warmup", "0"],
                 ["compress", model, "--data", data, "--speedup", "2", "-o", out]):
        line = one_error(runner.invoke(app, args), said, "single-label sequence classifier")
        assert "last_hidden_state" not in line and "checkpoint" not in line
    assert not Path(out).exists()


def test_empty_texts_are_named_not_called_numbers(tmp_path: Path) -> None:
    clf = tmp_path / "clf"
    saved_classifier(clf)
    rows = [{"text": "", "label": "pos" if i % 2 else "neg"} for i in range(20)]
    empty_csv = write_rows(tmp_path / "empty.csv", rows)
    empty_jsonl = tmp_path / "empty.jsonl"
    empty_jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    for data in (empty_csv, empty_jsonl):
        result = runner.invoke(app, ["export", str(clf), "-o", str(tmp_path / "o"), "--data", str(data)])
        assert "float64" not in one_error(result, "column 'text' is empty (all 20 texts are empty)")
    some = labelled_rows(40)
    some[3]["text"], some[7]["text"] = "", "  "
    some_jsonl = tmp_path / "some.jsonl"
    some_jsonl.write_text("\n".join(json.dumps(r) for r in some))
    with pytest.warns(DataWarning, match="2 of 40 texts in column 'text' are empty \\(first: row 4\\)"):
        load_task_data(some_jsonl, tiny_tokenizer(), max_length=16)


@pytest.mark.openvino
@pytest.mark.slow
def test_an_openvino_ir_is_said_to_be_one_and_benches_as_it_is(tmp_path: Path) -> None:
    from surgery.measure.flops import count_flops
    from surgery.runtimes.openvino.openvino_runtime import OpenVinoRuntime
    from surgery.runtimes.shared.graph_export import export_target

    model = tiny_model(TinySpec("distilbert", heads=4))  # no pooler: the IR holds every parameter of the model
    source = tmp_path / "source"
    model.save_pretrained(source)
    ir = OpenVinoRuntime().write_artefact(model, tmp_path / "ir", threads=1).directory
    for args in (["inspect", str(ir)], ["apply", str(ir), "-s", "head-prune", "--set", "ratio=0.5", "-o",
                                        str(tmp_path / "o")]):
        line = one_error(runner.invoke(app, args), "is an OpenVINO IR written by `surgery export`", "surgery bench")
        assert "pickle" not in line and "torch.load" not in line
    result = runner.invoke(app, ["bench", str(ir), "--against", str(source), "--batch-size", "2", "--seq-len", "8",
                                 "--repeats", "2", "--warmup", "0", "--json", str(tmp_path / "b.json")])
    assert result.exit_code == 0, result.output
    rows = {row["runtime"]: row for row in json.loads((tmp_path / "b.json").read_text())["models"]}
    torch_row, ir_row = rows["torch"], rows["openvino"]
    # Counted off the graph: the same parameters and FLOPs as the model it was exported from.
    assert ir_row["params"] == torch_row["params"]
    target, _, _ = export_target(model, "auto")
    inputs = {"input_ids": torch.ones(2, 8, dtype=torch.long), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    assert ir_row["flops_per_batch"] == torch_row["flops_per_batch"] == count_flops(target, inputs)
    assert ir_row["throughput"] > 0


def test_bf16_rows_measure_their_memory(tmp_path: Path) -> None:
    model = tiny_model(TinySpec("bert"))
    served = TorchBf16Runtime().prepare(model, tmp_path / "unused")  # in memory: nothing is written
    row = BenchedRuntimeModel(served, model, runtime="torch-bf16", artefact_bytes=0)
    report = bench_models({"fp32": model, "bf16": row}, batch_size=2, seq_len=8, repeats=1, warmup=0)
    fp32, bf16 = report.models
    # Half the bytes per weight (it showed 0.0 MiB: an artefact of size 0, memory "not measured").
    assert bf16.weights_bytes == pytest.approx(fp32.weights_bytes / 2, rel=0.05)
    assert bf16.peak_memory_bytes and bf16.peak_memory_bytes > bf16.weights_bytes
    assert "not measured" not in bf16.memory_method


# -- 3. export --data judges at the length it ships ---------------------------------------------------
@pytest.mark.onnx
@pytest.mark.slow
@pytest.mark.parametrize(("limit", "flags", "expected"),
                         [(12, [], 12), (None, [], 72), (12, ["--max-length", "10"], 10)])
def test_export_data_is_judged_at_the_length_the_tokenizer_ships(tmp_path: Path, limit: int | None,
                                                                 flags: list[str], expected: int) -> None:
    clf = tmp_path / "clf"
    saved_classifier(clf)
    if limit is not None:  # the tokenizer's own limit: what `tokenizer(texts, truncation=True)` cuts at
        tokenizer = tiny_tokenizer()
        tokenizer.model_max_length = limit
        tokenizer.save_pretrained(clf)
    rows = [{**row, "text": " ".join([str(row["text"])] * 6)} for row in labelled_rows(40)]  # 18 to 54 words
    data = write_rows(tmp_path / "long.csv", rows)
    result = runner.invoke(app, ["export", str(clf), "-o", str(tmp_path / "o"), "--seq", "8", "--data", str(data),
                                 *flags])
    assert result.exit_code == 0, result.output
    assert f"--data judged at {expected} tokens, the length the exported tokenizer cuts at" in result.stderr
    shipped = json.loads((tmp_path / "o" / "tokenizer.json").read_text())["truncation"]["max_length"]
    assert shipped == expected  # before: judged at 64 whatever was shipped


# -- 4. flag errors before torch is imported; 5. a live lock up front ----------------------------------
@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("classifier")
    saved_classifier(root / "clf")
    (root / "texts.txt").write_text("w1 w2\n")
    return root


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize(("command", "flags", "message"), [
    ("export", ["--data", "missing.csv"], "--data missing.csv does not exist; pass a .csv"),
    ("export", ["--data", "texts.txt"], "texts.txt: unsupported format .txt; pass a .csv"),
    ("export", ["--data", "."], "is a directory; pass a regular file"),
    ("apply", ["-s", "head-prune", "--data", "missing.csv"], "--data missing.csv does not exist"),
    ("compress", ["--speedup", "2", "--data", "texts.txt", "--eval-data", "missing.csv"],
     "--eval-data missing.csv does not exist"),
    ("bench", ["--data", "missing.csv"], "--data missing.csv does not exist"),
    # each runtime's own flag rules, read off its class
    ("export", ["--runtime", "openvino-int8"], "runtime 'openvino-int8' calibrates int8 activations"),
    ("bench", ["--runtime", "openvino-int8"], "runtime 'openvino-int8' calibrates int8 activations"),
    ("bench", ["--calibration", "texts.txt"], "bench: --calibration feeds the int8 runtimes"),
    ("bench", ["--int8-fp32", "ffn"], "--int8-fp32 (parts kept in fp32) belongs to --runtime onnxruntime-int8"),
    # the serving shape's flags
    ("bench", ["--batch", "0"], "'--batch-size' / '--batch': Input should be greater than or equal to 1"),
    ("bench", ["--lengths", "random"], "--lengths 'random' is not one of fixed, data"),
    ("bench", ["--lengths", "data"], "--lengths data draws its batches from the texts of --data"),
    ("compress", ["--speedup", "2", "--data", "texts.txt", "--batch", "0"],
     "'--batch': Input should be greater than or equal to 1"),
    ("compress", ["--speedup", "2", "--data", "texts.txt", "--lengths", "random"], "--lengths 'random' is not one"),
    ("compress", ["--speedup", "2", "--data", "texts.txt", "--lengths", "data", "--seq-len", "8"],
     "--seq-len fixes every sequence's length"),
])
def test_a_bad_data_file_or_runtime_flag_is_refused_before_torch(classifier: Path, command: str,
                                                                   flags: list[str], message: str) -> None:
    out = [] if command == "bench" else ["-o", str(classifier / "out")]
    code, err, imported = run_cli([command, str(classifier / "clf"), *out, *flags], classifier)
    assert code == 2 and err.strip().startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert message in err, err
    assert imported == [], f"imported {imported} before refusing {flags}"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_live_lock_on_out_is_found_before_any_work(classifier: Path) -> None:
    out = classifier / "locked"
    with output_lock(out):  # this test's own process is the live writer
        code, err, imported = run_cli(["apply", str(classifier / "clf"), "-s", "head-prune", "--set", "ratio=0.5",
                                         "-o", str(out)], classifier)
    assert code == 2 and f"is being written by process {os.getpid()}" in err, err
    assert imported == [] and not out.exists()


# -- 6. thin calibration is said ---------------------------------------------------------------------
def test_too_few_calibration_texts_warn_with_their_count(tmp_path: Path) -> None:
    ctx = typer.Context(click.Command("export"))
    ctx.obj = CliState()
    one = tmp_path / "one.txt"
    one.write_text("w1\n")
    with pytest.warns(DataWarning, match=r"--calibration gave 1 text \(3 tokens in all\)") as caught:
        calibration_texts_batches(ctx, str(one), tiny_tokenizer(), max_texts=512, max_length=16, text_column="text")
    assert f"NNCF calibrates on {QUANTIZER_SUBSET}" in str(caught[0].message)
    many = tmp_path / "many.txt"
    many.write_text("\n".join(f"w{i % 90} w{(i * 7) % 90} w{i // 90}" for i in range(QUANTIZER_SUBSET)))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        calibration_texts_batches(ctx, str(many), tiny_tokenizer(), max_texts=512, max_length=16, text_column="text")


@pytest.mark.openvino
def test_the_calibration_threshold_is_nncfs_default_subset() -> None:
    import inspect

    import nncf

    assert inspect.signature(nncf.quantize).parameters["subset_size"].default == QUANTIZER_SUBSET
