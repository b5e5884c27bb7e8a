"""Flags that mean what they say, and the latency cache read as untrusted input (issue 29).

* ``export --opset N`` writes a graph of opset N, or is refused in one line with the supported range;
* bounds of ``--speedup``, ``--max-drop``, ``--threads``, ``--batch x --seq-len`` and ``--opset`` fail
  in one line with exit 2 before torch or transformers is imported (checked in a fresh process);
* a cache file nested 200,000 deep, very large, holding ``Infinity`` or text is never used and never
  raises; a table far off the model's own time is measured again; an unusable cache location is
  measured without a cache and says so naming ``SURGERY_CACHE``; ``--dry-run`` writes no cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from surgery.cli.app import app
from surgery.compress import latency_cache
from surgery.compress.latency_cache import MAX_CACHE_BYTES, read_cached, try_write_cached
from surgery.compress.latency_measure import measure_latency_table
from surgery.compress.latency_table import LatencyTable
from surgery.compress.structure import Structure
from surgery.core.errors import ConfigError
from surgery.persist.config_values import OPSET_RANGE, check_opset, machine_cores, threads_warning
from surgery.testing import TinySpec, tiny_model
from tests.helpers import labelled_rows, tiny_tokenizer, write_rows

runner = CliRunner(env={"COLUMNS": "200"})
FAST = dict(batch_size=2, seq_len=8, threads=1, repeats=3)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("flags")
    model = tiny_model(TinySpec("bert", task="seq-cls", layers=2), num_labels=2, id2label={0: "neg", 1: "pos"},
                       label2id={"neg": 0, "pos": 1})
    model.save_pretrained(root / "classifier")
    tiny_tokenizer().save_pretrained(root / "classifier")
    return {"model": root / "classifier", "data": write_rows(root / "train.csv", labelled_rows(48))}


# -- flags, in a fresh process: exit 2, one line, nothing heavy imported --------------------------
#: ``compress`` flags that are refused before torch is imported, and what the one line says.
COMPRESS_FLAGS = [
    (["--speedup", "inf"], "--speedup must be more than 1 and finite"),
    (["--speedup", "nan"], "--speedup must be more than 1 and finite"),
    (["--max-drop", "200"], "--max-drop must be between 0 and 100"),
    (["--max-drop", "-1"], "--max-drop must be between 0 and 100"),
    (["--speedup", "2", "--budget", "0"], "--budget must be a positive number of minutes"),
    (["--speedup", "2", "--objective", "ranking"], "--objective 'ranking': choose task or embedding"),
    # 20 million x 64 tokens: terabytes of activations even for a tiny model, on any machine
    (["--speedup", "2", "--batch", "20000000", "--seq-len", "64"], "GiB of activations, more than this machine's"),
    (["--speedup", "2", "--seq-len", "100000"], "--seq-len 100000 exceeds the 72 positions the model supports"),
]
OPSETS = ["1", "14", "99"]
#: One interpreter runs every case in turn: each refusal must leave torch, transformers and datasets unimported,
#: so the next case starts as clean as a fresh process (a case that imported one fails, and so does the rest).
PROBE = """
import contextlib, io, json, sys
from surgery.cli import main
results = []
for args in json.loads(sys.argv[1]):
    sys.argv = ['surgery', *args]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            main()
        except SystemExit as exc:
            code = exc.code
        else:
            code = 0
    results.append([code, err.getvalue(), [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]])
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def refusals(classifier: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every flag case of this section, run in one new interpreter: its exit code, stderr, heavy imports, --out."""
    root = tmp_path_factory.mktemp("refusals")
    cases: dict[str, tuple[list[str], Path]] = {}
    for i, (flags, _) in enumerate(COMPRESS_FLAGS):
        out = root / f"compress-{i}"
        cases[f"compress-{i}"] = (["compress", str(classifier["model"]), "--data", str(classifier["data"]), "--out",
                                   str(out), *flags], out)
    for opset in OPSETS:
        out = root / f"opset-{opset}"
        cases[f"opset-{opset}"] = (["export", str(classifier["model"]), "--out", str(out), "--opset", opset], out)
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps([args for args, _ in cases.values()])], cwd=root,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: (*result, out) for (name, (_, out)), result in zip(cases.items(), results, strict=True)}


@pytest.mark.parametrize(("case", "message"), [(i, message) for i, (_, message) in enumerate(COMPRESS_FLAGS)])
def test_compress_refuses_an_impossible_flag_before_importing_torch(refusals: dict[str, Any], case: int,
                                                                     message: str) -> None:
    code, err, imported, out = refusals[f"compress-{case}"]
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert imported == [], f"imported {imported} before refusing {COMPRESS_FLAGS[case][0]}"
    assert not out.exists()


@pytest.mark.parametrize("opset", OPSETS)
def test_export_refuses_an_opset_it_cannot_write_before_importing_torch(refusals: dict[str, Any], opset: str) -> None:
    code, err, imported, out = refusals[f"opset-{opset}"]
    low, high = OPSET_RANGE
    assert code == 2 and err.strip() == (f"error: --opset {opset} is not supported: choose {low} to {high} (or leave "
                                         "--opset out for the exporter's default)"), err
    assert imported == [] and not out.exists()


def test_threads_above_the_cores_warn_and_bad_opsets_are_config_errors() -> None:
    assert threads_warning(machine_cores()) is None
    assert f"more than the {machine_cores()} cores" in threads_warning(machine_cores() * 50)
    for bad in (OPSET_RANGE[0] - 1, OPSET_RANGE[1] + 1):
        with pytest.raises(ConfigError):
            check_opset(bad)


@pytest.mark.slow
@pytest.mark.onnx
def test_export_writes_the_opset_asked_for(classifier: dict[str, Path], tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    result = runner.invoke(app, ["export", str(classifier["model"]), "--out", str(tmp_path / "o"), "--opset", "17"])
    assert result.exit_code == 0, result.output
    graph = onnx.load(str(tmp_path / "o" / "model.onnx"), load_external_data=False)
    assert [o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")] == [17]
    assert json.loads((tmp_path / "o" / "surgery-onnx.json").read_text())["opset"] == 17


# -- the latency cache as untrusted input ---------------------------------------------------------
def table(**changes: object) -> LatencyTable:
    values = dict(runtime="torch", batch_size=2, seq_len=8, model_key="demo", base_ms=1.0, overhead_ms=0.1,
                  attention_ms={4: 1.0}, ffn_ms={37: 1.0})
    return LatencyTable(**{**values, **changes})


def write_file(path: Path, key: dict, stored_table: object) -> None:
    path.write_text(json.dumps({"format": latency_cache.CACHE_FORMAT, "key": key, "table": stored_table}))


@pytest.mark.parametrize("content", [
    b"[" * 200_000 + b"]" * 200_000,
    b'{"format": 1, "key": ' + b"{\"a\": " * 100_000 + b"1" + b"}" * 100_000 + b"}",
    b"\x80\x04K.",
    b"",
])
def test_a_hostile_cache_file_is_refused_without_raising(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(content)
    found, why = read_cached(path, {"runtime": "torch"})
    assert found is None and why is not None and why.startswith(str(path))


def test_a_very_large_cache_file_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    with path.open("wb") as handle:  # sparse: 8 GiB on paper, nothing on disk
        handle.truncate(8 * 2**30)
    found, why = read_cached(path, {"runtime": "torch"})
    assert found is None and f"at most {MAX_CACHE_BYTES} bytes" in why


@pytest.mark.parametrize(("field", "value"), [
    ("ffn_ms", "Infinity"), ("ffn_ms", "NaN"), ("ffn_ms", "1e999"), ("ffn_ms", "-0.5"), ("attention_ms", "-1.0"),
    ("base_ms", "-3.0"), ("overhead_ms", "-Infinity"),
])
def test_a_cached_table_holds_only_finite_positive_times(tmp_path: Path, field: str, value: str) -> None:
    path = tmp_path / "t.json"
    marked = table(**({field: {4: 12345.0} if field == "attention_ms" else {37: 12345.0}} if field.endswith("ms")
                      and field in ("attention_ms", "ffn_ms") else {field: 12345.0}))
    write_file(path, {"runtime": "torch"}, marked.model_dump(mode="json"))
    assert read_cached(path, {"runtime": "torch"})[0] is not None  # the marked file itself is valid
    path.write_text(path.read_text().replace("12345.0", value))
    found, why = read_cached(path, {"runtime": "torch"})
    assert found is None and why.startswith(str(path)), why
    assert value not in why.removeprefix(str(path))


def test_a_table_whose_layers_cost_nothing_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    write_file(path, {"runtime": "torch"}, table(attention_ms={4: 0.0}, ffn_ms={37: 0.0}, overhead_ms=0.0)
               .model_dump(mode="json"))
    assert read_cached(path, {"runtime": "torch"}) == (None, f"{path}: its layers cost nothing")


def test_a_cache_file_s_text_never_reaches_the_table(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    key = {"runtime": "torch", "shape": {"model_type": "bert", "model_class": "BertModel", "hidden": 32,
                                         "head_dim": 8, "layers": [{"heads": 4, "ffn_width": 37}]}}
    stored = table(model_key="<script>EVIL", machine={"cpu": "EVIL machine"},
                   measured={"method": "EVIL method", "scale": 1.0, "note": "EVIL"}).model_dump(mode="json")
    write_file(path, key, stored)
    found, why = read_cached(path, key)
    assert why is None and found is not None and found.ffn_ms == {37: 1.0}
    assert "EVIL" not in json.dumps(found.model_dump(mode="json"))
    assert found.measured == {"scale": 1.0} and found.model_key.startswith("bert BertModel hidden 32")


def cached_file(cache_dir: Path) -> Path:
    files = list(cache_dir.iterdir())
    assert len(files) == 1, files
    return files[0]


@pytest.mark.slow
def test_a_cached_table_far_off_the_model_s_own_time_is_measured_again(tmp_path: Path) -> None:
    model = tiny_model(TinySpec("bert", layers=2))
    first = measure_latency_table(model, runtime="torch", cache_dir=tmp_path, **FAST)
    path = cached_file(tmp_path)
    payload = json.loads(path.read_text())
    # Every time 100x, so that the prediction is 100x the model's own time whatever the load of either
    # measurement (scaling only the layer entries left it near the base time when they were solved near 0).
    tampered = payload["table"]
    for name in ("base_ms", "overhead_ms"):
        tampered[name] *= 100
    for name in ("attention_ms", "ffn_ms"):
        tampered[name] = {k: v * 100 for k, v in tampered[name].items()}
    tampered["model_key"] = "EVIL key"
    path.write_text(json.dumps(payload))
    assert LatencyTable.model_validate(tampered).predict_ms(Structure.from_model(model)) == pytest.approx(
        100 * first.predict_ms(Structure.from_model(model)))
    again = measure_latency_table(model, runtime="torch", cache_dir=tmp_path, **FAST)
    assert not again.measured["cached"] and "predicts" in again.measured["replaced_cache"]
    assert again.model_key == first.model_key
    # The file now holds the table measured again, not the tampered one.
    stored = LatencyTable.model_validate(json.loads(path.read_text())["table"])
    assert stored.model_dump(exclude={"measured"}) == again.model_dump(exclude={"measured"})


@pytest.mark.slow
def test_an_unusable_cache_location_measures_without_a_cache_and_says_so(tmp_path: Path) -> None:
    model = tiny_model(TinySpec("bert", layers=2))
    found = measure_latency_table(model, runtime="torch", cache_dir=Path("/dev/null") / "latency", **FAST)
    assert not found.measured["cached"] and found.measured["cache_file"] is None
    assert "SURGERY_CACHE" in found.measured["cache_note"] and "/dev/null" in found.measured["cache_note"]
    if os.geteuid() != 0:  # root writes into a read-only directory
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        note = try_write_cached(locked / "latency" / "t.json", {}, table())
        assert note is not None and "SURGERY_CACHE" in note


@pytest.mark.slow
def test_compress_with_an_unusable_cache_completes_with_one_note(classifier: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(app, ["compress", str(classifier["model"]), "--data", str(classifier["data"]),
                                 "--speedup", "1.3", "--out", str(out), "--batch", "2", "--seq-len", "8",
                                 "--threads", "1"], env={"SURGERY_CACHE": "/dev/null", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert sum("SURGERY_CACHE" in line for line in result.stderr.splitlines()) == 1, result.stderr
    report = json.loads((out / "compress.json").read_text())
    assert any("SURGERY_CACHE" in n for n in report["notes"])


@pytest.mark.slow
def test_dry_run_writes_no_latency_cache(classifier: dict[str, Path], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    result = runner.invoke(app, ["compress", str(classifier["model"]), "--data", str(classifier["data"]),
                                 "--speedup", "1.5", "--dry-run", "--batch", "2", "--seq-len", "8", "--threads", "1"],
                           env={"SURGERY_CACHE": str(cache), "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    # The preview of a measured table (whether a cut reaches 1.5x on a tiny model depends on the machine's load).
    preview = json.loads(result.stdout)
    assert preview["predicted_ms_original"] > 0 and "would_cut" in preview and preview["speed_points"] is not None
    assert not cache.exists(), sorted(str(p) for p in cache.rglob("*"))


# -- output config.json never names remote code --------------------------------------------------
def test_saved_configs_drop_the_input_s_auto_map(tmp_path: Path) -> None:
    import surgery
    from surgery.compress.stock_export import save_stock

    source = tmp_path / "source"
    tiny_model(TinySpec("bert", layers=2)).save_pretrained(source)
    config = json.loads((source / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel", "AutoConfig": "configuration_evil.EvilConfig"}
    (source / "config.json").write_text(json.dumps(config))
    model = surgery.from_pretrained(source)  # a type transformers knows: auto_map is ignored, never run
    written = [surgery.save_pretrained(model, tmp_path / "surgery-format"), save_stock(model, tmp_path / "stock")]
    for out in written:
        saved = json.loads((out / "config.json").read_text())
        assert "auto_map" not in saved and saved["model_type"] == "bert", out
        assert not list(out.glob("*.py"))


# -- messages that say what is wrong and what compress accepts ------------------------------------
def test_compress_notes_name_its_own_objective_flag(classifier: dict[str, Path]) -> None:
    from surgery.cli.compress import CompressObjectives
    from surgery.cli.embedding_apply import choose_objective
    from surgery.persist.config_values import load_config

    config = load_config(classifier["model"])
    for requested in (None, "task", "embedding"):
        note = choose_objective(classifier["model"], config, requested, CompressObjectives).note()
        assert "--set" not in note and "--objective " in note, note
    assert "--set objective=embedding" in choose_objective(classifier["model"], config, None).note()  # apply's


@pytest.mark.parametrize(("name", "content", "message"), [
    ("u16.csv", "text,label\nhello,0\n".encode("utf-16"),
     "is UTF-16 text (it starts with a UTF-16 byte-order mark); save it as UTF-8: iconv -f UTF-16 -t UTF-8 u16.csv "
     "> u16-utf8.csv"),
    ("u16.jsonl", '{"text": "a", "label": 0}\n'.encode("utf-16-le"), "holds NUL bytes between its characters"),
    ("junk.parquet", b"text,label\nhello,0\n" + bytes(range(256)),
     "is named .parquet but is not a Parquet file (no PAR1 header): it holds binary data"),
    ("csv.parquet", b"text,label\nhello,0\n", "is not a Parquet file (no PAR1 header): it holds text (CSV or JSON?)"),
    ("gz.parquet", b"\x1f\x8b\x08" + bytes(64), "it holds gzip-compressed data"),
    ("cut.parquet", b"PAR1" + bytes(64), "is truncated: it starts as Parquet but has no Parquet footer"),
    ("header.csv", b"text,label\n", "has no rows (a header at most); it needs one row per example under its header"),
    ("deep.json", b"[" * 100_000 + b"]" * 100_000, "nests deeper than 64 levels"),
    ("deep-late.jsonl", b'{"text": "a", "label": 0}\n' * 50_000 + b'{"text": ' + b"[" * 100_000 + b"]" * 100_000
     + b', "label": 1}\n', "nests deeper than 64 levels"),
])
def test_unreadable_data_files_are_told_what_they_are(tmp_path: Path, name: str, content: bytes,
                                                      message: str) -> None:
    from surgery.core.errors import DataError
    from surgery.data.task_data import read_table

    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError) as error:
        read_table(path)
    text = str(error.value)
    assert text.startswith(f"data file {path}") and message in text and "\n" not in text, text
    assert "latin1" not in text and "Instruction" not in text


@pytest.mark.parametrize("command", ["export", "bench"])
def test_a_missing_calibration_file_names_the_flag_and_the_formats(classifier: dict[str, Path], tmp_path: Path,
                                                                   command: str) -> None:
    args = [command, str(classifier["model"]), "--runtime", "onnxruntime-int8", "--calibration",
            str(tmp_path / "nope.txt")] + (["--out", str(tmp_path / "o")] if command == "export" else [])
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert line.startswith(f"error: --calibration {tmp_path / 'nope.txt'} does not exist; pass texts like") and \
        "a .txt file (one text per line)" in line and ".parquet" in line and "\n" not in line, line


# -- the Python API: wrong argument types are SurgeryErrors in one line ---------------------------
def api_calls(tmp_path: Path) -> dict[str, Any]:
    import surgery
    from surgery.strategies import HeadPruningStrategy
    from surgery.testing import tiny_task_data

    model = tiny_model(TinySpec("bert", task="seq-cls"))
    strategy = HeadPruningStrategy(heads={0: [1]})
    return {
        "compress(name)": lambda: surgery.compress("minilm-l6", tiny_task_data(), speedup=2.0),
        "compress(object)": lambda: surgery.compress(object(), tiny_task_data(), speedup=2.0),
        "compress(model, path)": lambda: surgery.compress(model, "train.csv", speedup=2.0),
        "compress(model, list)": lambda: surgery.compress(model, ["a text"], speedup=2.0),
        "compress(eval_data=path)": lambda: surgery.compress(model, tiny_task_data(), eval_data="dev.csv",
                                                             speedup=2.0),
        "convert(name)": lambda: surgery.convert("minilm-l6", strategy),
        "convert(model, name)": lambda: surgery.convert(model, "head-prune"),
        "plan(name)": lambda: surgery.plan("minilm-l6", strategy),
        "apply_plan(str plan)": lambda: surgery.apply_plan(model, strategy, "heads"),
        "apply_plan(bad plan)": lambda: surgery.apply_plan(model, strategy, {"heads": 5}),
        "export_onnx(name)": lambda: surgery.export_onnx("minilm-l6", tmp_path / "o"),
        "export_onnx(int)": lambda: surgery.export_onnx(42, tmp_path / "o"),
        "save_pretrained(name)": lambda: surgery.save_pretrained("minilm-l6", tmp_path / "s"),
        "inspect(int)": lambda: surgery.inspect(42),
    }


def test_api_entry_points_refuse_wrong_argument_types_with_one_line_surgery_errors(tmp_path: Path) -> None:
    from surgery.core.errors import SurgeryError

    for name, call in api_calls(tmp_path).items():
        with pytest.raises(SurgeryError) as error:
            call()
        assert "\n" not in str(error.value) and len(str(error.value)) < 300, (name, str(error.value))
    assert not (tmp_path / "o").exists() and not (tmp_path / "s").exists()
    with pytest.raises(SurgeryError, match=r"load it first: surgery.from_pretrained\('minilm-l6'\)"):
        api_calls(tmp_path)["compress(name)"]()
