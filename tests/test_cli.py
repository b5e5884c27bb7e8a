"""The command line: strategies, inspect, apply (settings, data, dry run, reload), bench, and bad input.

Every bad input must give exactly one line ``error: ...`` on stderr and exit status 2, with no
traceback; ``--debug`` adds the traceback. Models are tiny random encoders saved to temporary
directories with a tiny word-level tokenizer; data is a generated CSV.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2Model

import surgery
from surgery.cli.app import app
from surgery.cli.render import bench_view
from surgery.testing import VOCAB, TinySpec, tiny_model
from tests.helpers import labelled_rows, runner, tiny_tokenizer, write_rows


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model directories and data files shared by the tests (none of them is ever written to)."""
    root = tmp_path_factory.mktemp("cli")
    paths = {}
    for name, task in (("bare", "base"), ("classifier", "seq-cls")):
        # Plain Hugging Face directories, as a user would have them (config.architectures set).
        model = tiny_model(TinySpec("bert", task=task))
        model.save_pretrained(root / name)
        tiny_tokenizer().save_pretrained(root / name)
        paths[name] = root / name
    tiny_model(TinySpec("bert")).save_pretrained(root / "no_tokenizer")
    paths["no_tokenizer"] = root / "no_tokenizer"
    GPT2Model(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=VOCAB)).save_pretrained(root / "gpt2")
    paths["gpt2"] = root / "gpt2"
    (root / "damaged").mkdir()
    (root / "damaged" / "config.json").write_text("{ not json")
    paths["damaged"] = root / "damaged"
    paths["data"] = write_rows(root / "train.csv", labelled_rows(48))
    paths["renamed"] = write_rows(root / "renamed.csv", labelled_rows(48, text="sentence", label="y"))
    paths["renamed_eval"] = write_rows(root / "renamed_dev.csv", labelled_rows(12, text="sentence", label="y", seed=1))
    paths["yaml_bad"] = root / "bad.yaml"
    paths["yaml_bad"].write_text("ratio: [0.5\n")
    paths["yaml_list"] = root / "list.yaml"
    paths["yaml_list"].write_text("- 1\n- 2\n")
    paths["data_fifo"] = root / "fifo.csv"
    os.mkfifo(paths["data_fifo"])  # opened, it would block until a writer came
    paths["nonempty"] = root / "nonempty"
    paths["nonempty"].mkdir()
    (paths["nonempty"] / "keep.txt").write_text("mine")
    return paths


def ok(args: list[str]) -> object:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result


# -- happy paths -------------------------------------------------------------------------
def test_help_and_strategies() -> None:
    assert "apply" in ok([]).stdout
    table = ok(["strategies"]).stdout
    assert "head-prune" in table and "ffn-prune" in table and "encoder-surgery" in table
    rows = json.loads(ok(["strategies", "--json"]).stdout)
    by_name = {row["name"]: row for row in rows}
    assert by_name["head-prune"]["package"] == "encoder-surgery"
    assert by_name["head-prune"]["help"].startswith("Remove attention heads")


def test_inspect_table_and_json(ws: dict[str, Path]) -> None:
    table = ok(["inspect", str(ws["bare"])]).stdout
    assert "BertModel (bert), hidden 32, 2 layers" in table
    assert "without embeddings" in table and "No recorded surgery steps" in table
    anatomy = json.loads(ok(["inspect", str(ws["bare"]), "--json"]).stdout)
    assert [(la["heads"], la["head_dim"], la["ffn_width"]) for la in anatomy["layers"]] == [(4, 8, 37)] * 2
    assert anatomy["params"]["total"] > anatomy["params"]["without_embeddings"] > 0


def test_apply_with_set_saves_a_model_that_reloads(ws: dict[str, Path], tmp_path: Path) -> None:
    out, report_file = tmp_path / "pruned", tmp_path / "report.json"
    result = ok(["apply", str(ws["bare"]), "--strategy", "head-prune", "--set", "heads={0: [1], 1: [0, 3]}",
                 "--out", str(out), "--report", str(report_file)])
    assert "Changes per layer" in result.stdout and f"saved to {out}" in result.stdout
    model = surgery.from_pretrained(out)
    assert [layer.heads for layer in surgery.inspect(model).layers] == [3, 2]
    assert (out / "tokenizer.json").exists()  # the output directory is self-contained
    report = json.loads(report_file.read_text())
    assert report["plan"] == {"heads": {"0": [1], "1": [0, 3]}}
    assert report["params_after"]["total"] < report["params_before"]["total"]
    # inspect shows the recorded step; a second apply on the saved model stacks a step.
    assert "head-prune" in ok(["inspect", str(out)]).stdout
    again = tmp_path / "again"
    ok(["apply", str(out), "-s", "ffn-prune", "--set", "neurons={0: [0, 1]}", "-o", str(again)])
    assert [s.strategy for s in surgery.inspect(surgery.from_pretrained(again)).steps] == ["head-prune", "ffn-prune"]


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_apply_with_config_file_and_set_override(ws: dict[str, Path], tmp_path: Path, suffix: str) -> None:
    settings = {"ratio": 0.5, "importance": "random", "scope": "layer"}
    config = tmp_path / f"ffn{suffix}"
    config.write_text(json.dumps(settings) if suffix == ".json" else "".join(f"{k}: {v}\n" for k, v in
                                                                               settings.items()))
    out = tmp_path / "out"
    ok(["apply", str(ws["bare"]), "-s", "ffn-prune", "--config", str(config), "--set", "ratio=0.25", "-o", str(out)])
    # --set wins over the file: 0.25 of 37 neurons (rounded half up) is 9 per layer.
    assert [layer.ffn_width for layer in surgery.inspect(surgery.from_pretrained(out)).layers] == [28, 28]
    assert json.loads((out / "surgery.json").read_text())["steps"][0]["config"]["ratio"] == 0.25


def test_dry_run_prints_the_plan_and_saves_nothing(ws: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "never"
    result = ok(["apply", str(ws["bare"]), "-s", "head-prune", "--set", "ratio=0.5", "--set", "scope=layer",
                 "--out", str(out), "--dry-run"])
    step = json.loads(result.stdout)
    assert step["strategy"] == "head-prune" and step["config"]["ratio"] == 0.5
    assert {k: len(v) for k, v in step["plan"]["heads"].items()} == {"0": 2, "1": 2}
    assert not out.exists()
    # --out may be left out in a dry run
    assert json.loads(ok(["apply", str(ws["bare"]), "-s", "head-prune", "--set", "ratio=0.5",
                          "--dry-run"]).stdout)["plan"] == step["plan"]


def test_apply_with_data_turns_a_bare_encoder_into_a_classifier(ws: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "cls"
    result = ok(["apply", str(ws["bare"]), "-s", "head-prune", "--set", "ratio=0.25", "--set", "max_batches=2",
                 "--data", str(ws["renamed"]), "--text-column", "sentence", "--label-column", "y",
                 "--eval-data", str(ws["renamed_eval"]),
                 "--batch-size", "8", "--max-length", "16", "--max-train", "32", "-o", str(out)])
    assert "new randomly initialised head for 2 labels (neg, pos)" in " ".join(result.stderr.split())
    assert "importance_kind" in result.stdout and "gradient" in result.stdout  # data was used for planning
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "neg", "1": "pos"}
    model = surgery.from_pretrained(out)
    assert type(model).__name__ == "BertForSequenceClassification"
    assert sum(layer.heads for layer in surgery.inspect(model).layers) == 6


def test_apply_with_data_keeps_a_matching_classifier(ws: dict[str, Path], tmp_path: Path) -> None:
    # Labels as the head reads them: its ids (the tiny classifier's id2label is LABEL_0..LABEL_2).
    three = write_rows(tmp_path / "three.csv", [{"text": f"w{i} w{i + 1}", "label": i % 3} for i in range(30)])
    result = ok(["apply", str(ws["classifier"]), "-s", "ffn-prune", "--set", "ratio=0.5", "--set",
                 "importance=activation", "--set", "max_batches=1", "--data", str(three), "--dry-run"])
    assert "head" not in result.stderr  # the existing 3-label head is kept
    assert json.loads(result.stdout)["plan"]["neurons"]


def test_overwrite_replaces_a_non_empty_output(ws: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    ok(["apply", str(ws["bare"]), "-s", "head-prune", "--set", "heads={0: [1]}", "-o", str(out)])
    first = (out / "surgery.json").read_text()
    (out / "old.txt").write_text("old")  # added by the user: an output surgery wrote whole no more
    again = ["apply", str(ws["bare"]), "-s", "head-prune", "--set", "heads={0: [0]}", "-o", str(out), "--overwrite"]
    assert _refusals([(again, f"{out / 'old.txt'} is not a file surgery wrote")]) == []
    assert (out / "old.txt").read_text() == "old" and (out / "surgery.json").read_text() == first
    (out / "old.txt").unlink()
    ok(again)  # surgery's output as it wrote it (its manifest) is replaced
    assert (out / "surgery.json").read_text() != first


def test_bench_side_by_side(ws: dict[str, Path], tmp_path: Path) -> None:
    pruned = tmp_path / "pruned"
    ok(["apply", str(ws["bare"]), "-s", "ffn-prune", "--set", "neurons={0: [0, 1, 2, 3], 1: [5]}", "-o", str(pruned)])
    report_file = tmp_path / "bench.json"
    result = ok(["bench", str(pruned), "--against", str(ws["bare"]), "--batch-size", "2", "--seq-len", "8",
                 "--repeats", "2", "--warmup", "0", "--threads", "1", "--json", str(report_file)])
    assert f"Against {ws['bare']}" in result.stdout and "samples/s" in result.stdout
    assert "paired [95% CI]" in result.stdout  # the paired speedup with its bootstrap interval
    report = json.loads(report_file.read_text())
    assert [m["name"] for m in report["models"]] == [str(ws["bare"]), str(pruned)]
    assert report["comparisons"][0]["params_ratio"] < 1
    # Warnings such as "smaller but not faster" are printed, not only stored.
    from rich.console import Console

    from surgery.measure.bench import BenchReport

    shown = BenchReport.model_validate(report).model_copy(update={"warnings": ["pruned is smaller but not faster"]})
    console = Console(record=True, width=200)
    console.print(bench_view(shown))
    assert "warning: pruned is smaller but not faster" in console.export_text()


# -- bad input: one line, exit 2, no traceback ------------------------------------------
def _bad_cases(ws: dict[str, Path], tmp: Path) -> list[tuple[list[str], str]]:
    bare, data = str(ws["bare"]), str(ws["data"])
    hp = ["-s", "head-prune", "--set", "ratio=0.5"]
    return [
        (["apply", bare, "-s", "no-such", "-o", str(tmp / "a")], "unknown strategy 'no-such'; installed strategies:"),
        (["apply", bare, "-s", "head-prune", "--set", "ratio=2", "-o", str(tmp / "a")],
         "invalid config for strategy 'head-prune': ratio: Input should be less than or equal to 1"),
        (["apply", bare, *hp, "--set", "nope=1", "-o", str(tmp / "a")], "nope: unknown field"),
        (["apply", bare, "-s", "head-prune", "-o", str(tmp / "a")], "give exactly one of 'heads'"),
        (["apply", bare, *hp, "--set", "ratio", "-o", str(tmp / "a")], "--set 'ratio': expected key=value"),
        (["apply", bare, *hp, "--config", str(tmp / "none.yaml"), "-o", str(tmp / "a")], "does not exist"),
        (["apply", bare, *hp, "--config", str(ws["yaml_bad"]), "-o", str(tmp / "a")], "cannot be read"),
        (["apply", bare, *hp, "--config", str(ws["yaml_list"]), "-o", str(tmp / "a")], "must hold a mapping"),
        (["apply", str(tmp / "missing"), *hp, "-o", str(tmp / "a")], "does not exist"),
        (["inspect", str(tmp / "missing")], "does not exist"),
        (["inspect", str(ws["damaged"])], "cannot read a model config from"),
        (["inspect", data], "is a file"),
        (["inspect", str(ws["gpt2"])], "unsupported model type 'gpt2'; supported:"),
        (["apply", str(ws["gpt2"]), *hp, "-o", str(tmp / "a")], "unsupported model type 'gpt2'"),
        (["apply", bare, *hp, "--data", data, "--text-column", "nope", "-o", str(tmp / "a")],
         "missing column(s) ['nope']"),
        (["apply", bare, *hp, "--data", str(tmp / "none.csv"), "-o", str(tmp / "a")], "none.csv does not exist"),
        (["apply", bare, *hp, "--data", str(ws["data_fifo"]), "-o", str(tmp / "a")],
         "fifo.csv is not a regular file (a pipe, socket or device)"),
        (["apply", bare, *hp, "--data", str(ws["nonempty"]), "-o", str(tmp / "a")], "is a directory; pass a regular"),
        (["apply", bare, *hp, "--eval-data", data, "-o", str(tmp / "a")], "--eval-data needs --data"),
        (["apply", str(ws["no_tokenizer"]), *hp, "--data", data, "-o", str(tmp / "a")], "has no tokenizer files"),
        (["apply", str(ws["classifier"]), *hp, "--data", data, "-o", str(tmp / "a")],
         "labels 'pos', 'neg' (48 rows) are not labels of the model's classification head"),
        (["apply", bare, *hp, "-o", bare], "is the input model directory"),
        (["apply", bare, *hp, "-o", str(ws["bare"].parent)], "contains the input model directory"),
        (["apply", bare, *hp, "-o", str(ws["nonempty"])], "holds files surgery did not write"),
        (["apply", bare, *hp, "-o", data], "is a file"),
        (["apply", bare, *hp], "--out is required"),
        (["apply", bare, *hp, "--max-length", "x", "-o", str(tmp / "a")], "'--max-length'"),
        (["apply", bare, *hp, "--nope"], "No such option: --nope"),
        (["apply", bare, "-o", str(tmp / "a")], "Missing option '--strategy'"),
        (["nosuchcommand"], "No such command 'nosuchcommand'"),
        (["bench", str(tmp / "missing")], "does not exist"),
        (["bench", bare, "--against", bare], "names must be distinct"),
    ]


def _refusals(cases: list[tuple[list[str], str]]) -> list[str]:
    """The cases that did not end in exactly one ``error: ...`` line with the expected text and exit 2."""
    failures = []
    for args, expected in cases:
        result = runner.invoke(app, args, input="y\n")  # a prompt that would read it is a failure, too
        lines = result.stderr.strip().splitlines()
        if (result.exit_code != 2 or len(lines) != 1 or not lines[0].startswith("error: ")
                or expected not in lines[0] or "Traceback" in result.output or result.stdout):
            failures.append(f"{args} -> exit {result.exit_code}: {result.output!r} {result.exception!r}")
    return failures


@pytest.mark.slow
def test_bad_input_gives_one_line_and_exit_2(ws: dict[str, Path], tmp_path: Path) -> None:
    # One test over all cases (rather than one per case) keeps the shared fixtures and the time small.
    failures = _refusals(_bad_cases(ws, tmp_path))
    assert not failures, "\n".join(failures)
    assert not (tmp_path / "a").exists()  # nothing was written by any refused command
    assert [p.name for p in ws["nonempty"].iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in ws["bare"].iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                             "tokenizer_config.json"]


def test_output_checks_come_before_any_loading(ws: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before the output directory was checked")

    monkeypatch.setattr(surgery, "from_pretrained", fail)
    result = runner.invoke(app, ["apply", str(ws["bare"]), "-s", "head-prune", "--set", "ratio=0.5",
                                 "--data", str(ws["data"]), "-o", str(ws["bare"])])
    assert result.exit_code == 2 and "is the input model directory" in result.stderr


def test_debug_shows_the_traceback(ws: dict[str, Path], tmp_path: Path) -> None:
    result = runner.invoke(app, ["--debug", "apply", str(ws["bare"]), "-s", "no-such", "-o", str(tmp_path / "a")])
    assert result.exit_code == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert "StrategyNotFoundError" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: unknown strategy 'no-such'")


def test_a_bug_is_not_disguised_as_bad_input(ws: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(model: torch.nn.Module) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(surgery, "inspect", crash)
    result = runner.invoke(app, ["inspect", str(ws["bare"])])
    assert result.exit_code == 1 and isinstance(result.exception, ZeroDivisionError)


def test_csv_jsonl_and_parquet_data_load_alike(tmp_path: Path) -> None:
    """The data flags' formats all go through ``datasets``: the same rows give the same batches."""
    import datasets

    from surgery.core.errors import DataError
    from surgery.data.task_data import load_task_data

    rows = [{**r, "pair": r["text"].split()[0]} for r in labelled_rows(40)]
    table = datasets.Dataset.from_list(rows)
    files = {"csv": write_rows(tmp_path / "d.csv", rows), "jsonl": tmp_path / "d.jsonl",
             "parquet": tmp_path / "d.parquet"}
    table.to_json(str(files["jsonl"]), lines=True)
    table.to_parquet(str(files["parquet"]))
    loaded = {kind: load_task_data(path, tiny_tokenizer(), eval_data=path, text_pair_column="pair", seed=3)
              for kind, path in files.items()}
    reference = loaded["csv"]
    assert reference.label_names == ["neg", "pos"] and len(reference.train) == 40
    for kind, data in loaded.items():
        assert data.label_names == reference.label_names, kind
        for split in ("train", "eval"):
            ours, theirs = getattr(data, split), getattr(reference, split)
            assert ours["input_ids"] == theirs["input_ids"] and ours["labels"] == theirs["labels"], (kind, split)
    (tmp_path / "d.xlsx").write_text("x")
    with pytest.raises(DataError, match=r"d\.xlsx: unsupported format"):
        load_task_data(tmp_path / "d.xlsx", tiny_tokenizer())


# -- hostile and broken input (issue 12) -------------------------------------------------
EVIL_CODE = "import pathlib\npathlib.Path(__file__).with_name('PWNED').write_text('ran')\n"


def _manifest_variant(saved: Path, root: Path, name: str, edit: object) -> Path:
    """A copy of the saved model whose surgery.json is replaced by ``edit(manifest)`` (JSON-serialised)."""
    import shutil

    copy = root / name
    shutil.copytree(saved, copy)
    manifest = json.loads((saved / "surgery.json").read_text())
    (copy / "surgery.json").write_text(json.dumps(edit(manifest)))  # type: ignore[operator]
    return copy


@pytest.fixture(scope="module")
def hostile(ws: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model directories and data files an attacker or a careless export would produce."""
    import shutil

    root = tmp_path_factory.mktemp("hostile")
    paths: dict[str, Path] = {}
    # 1. custom code: an unknown model type whose auto_map points at a file in the directory.
    evil = root / "remote_code"
    evil.mkdir()
    (evil / "config.json").write_text(json.dumps({"model_type": "evil-net", "auto_map": {
        "AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}}))
    (evil / "evil.py").write_text(EVIL_CODE)
    paths["remote_code"] = evil
    # 2. weights only as a pickle.
    pickled = root / "pickled"
    model = tiny_model(TinySpec("bert"))
    model.config.save_pretrained(pickled)
    torch.save(model.state_dict(), pickled / "pytorch_model.bin")
    paths["pickled"] = pickled
    # 6. truncated safetensors, in a plain directory and in a surgery save.
    shutil.copytree(ws["bare"], root / "truncated")
    weights = root / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    paths["truncated"] = root / "truncated"
    pruned = root / "pruned"
    model = tiny_model(TinySpec("bert"))
    surgery.convert(model, surgery.strategies.HeadPruningStrategy(heads={0: [1], 1: [0, 3]}))
    surgery.save_pretrained(model, pruned)
    paths["pruned"] = pruned
    shutil.copytree(pruned, root / "pruned_truncated")
    (root / "pruned_truncated" / "model.safetensors").write_bytes(b"\x08" + b"\x00" * 7 + b"{}")
    paths["pruned_truncated"] = root / "pruned_truncated"
    # 7. hand-edited manifests; 8. the steps removed from a pruned save.
    edits = {
        "m_list": lambda m: [m],
        "m_step_str": lambda m: {**m, "steps": ["head-prune"]},
        "m_step_null": lambda m: {**m, "steps": [None]},
        "m_format_version": lambda m: {**m, "format_version": "abc"},
        "m_plan_version": lambda m: {**m, "steps": [{**m["steps"][0], "plan_version": "x"}]},
        "m_plan_shape": lambda m: {**m, "steps": [{**m["steps"][0], "plan": {"heads": "all of them"}}]},
        "m_attn": lambda m: {**m, "attn_implementation": "os.system"},
        "m_no_steps": lambda m: {**m, "steps": []},
    }
    for name, edit in edits.items():
        paths[name] = _manifest_variant(pruned, root, name, edit)
    # 9. and 10. data edge cases.
    paths["two_rows"] = write_rows(root / "two.csv", labelled_rows(2))
    paths["single"] = write_rows(root / "single.csv", [*labelled_rows(20), {"text": "w1 w2", "label": "odd"}])
    paths["numeric"] = write_rows(root / "numeric.csv", [{"text": i, "label": i % 2} for i in range(20)])
    rows = labelled_rows(20)
    for row in rows[3:6]:
        row["label"] = ""
    paths["empty_labels"] = write_rows(root / "empty_labels.csv", rows)
    # 4. symlinks to the input; UX: report paths that cannot be written.
    (root / "link").symlink_to(ws["bare"], target_is_directory=True)
    paths["link"] = root / "link"
    paths["a_file"] = root / "a_file.txt"
    paths["a_file"].write_text("x")
    return paths


def _hostile_cases(ws: dict[str, Path], h: dict[str, Path], tmp: Path) -> list[tuple[list[str], str]]:
    bare, data, out = str(ws["bare"]), str(ws["data"]), str(tmp / "a")
    hp = ["-s", "head-prune", "--set", "ratio=0.5"]
    manifest_errors = {
        "m_list": "is not a valid surgery manifest: manifest: Input should be a valid dictionary",
        "m_step_str": "steps.0: Input should be a valid dictionary",
        "m_step_null": "steps.0: Input should be a valid dictionary",
        "m_format_version": "format_version: Input should be a valid integer",
        "m_plan_version": "steps.0.plan_version: Input should be a valid integer",
        "m_plan_shape": "step 0 (head-prune) cannot be replayed",
        "m_attn": "attn_implementation: Input should be 'eager', 'sdpa'",
        "m_no_steps": "in the file but [",
    }
    cpu_only = not torch.cuda.is_available()
    return [
        (["inspect", str(h["remote_code"])], "asks to run Python code from the model directory"),
        (["apply", str(h["remote_code"]), *hp, "-o", out], "asks to run Python code"),
        (["inspect", str(h["pickled"])], "holds only pickled weights (pytorch_model.bin)"),
        (["apply", str(h["pickled"]), *hp, "-o", out], "holds only pickled weights"),
        (["bench", str(h["pickled"])], "holds only pickled weights"),
        (["apply", bare, *hp, "-o", str(ws["bare"] / "sub"), "--overwrite"], "is inside the input model directory"),
        (["apply", bare, *hp, "-o", str(h["link"]), "--overwrite"], "is the input model directory"),
        (["apply", str(h["link"]), *hp, "-o", str(ws["bare"] / "sub")], "is inside the input model directory"),
        (["inspect", str(h["truncated"])], "model.safetensors is truncated or corrupt"),
        (["apply", str(h["truncated"]), *hp, "-o", out], "is truncated or corrupt"),
        (["bench", str(h["truncated"])], "is truncated or corrupt"),
        (["inspect", str(h["pruned_truncated"])], "is truncated or corrupt"),
        *[(["inspect", str(h[name])], expected) for name, expected in manifest_errors.items()],
        (["apply", bare, *hp, "--data", str(h["two_rows"]), "-o", out], "has only 1 example"),
        (["apply", bare, *hp, "--data", str(h["single"]), "-o", out], "label 'odd' has only 1 example"),
        (["apply", bare, *hp, "--data", str(h["numeric"]), "-o", out], "column 'text' holds int64 values, not text"),
        (["apply", bare, *hp, "--data", str(h["empty_labels"]), "-o", out],
         "3 of 20 rows have an empty label in column 'label' (first: row 4)"),
        (["apply", bare, *hp, "--data", data, "--eval-data", str(h["empty_labels"]), "-o", out],
         "have an empty label"),
        *([(["bench", bare, "--device", "cuda"], "torch sees no CUDA GPU")] if cpu_only else []),
        (["bench", bare, "--device", "foo"], "unknown device 'foo'"),
        (["bench", bare, "--seq-len", "100000"], "--seq-len 100000 exceeds the 72 positions"),
        (["apply", bare, *hp, "-o", out, "--report", str(h["a_file"] / "r.json")], "is a file, so the directory"),
        (["apply", bare, *hp, "-o", out, "--report", str(tmp)], "is a directory"),
        (["bench", bare, "--json", str(h["a_file"] / "b.json")], "is a file, so the directory"),
    ]


def test_hostile_input_gives_one_line_and_exit_2(ws: dict[str, Path], hostile: dict[str, Path],
                                                  tmp_path: Path) -> None:
    failures = _refusals(_hostile_cases(ws, hostile, tmp_path))
    assert not failures, "\n".join(failures)
    assert not (tmp_path / "a").exists() and not (ws["bare"] / "sub").exists()
    assert not (hostile["remote_code"] / "PWNED").exists()  # evil.py never ran
    assert sorted(p.name for p in ws["bare"].iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                             "tokenizer_config.json"]


# -- issue 22: outputs never destroy inputs, weights and configs are checked ------------
def _digest(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def careless(ws: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Files a careless user names as outputs: ones they own, links into an input model."""
    root = tmp_path_factory.mktemp("careless")
    paths = {"mine": root / "mine.json", "plots": root / "plots", "report": root / "report.json"}
    paths["mine"].write_text("mine")
    paths["plots"].mkdir()
    (paths["plots"] / "pareto.png").write_text("mine")
    paths["report"].write_text(json.dumps({"strategy": "s", "metrics": {
        "accuracy_input": 0.5, "accuracy_pruned": 0.5, "bench": {"comparisons": [{"speedup": 1.5}]}}}))
    paths["link"] = root / "link.json"
    paths["link"].symlink_to(ws["bare"] / "config.json")
    return paths


def _output_cases(ws: dict[str, Path], c: dict[str, Path], tmp: Path) -> list[tuple[list[str], str]]:
    bare, out = str(ws["bare"]), tmp / "a"
    hp = ["-s", "head-prune", "--set", "ratio=0.5"]
    return [
        # 1. the report over the input model's config.json (also through a symlink, also with --overwrite)
        (["apply", bare, *hp, "-o", str(out), "--report", str(ws["bare"] / "config.json")],
         "is inside the input model directory"),
        (["apply", bare, *hp, "-o", str(out), "--report", str(c["link"]), "--overwrite"],
         "is inside the input model directory"),
        # 2. bench JSON over the input's weights
        (["bench", bare, "--json", str(ws["bare"] / "model.safetensors")], "is inside the input model directory"),
        (["bench", bare, "--against", str(ws["classifier"]), "--json", str(ws["classifier"] / "x.json")],
         "is inside the input model directory"),
        # 3. the report over the manifest that the save has just written
        (["apply", bare, *hp, "-o", str(out), "--report", str(out / "surgery.json")], "is inside --out"),
        # 4. any existing file, unless --overwrite; an input data file even then
        (["apply", bare, *hp, "-o", str(out), "--report", str(c["mine"])], "exists; pass --overwrite"),
        (["bench", bare, "--json", str(c["mine"])], "exists; pass --overwrite"),
        (["apply", bare, *hp, "--data", str(ws["data"]), "-o", str(out), "--report", str(ws["data"]),
          "--overwrite"], "is an input of this command"),
        (["plot", str(c["report"]), "--out", str(c["plots"])], "pareto.png exists; pass --overwrite"),
        (["plot", str(c["report"]), "--out", str(c["report"])], "is a file, so the directory cannot be created"),
        (["export", bare, "-o", str(ws["bare"] / "onnx")], "is inside the input model directory"),
    ]


def test_outputs_never_replace_inputs_or_user_files(ws: dict[str, Path], careless: dict[str, Path],
                                                    tmp_path: Path) -> None:
    before = {name: _digest(ws[name]) for name in ("bare", "classifier")}
    failures = _refusals(_output_cases(ws, careless, tmp_path))
    assert not failures, "\n".join(failures)
    assert not (tmp_path / "a").exists()
    assert {name: _digest(ws[name]) for name in ("bare", "classifier")} == before
    assert careless["mine"].read_text() == "mine" and (careless["plots"] / "pareto.png").read_text() == "mine"


def test_report_and_json_are_written_atomically_and_replace_only_with_overwrite(ws: dict[str, Path],
                                                                                 tmp_path: Path) -> None:
    out, report = tmp_path / "pruned", tmp_path / "report.json"
    args = ["apply", str(ws["bare"]), "-s", "head-prune", "--set", "heads={0: [1]}", "-o", str(out),
            "--report", str(report)]
    ok(args)
    first = json.loads(report.read_text())
    ok([*args, "--overwrite"])
    assert json.loads(report.read_text())["plan"] == first["plan"]
    # No temporary left behind; the report's record beside it lets a later --overwrite replace it.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".report.json.surgery-record.json", "pruned", "report.json"]


def _safetensors_bytes(spans: list[tuple[str, int, int]], data: bytes) -> bytes:
    """A hand-made safetensors file: F32 vectors at the given byte spans of ``data``."""
    import struct

    header = json.dumps({name: {"dtype": "F32", "shape": [(stop - start) // 4], "data_offsets": [start, stop]}
                         for name, start, stop in spans}).encode()
    return struct.pack("<Q", len(header)) + header + data


@pytest.fixture(scope="module")
def broken(ws: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model directories whose weights or config.json are damaged, hostile or describe something else."""
    import os
    import shutil

    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("broken")
    weights = load_file(ws["bare"] / "model.safetensors")
    config = json.loads((ws["bare"] / "config.json").read_text())

    def variant(name: str, tensors: dict[str, torch.Tensor] | None = None, **edits: object) -> Path:
        target = root / name
        shutil.copytree(ws["bare"], target)
        if tensors is not None:
            save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
        if edits:
            (target / "config.json").write_text(json.dumps({**config, **edits}))
        return target

    paths = {
        "no_tensors": variant("no_tensors", {}),
        "no_layer_1": variant("no_layer_1", {k: v for k, v in weights.items() if not k.startswith("encoder.layer.1.")}),
        "nan": variant("nan", {**weights, "encoder.layer.0.output.dense.weight":
                               weights["encoder.layer.0.output.dense.weight"].clone().fill_(float("nan"))}),
        "extra_layer": variant("extra_layer", {**weights, "encoder.layer.5.output.dense.bias": torch.zeros(32)}),
        "eps_nan": variant("eps_nan", layer_norm_eps=float("nan")),
        "heads_0": variant("heads_0", num_attention_heads=0),
        "heads_5": variant("heads_5", num_attention_heads=5),
        "heads_negative": variant("heads_negative", num_attention_heads=-4),
        "ffn_negative": variant("ffn_negative", intermediate_size=-1),
        "layers_text": variant("layers_text", num_hidden_layers="2"),
        "layers_100k": variant("layers_100k", num_hidden_layers=100000),
        "huge": variant("huge", hidden_size=65536, num_attention_heads=64, num_hidden_layers=1000),
        "pad_outside": variant("pad_outside", pad_token_id=5000),
        "evil_attention": variant("evil_attention", _attn_implementation="kernels-community/evil"),
        "mismatch": variant("mismatch", intermediate_size=40),
        "overlap": variant("overlap"),
        "gap": variant("gap"),
        "fifo": variant("fifo"),
        "dev_zero": variant("dev_zero"),
        "deep_config": variant("deep_config"),
    }
    (paths["overlap"] / "model.safetensors").write_bytes(
        _safetensors_bytes([("a", 0, 16), ("b", 0, 16)], bytes(16)))
    (paths["gap"] / "model.safetensors").write_bytes(_safetensors_bytes([("a", 0, 16), ("b", 32, 48)], bytes(48)))
    (paths["fifo"] / "model.safetensors").unlink()
    os.mkfifo(paths["fifo"] / "model.safetensors")
    (paths["dev_zero"] / "config.json").unlink()
    (paths["dev_zero"] / "config.json").symlink_to("/dev/zero")
    (paths["deep_config"] / "config.json").write_text(
        json.dumps(config)[:-1] + ', "task_specific_params": ' + "[" * 100_000 + "]" * 100_000 + "}")
    saved = root / "saved"
    model = tiny_model(TinySpec("bert"))
    surgery.convert(model, surgery.strategies.HeadPruningStrategy(heads={0: [1]}))
    surgery.save_pretrained(model, saved)
    manifest = json.loads((saved / "surgery.json").read_text())
    deep = "[" * 100_000 + "]" * 100_000
    for name, text in (("gpt2_class", json.dumps({**manifest, "model_class": "GPT2Model"})),
                       ("deep_manifest", json.dumps(manifest)[:-1] + f', "deep": {deep}}}')):
        shutil.copytree(saved, root / name)
        (root / name / "surgery.json").write_text(text)
        paths[name] = root / name
    paths["duplicate_yaml"] = root / "dup.yaml"
    paths["duplicate_yaml"].write_text("ratio: 0.5\nscope: global\nratio: 0.1\n")
    paths["laughs_yaml"] = root / "laughs.yaml"
    paths["laughs_yaml"].write_text("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9)) + "ratio: 0.5\n")
    return paths


def _weights_and_config_cases(ws: dict[str, Path], b: dict[str, Path], tmp: Path) -> list[tuple[list[str], str]]:
    bare, data, out = str(ws["bare"]), str(ws["data"]), str(tmp / "a")
    hp = ["-s", "head-prune", "--set", "ratio=0.5"]
    inspect = {
        # 5. missing weights
        "no_tensors": "lacks 37 encoder weight(s) (embeddings.LayerNorm.bias,",
        "no_layer_1": "lacks 16 encoder weight(s) (encoder.layer.1.attention.output.LayerNorm.bias,",
        # 6. non-finite weights and config values, tensors for a layer the config lacks
        "nan": "encoder.layer.0.output.dense.weight holds 1184 NaN or infinite value(s)",
        "extra_layer": "no place for (encoder.layer.5.output.dense.bias)",
        "eps_nan": "layer_norm_eps must be a finite number between 0 and 1, got nan",
        # 8. config values
        "heads_0": "num_attention_heads must be a positive integer, got 0",
        "heads_5": "hidden_size 32 is not divisible by num_attention_heads 5",
        "heads_negative": "num_attention_heads must be a positive integer, got -4",
        "ffn_negative": "intermediate_size must be a positive integer, got -1",
        "layers_text": "Field 'num_hidden_layers' expected int, got str (value: '2')",
        "pad_outside": "pad_token_id 5000 is not a row of the 99-token vocabulary",
        "mismatch": "encoder.layer.0.intermediate.dense.bias has shape [37] in the file but [40] in the model",
        # 10., 11. manifests
        "gpt2_class": "model class 'GPT2Model' is for 'gpt2' models, but the config is 'bert'",
        "deep_manifest": "surgery.json nests deeper than 32 levels",
        "deep_config": "config.json nests deeper than 32 levels",
        # 12. safetensors headers
        "overlap": "(tensor 'b' overlaps the tensor before it)",
        "gap": "(tensor 'b' leaves a gap of 16 bytes before it)",
        # 15. code-load path
        "evil_attention": "_attn_implementation 'kernels-community/evil' is not one of transformers' built-in",
    }
    return [
        *[(["inspect", str(b[name])], expected) for name, expected in inspect.items()],
        (["apply", str(b["no_layer_1"]), *hp, "-o", out], "lacks 16 encoder weight(s)"),
        (["apply", str(b["nan"]), *hp, "--data", data, "-o", out], "NaN or infinite"),
        (["apply", str(b["evil_attention"]), *hp, "-o", out], "kernels-community/evil"),
        # 13. --max-length beyond the positions, like bench --seq-len
        (["apply", bare, *hp, "--data", data, "--max-length", "1000", "-o", out],
         "--max-length 1000 exceeds the 72 positions"),
        (["export", bare, "--seq", "1000", "-o", out], "--seq 1000 exceeds the 72 positions"),
        # 6. duplicate keys; 14. billion laughs
        (["apply", bare, "-s", "head-prune", "--config", str(b["duplicate_yaml"]), "-o", out],
         "line 3: key 'ratio' is given twice"),
        (["apply", bare, "-s", "head-prune", "--set", "heads={0: [1], 0: [2]}", "-o", out], "is given twice"),
    ]


def _unbounded_cases(ws: dict[str, Path], b: dict[str, Path], tmp: Path) -> list[tuple[list[str], str]]:
    """14. Inputs that used to hang or fill memory: refused before any unbounded work."""
    bare, out = str(ws["bare"]), str(tmp / "a")
    return [
        (["inspect", str(b["layers_100k"])], "num_hidden_layers 100000 is more than the 1024 layers surgery builds"),
        (["inspect", str(b["huge"])], "describes about 17191 billion parameters, more than the 20 billion surgery "
         "builds"),
        (["inspect", str(b["fifo"])], "model.safetensors is not a regular file (a FIFO)"),
        (["bench", str(b["fifo"])], "is not a regular file (a FIFO)"),
        (["inspect", str(b["dev_zero"])], "config.json is not a regular file (a device)"),
        (["bench", bare, "--repeats", "1000000000"], "--repeats': Input should be less than or equal to 10000"),
        (["apply", bare, "-s", "head-prune", "--config", str(b["laughs_yaml"]), "-o", out],
         "YAML aliases (*name) are not accepted"),
    ]


#: Runs CLI cases in a child process, so that a hang fails the test at the time limit instead of blocking it.
CHILD = """
import json, sys
from typer.testing import CliRunner
from surgery.cli.app import app
runner = CliRunner()
print(json.dumps([[r.exit_code, r.stderr, r.stdout] for r in (runner.invoke(app, a) for a in json.loads(sys.argv[1]))]))
"""


@pytest.mark.slow
@pytest.mark.multiprocess
def test_unbounded_inputs_are_refused_within_a_time_limit(ws: dict[str, Path], broken: dict[str, Path],
                                                          tmp_path: Path) -> None:
    import subprocess
    import sys

    cases = _unbounded_cases(ws, broken, tmp_path)
    child = subprocess.run([sys.executable, "-c", CHILD, json.dumps([args for args, _ in cases])],
                           capture_output=True, text=True, timeout=180)
    assert child.returncode == 0, child.stderr[-2000:]
    failures = []
    for (args, expected), (code, stderr, stdout) in zip(cases, json.loads(child.stdout), strict=True):
        lines = stderr.strip().splitlines()
        if code != 2 or len(lines) != 1 or expected not in lines[0] or stdout:
            failures.append(f"{args} -> exit {code}: {stderr!r}")
    assert not failures, "\n".join(failures)
    assert not (tmp_path / "a").exists()


def test_damaged_weights_and_configs_give_one_line_and_exit_2(ws: dict[str, Path], broken: dict[str, Path],
                                                              tmp_path: Path) -> None:
    failures = _refusals(_weights_and_config_cases(ws, broken, tmp_path))
    assert not failures, "\n".join(failures)
    assert not (tmp_path / "a").exists()


def test_a_new_head_stays_allowed_and_a_missing_pooler_is_announced(ws: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(ws["bare"], tmp_path / "no_pooler")
    weights = load_file(ws["bare"] / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("pooler.")},
              str(tmp_path / "no_pooler" / "model.safetensors"), metadata={"format": "pt"})
    result = runner.invoke(app, ["apply", str(tmp_path / "no_pooler"), "-s", "head-prune", "--set", "ratio=0.5",
                                 "--data", str(ws["data"]), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "new randomly initialised head for 2 labels" in result.stderr
    assert "hold no pooler (bert.pooler.dense.bias); it is new and randomly initialised" in result.stderr


def test_unreadable_data_files_name_the_file_the_line_and_the_fix(ws: dict[str, Path], tmp_path: Path) -> None:
    files = {
        "empty.csv": (b"", "is empty; it needs a header row"),
        "junk.csv": (bytes(range(128, 256)) * 3, "line 1 is not UTF-8 text (byte 0x80 at column 1)"),
        "latin.csv": ("text,label\nw1 w2,pos\nh\xe9llo,neg\n".encode("latin-1"),
                      "line 3 is not UTF-8 text (byte 0xe9 at column 2); save the file as UTF-8"),
        "broken.jsonl": (b'{"text": "w1", "label": "pos"}\n{"text": "w2", "label": \n',
                         "line 2 is not valid JSON (Expecting value at column"),
        "fake.csv.gz": (b"text,label\nw1,pos\n", "is named .gz but is not gzip-compressed"),
        "ragged.csv": (b"text,label\nw1,pos\nw2,neg,extra\n", "Expected 2 fields in line 3, saw 3"),
    }
    cases = []
    for name, (content, expected) in files.items():
        (tmp_path / name).write_bytes(content)
        cases.append((["apply", str(ws["bare"]), "-s", "head-prune", "--set", "ratio=0.5", "--data",
                       str(tmp_path / name), "-o", str(tmp_path / "a")], f"{tmp_path / name}"))
        cases.append((cases[-1][0], expected))
    failures = _refusals(cases)
    assert not failures, "\n".join(failures)
