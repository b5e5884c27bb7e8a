"""One runtime concept: the registry (entry points, a third party's runtime), availability, ExportConfig, the CLI names.

OpenVINO's own artefacts are tested in tests/test_openvino.py (skipped where the extra is missing).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import surgery
from surgery.cli.app import app
from surgery.core.errors import ConfigError, MissingDependencyError
from surgery.runtimes import available_runtimes, get_runtime, register_runtime, runtime_class, runtime_names
from surgery.runtimes.export_config import ExportConfig
from surgery.runtimes.shared.runtime import Runtime
from surgery.runtimes.torch.torch_runtime import TorchRuntime
from surgery.testing import TinySpec, main_output, tiny_inputs, tiny_model

BUILTINS = ("torch", "torch-bf16", "torch-fp16", "onnxruntime", "onnxruntime-int8", "openvino", "openvino-bf16",
            "openvino-int8")

THIRD_PARTY = '''
from torch import nn

from surgery.runtimes.torch.torch_runtime import TorchRuntime


class Doubled(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, **inputs):
        out = self.inner(**inputs)
        out["last_hidden_state"] = out["last_hidden_state"] * 2
        return out


class DoubledRuntime(TorchRuntime):
    """A third party's runtime: the model as it is, outputs doubled (so a test can tell it ran)."""

    name = "doubled"
    description = "doubled outputs"

    def prepare(self, model, work_dir, *, task="auto", calibration=None, threads=None):
        return Doubled(super().prepare(model, work_dir, task=task))
'''


def one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_builtins_are_registered_through_the_entry_point_group_in_order() -> None:
    assert runtime_names()[: len(BUILTINS)] == BUILTINS
    for name in BUILTINS:
        cls = runtime_class(name)
        assert issubclass(cls, Runtime) and cls.name == name and cls.description
    assert runtime_class("openvino-int8").needs_calibration and not runtime_class("openvino").needs_calibration
    assert runtime_class("openvino").extra == "openvino" and runtime_class("onnxruntime").extra == "onnx"
    assert runtime_class("torch").extra is None


def test_resolving_one_name_imports_only_that_runtime(monkeypatch) -> None:
    for module in ("surgery.runtimes.openvino.openvino_runtime", "surgery.runtimes.onnx.onnx_runtime"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    get_runtime("torch")
    assert "surgery.runtimes.openvino.openvino_runtime" not in sys.modules
    assert "surgery.runtimes.onnx.onnx_runtime" not in sys.modules


def test_unknown_runtime_is_refused_listing_the_registered_names() -> None:
    with pytest.raises(ConfigError, match=r"runtime 'tensorrt' is not one of torch, torch-bf16, .*openvino-int8"):
        get_runtime("tensorrt")


def test_a_third_party_runtime_registers_through_an_entry_point(tmp_path, monkeypatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "doubled_runtime.py").write_text(THIRD_PARTY)
    info = site / "surgery_doubled-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: surgery-doubled\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[surgery.runtimes]\ndoubled = doubled_runtime:DoubledRuntime\n")
    monkeypatch.syspath_prepend(str(site))
    assert "doubled" in runtime_names() and available_runtimes()["doubled"] is None
    spec = TinySpec("bert")
    model = tiny_model(spec)
    served = get_runtime("doubled").prepare(model, tmp_path / "w")
    inputs = tiny_inputs(spec)
    torch.testing.assert_close(main_output(served, inputs), 2 * main_output(model, inputs))
    # SURGERY_PLUGINS restricts third parties as it does for strategies; the built-ins stay.
    monkeypatch.setenv("SURGERY_PLUGINS", "")
    assert "doubled" not in runtime_names() and "openvino" in runtime_names()


def test_register_runtime_in_process_and_a_broken_entry_is_reported_not_raised(tmp_path, monkeypatch) -> None:
    from surgery.runtimes.torch.torch_runtime import TorchRuntime

    @register_runtime
    class Renamed(TorchRuntime):
        """PyTorch under another name."""

        name = "renamed-test"

    assert get_runtime("renamed-test").name == "renamed-test"
    with pytest.raises(ValueError, match="invalid runtime name"):
        register_runtime(type("Bad", (TorchRuntime,), {"name": "no spaces"}))
    site = tmp_path / "broken"
    info = site / "surgery_broken_rt-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: surgery-broken-rt\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[surgery.runtimes]\nbroken-rt = no_such_module_here:Runtime\n")
    monkeypatch.syspath_prepend(str(site))
    assert "failed to import" in (available_runtimes()["broken-rt"] or "")
    with pytest.raises(ConfigError, match=r"broken-rt.*failed to import"):
        get_runtime("broken-rt")


def test_a_missing_package_is_one_line_naming_the_extra(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("openvino", "nncf") else real(name, *a))
    reason = available_runtimes()["openvino-int8"]
    assert reason == "needs openvino, nncf (not installed): pip install 'encoder-surgery[openvino]'"
    with pytest.raises(MissingDependencyError, match=r"encoder-surgery\[openvino\]"):
        get_runtime("openvino")
    result = CliRunner().invoke(app, ["export", "minilm-l6", "--out", "/tmp/never-written-rt", "--runtime", "openvino"])
    assert "pip install 'encoder-surgery[openvino]'" in one_line_error(result)
    assert not Path("/tmp/never-written-rt").exists()


def test_bf16_needs_the_cpu_flag_or_cuda(monkeypatch) -> None:
    from surgery.measure import machine

    bare = machine.machine_info().model_copy(update={"flags": ["avx2", "avx512f"]})
    monkeypatch.setattr(machine, "machine_info", lambda: bare)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reason = get_runtime("torch-bf16", require_available=False).unavailable()
    assert reason is not None and "avx512_bf16 or amx_bf16" in reason and "--runtime torch" in reason
    with pytest.raises(ConfigError, match=r"torch-bf16.*not available here"):
        get_runtime("torch-bf16")
    assert "CUDA" in (available_runtimes()["torch-fp16"] or "")
    flagged = bare.model_copy(update={"flags": ["avx512_bf16"]})
    monkeypatch.setattr(machine, "machine_info", lambda: flagged)
    assert get_runtime("torch-bf16").unavailable() is None


def test_torch_bf16_artefact_reloads_in_bf16_and_records_its_drift(tmp_path) -> None:
    runtime = get_runtime("torch-bf16", require_available=False)
    spec = TinySpec("bert", task="seq-cls")
    model = tiny_model(spec)
    artefact = runtime.write_artefact(model, tmp_path / "bf16")
    assert artefact.info["dtype"] == "bfloat16" and artefact.output == "logits"
    assert 0.99 < artefact.parity["mean_cosine"] <= 1.0 + 1e-9 and artefact.parity["max_abs_diff"] > 0
    served = runtime.load(artefact.directory, config=model.config)
    assert next(served.parameters()).dtype == torch.bfloat16
    got = served(**tiny_inputs(spec)).logits
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, model(**tiny_inputs(spec)).logits, atol=0.05, rtol=0.05)
    assert get_runtime("torch").prepare(model, tmp_path / "unused") is model


@pytest.mark.slow
@pytest.mark.onnx
@pytest.mark.parametrize("name", ["onnxruntime", "onnxruntime-int8"])
def test_onnx_runtimes_wrap_the_one_onnx_export(tmp_path, name) -> None:
    spec = TinySpec("bert", heads=4)
    model = tiny_model(spec)
    surgery.convert(model, surgery.get_method("head-prune")(heads={0: [1, 2]}))
    runtime = get_runtime(name)
    artefact = runtime.write_artefact(model, tmp_path / name, threads=1)
    info = json.loads((artefact.directory / "surgery-onnx.json").read_text())
    assert info["int8"] is name.endswith("int8") and artefact.files == ("model.onnx", "surgery-onnx.json")
    served = runtime.load(artefact.directory, config=model.config, threads=1)
    inputs = tiny_inputs(spec, batch=5, seq=11)
    tolerance = 1e-4 if name == "onnxruntime" else 0.2
    torch.testing.assert_close(main_output(served, inputs), main_output(model, inputs), atol=tolerance, rtol=0)


def test_export_config_validates_once_and_refuses_unknown_fields() -> None:
    assert ExportConfig().runtime == "onnxruntime" and ExportConfig(runtime="openvino-int8").smooth_alpha is None
    with pytest.raises(ValueError, match=r"unknown|extra"):
        ExportConfig(int8=True)
    with pytest.raises(ValueError, match=r"opset belongs to the runtimes that read it \(onnxruntime, onnxruntime-in"):
        ExportConfig(runtime="openvino", opset=17)
    with pytest.raises(ValueError, match=r"int8_fp32 belongs to the runtimes that read it \(onnxruntime-int8\)"):
        ExportConfig(runtime="onnxruntime", int8_fp32=("ffn",))
    with pytest.raises(ValueError, match="not an int8 runtime"):
        ExportConfig(runtime="openvino", smooth_alpha=0.5)
    with pytest.raises(ValueError, match=r"format sentence-transformers writes an artefact .*torch-bf16. has none"):
        ExportConfig(runtime="torch-bf16", format="sentence-transformers")
    with pytest.raises(ValueError, match="frozen"):
        ExportConfig().runtime = "openvino"  # type: ignore[misc]


def test_export_config_drives_the_python_api_for_any_runtime(tmp_path) -> None:
    from surgery.runtimes.export_config import export

    spec = TinySpec("bert")
    model = tiny_model(spec)
    artefact = export(model, tmp_path / "t", ExportConfig(runtime="torch"))
    assert artefact.directory == (tmp_path / "t").resolve() and "model.safetensors" in artefact.files
    reloaded = surgery.from_pretrained(tmp_path / "t")
    torch.testing.assert_close(main_output(reloaded, tiny_inputs(spec)), main_output(model, tiny_inputs(spec)))
    with pytest.raises(ConfigError, match="does not use them"):
        export(model, tmp_path / "u", ExportConfig(runtime="torch"), calibration=[tiny_inputs(spec)])
    assert not (tmp_path / "u").exists()


@pytest.mark.parametrize("command", [["export", "minilm-l6", "--out", "/tmp/never-written-rt", "--int8"],
                                     ["bench", "minilm-l6", "--int8"]])
def test_old_int8_spelling_is_refused_naming_the_new_one(command) -> None:
    line = one_line_error(CliRunner().invoke(app, command))
    assert "--runtime onnxruntime-int8" in line and "--int8 is replaced" in line


def test_cli_refuses_unavailable_unknown_and_misplaced_runtime_settings(tmp_path) -> None:
    saved = surgery.save_pretrained(tiny_model(TinySpec("bert")), tmp_path / "m")
    runner = CliRunner()
    out = ["--out", str(tmp_path / "o")]
    if not torch.cuda.is_available():
        assert "needs a CUDA device" in one_line_error(runner.invoke(app, ["export", str(saved), *out, "--runtime",
                                                                         "torch-fp16"]))
    assert "is not one of torch" in one_line_error(runner.invoke(app, ["export", str(saved), *out, "--runtime",
                                                                     "tensorrt"]))
    assert "opset belongs" in one_line_error(runner.invoke(app, ["export", str(saved), *out, "--runtime", "openvino",
                                                               "--opset", "17"]))
    assert "--calibration FILE" in one_line_error(runner.invoke(app, ["export", str(saved), *out, "--runtime",
                                                                    "openvino-int8"]))
    assert "is not one of torch" in one_line_error(runner.invoke(app, ["bench", str(saved), "--runtime", "tensorrt"]))
    assert not (tmp_path / "o").exists()
    listed = runner.invoke(app, ["export", str(saved), *out, "--runtime", "list"])
    assert listed.exit_code == 0 and all(name in listed.stdout for name in BUILTINS)


# -- the Runtime answers for itself; nothing outside surgery/runtimes tests a runtime's name ---------------------
def test_every_builtin_answers_for_itself() -> None:
    answers = {name: (get_runtime(name, require_available=False).precision, runtime_class(name).as_is,
                      get_runtime(name, require_available=False).folder,
                      get_runtime(name, require_available=False).int8, runtime_class(name).sentence_backend)
               for name in BUILTINS}
    assert answers == {
        "torch": ("fp32", True, "torch", False, None),
        "torch-bf16": ("bf16", False, "torch-bf16", False, None),
        "torch-fp16": ("fp16", False, "torch-fp16", False, None),
        "onnxruntime": ("fp32", False, "onnx", False, "onnx"),
        "onnxruntime-int8": ("int8", False, "onnx", True, "onnx"),
        "openvino": ("fp32", False, "openvino", False, "openvino"),
        "openvino-bf16": ("bf16", False, "openvino", False, "openvino"),
        "openvino-int8": ("int8", False, "openvino", True, "openvino"),
    }
    key = get_runtime("openvino-int8", require_available=False).cache_key()
    assert set(key["versions"]) == {"openvino", "nncf", "encoder-surgery"} and key["graph_format"] is None
    assert get_runtime("onnxruntime", require_available=False).cache_key()["graph_format"] is not None
    assert get_runtime("torch").runs_on("cuda") and not get_runtime("openvino", require_available=False).runs_on("cuda")


def test_runtime_classes_are_read_without_importing_torch() -> None:
    # ExportConfig validates a flag against the runtime's class before any heavy import (the CLI's promise).
    probe = ("import sys\nfrom surgery.runtimes import runtime_class\nfrom surgery.runtimes.export_config import "
             f"ExportConfig\n[runtime_class(n).precision for n in {BUILTINS!r}]\ntry:\n    ExportConfig(runtime="
             "'openvino', opset=17)\nexcept ValueError:\n    pass\nprint('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


#: Comparisons of a value with a runtime's name: what the registry's objects answer instead.
_NAMES = "|".join(BUILTINS)
NAME_TESTS = re.compile(
    rf'(==|!=)\s*"(?:{_NAMES})"|"(?:{_NAMES})"\s*(==|!=)|(startswith|endswith)\("(torch|onnx|onnxruntime|openvino|'
    r'-int8|-bf16|-fp16)"\)|"(bf16|fp16|int8|-int8)"\s+in\s+\w*runtime|runtime\w*\s+(not\s+)?in\s+\(|ONNX_RUNTIMES|'
    r'OPENVINO_RUNTIMES|_RUNTIME_PACKAGES|ARTEFACT_DIRS|runtime_cache_key')


def test_no_runtime_name_is_compared_as_a_string_outside_the_runtimes_package() -> None:
    root = Path(__file__).resolve().parents[1]
    found = [f"{path.relative_to(root)}:{number}: {line.strip()}"
             for folder in ("surgery", "cli", "strategies") for path in sorted((root / folder).rglob("*.py"))
             if "runtimes" not in path.relative_to(root / folder).parts[:1]
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if NAME_TESTS.search(line) and not line.lstrip().startswith((">>>", "#", "..."))]
    assert found == []
    # The pattern finds what it is meant to find (so an empty result means something).
    assert NAME_TESTS.search('if runtime == "torch":') and NAME_TESTS.search('name.endswith("-int8")')
    assert NAME_TESTS.search('"bf16" in runtime') and not NAME_TESTS.search('method.startswith("torch.profiler")')


class AcmeQuantRuntime(TorchRuntime):
    """A third party's int8 runtime whose name says nothing of it: it declares float fallback and its own refit."""

    name = "acme-quant"
    precision = "int8"
    as_is = False
    float_fallback = True

    def __init__(self) -> None:
        self.copies: list[list[str]] = []

    def with_float_groups(self, served_dir, model, groups, out_dir):
        import shutil

        self.copies.append(list(groups))
        shutil.copytree(served_dir, out_dir)
        return out_dir

    def int8_refit(self, model, teacher, batches, *, calibration, threads=None):
        return ["0:down"]


@pytest.mark.slow
def test_the_precision_pass_follows_the_runtimes_float_fallback_not_its_name(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from surgery.compress.latency_measure import measure_fallback_costs
    from surgery.compress.precision import fallback_gains, precision_build, task_loss
    from surgery.core.manifest import int8_float_of
    from surgery.runtimes.shared.weight_products import precision_groups

    spec = TinySpec("bert", task="seq-cls")
    model = tiny_model(spec).eval()
    batches = [{**tiny_inputs(spec), "labels": torch.tensor([0, 1, 2])}]
    acme = AcmeQuantRuntime()
    served = acme.write_artefact(model, tmp_path / "served").directory
    # Gains and costs are measured on the third party's own copies with groups in float, loaded by its own load().
    gains = fallback_gains(served, model, task_loss(batches), runtime=acme, threads=1)
    assert sorted(gains) == sorted(precision_groups(model)) == sorted(g for [g] in acme.copies)
    assert all(abs(gain) < 1e-6 for gain in gains.values())  # its copies are the same model: nothing gained
    costs = measure_fallback_costs(served, model, runtime=acme, batch_size=2, seq_len=8, threads=1, repeats=2)
    assert costs.runtime == "acme-quant" and {"attention", "ffn-up", "ffn-down", "classifier"} <= set(costs.per_unit_ms)
    # A candidate of the pass is refit by the runtime's own int8 refit; a runtime without one is not refit.
    judge = SimpleNamespace(runtime=acme, original=model, calibration=batches, smoothing=[], threads=1)
    assert precision_build(model, judge, ["layer.0.ffn-down"])[1] == "quantization-aware refit: 0:down"
    assert int8_float_of(model) == ["layer.0.ffn-down"]
    assert precision_build(model, SimpleNamespace(**{**vars(judge), "runtime": TorchRuntime()}),
                           ["layer.0.ffn-down"]) == ["precision map: layer.0.ffn-down in float"]
    # A runtime that does not declare it is refused in one line, whatever its name.
    lookalike = type("Lookalike", (TorchRuntime,), {"name": "openvino-int8-like", "precision": "int8"})()
    assert not lookalike.float_fallback and get_runtime("openvino-int8", require_available=False).float_fallback
    with pytest.raises(ConfigError, match="'openvino-int8-like' keeps no op groups in float"):
        fallback_gains(served, model, task_loss(batches), runtime=lookalike, threads=1)


def test_openvino_bf16_is_refused_in_one_line_without_the_cpu_flag(monkeypatch) -> None:
    pytest.importorskip("openvino")
    from surgery.measure import machine

    bare = machine.machine_info().model_copy(update={"flags": ["avx2", "avx512f"]})
    monkeypatch.setattr(machine, "machine_info", lambda: bare)
    reason = available_runtimes()["openvino-bf16"]
    assert reason is not None and "avx512_bf16 or amx_bf16" in reason and "--runtime openvino" in reason
    line = one_line_error(CliRunner().invoke(app, ["export", "minilm-l6", "--out", "/tmp/never-written-rt",
                                                   "--runtime", "openvino-bf16"]))
    assert "runtime 'openvino-bf16' is not available here" in line and not Path("/tmp/never-written-rt").exists()
    monkeypatch.setattr(machine, "machine_info", lambda: bare.model_copy(update={"flags": ["amx_bf16"]}))
    assert available_runtimes()["openvino-bf16"] is None


def test_auto_reads_precision_from_the_runtime() -> None:
    from surgery.compress.auto_runtime import plan_runtimes, precision
    from surgery.compress.config import CompressConfig

    assert [precision(n) for n in ("openvino-bf16", "torch-bf16", "openvino", "openvino-int8")] == [
        "bf16", "bf16", "fp32", "int8"]
    rows = plan_runtimes({"torch": 1.0, "openvino": 1.1, "openvino-bf16": 3.8, "torch-bf16": 2.9}, {},
                         CompressConfig(speedup=3.5, runtime="auto", max_cut=4))
    searched = {r["runtime"]: (r["searched"], r.get("unchanged_only")) for r in rows}
    # bf16 is not fp32: not folded into the fastest fp32 runtime; openvino-bf16 meets 3.5x unchanged.
    assert searched["openvino-bf16"] == (True, True) and searched["torch-bf16"][0] and not searched["torch"][0]


# -- issue 35: the registry against hostile or broken plugins -------------------------------------------------
def plugin_site(tmp_path: Path, dist: str, entries: dict[str, str], module: str = "", name: str = "plugin_rt"
                ) -> Path:
    """An installed-looking distribution ``dist`` with runtime entry points, its module ``name`` holding ``module``."""
    site = tmp_path / dist
    site.mkdir()
    (site / f"{name}.py").write_text(module)
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "top_level.txt").write_text(f"{name}\n")
    (info / "entry_points.txt").write_text("[surgery.runtimes]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))
    return site


RAISING = '''
from surgery.runtimes.torch.torch_runtime import TorchRuntime


class Raising(TorchRuntime):
    """A runtime whose availability check has a bug."""

    name = "raising-rt"

    def unavailable(self):
        raise RuntimeError("driver probe crashed")


class Escaping(TorchRuntime):
    name = "../../esc"


class Impostor(TorchRuntime):
    """Claims a built-in name."""

    name = "onnxruntime"
'''


def test_a_plugin_cannot_crash_the_listing_take_a_builtin_name_or_escape(tmp_path, monkeypatch) -> None:
    site = plugin_site(tmp_path, "surgery-hostile", {"raising-rt": "plugin_rt:Raising",
                                                     "../../esc": "plugin_rt:Escaping",
                                                     "onnxruntime": "plugin_rt:Impostor"}, RAISING)
    monkeypatch.syspath_prepend(str(site))
    found = available_runtimes()
    assert found["raising-rt"] == "its availability check failed: RuntimeError: driver probe crashed"
    assert "../../esc" not in runtime_names()
    assert runtime_class("onnxruntime").__module__ == "surgery.runtimes.onnx.onnx_runtime"
    with pytest.raises(ConfigError, match="availability check failed"):
        get_runtime("raising-rt")
    listed = CliRunner().invoke(app, ["export", "--runtime", "list"], env={"COLUMNS": "400"})  # no model needed;
    # wide, so that rich does not wrap a cell's words into its neighbours' when the joined text is read
    assert listed.exit_code == 0, listed.output
    text = " ".join(listed.stdout.split())
    assert "raising-rt" in text and "driver probe crashed" in text
    assert "package surgery-hostile registers runtime 'onnxruntime', a built-in name" in text
    assert "invalid runtime name '../../esc'" in text
    with pytest.raises(ConfigError, match="is not one of"):
        get_runtime("../../esc")


def test_export_without_a_model_is_one_line() -> None:
    line = one_line_error(CliRunner().invoke(app, ["export", "--out", "/tmp/never-written-rt"]))
    assert "give the model and --out" in line and "--runtime list" in line


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0"])
def test_tolerance_must_be_finite_and_positive_in_the_cli_and_the_config(value) -> None:
    line = one_line_error(CliRunner().invoke(app, ["export", "minilm-l6", "--out", "/tmp/never-written-rt",
                                                   "--tolerance", value]))
    assert line.startswith("error: --tolerance must be a finite positive number"), line
    with pytest.raises(ValueError, match="--tolerance must be a finite positive number"):
        ExportConfig(tolerance=float(value))
    from surgery.runtimes.shared.graph_export import check_export_settings

    with pytest.raises(ConfigError, match="export: tolerance must be a finite positive number"):
        check_export_settings(4, 8, float(value))


def test_export_config_bounds_are_the_clis(tmp_path) -> None:
    from surgery.persist.config_values import MAX_BATCH
    from surgery.runtimes.export_config import export

    with pytest.raises(ValueError, match="less than or equal to 65536"):
        ExportConfig(batch=10**9, seq=10**9)
    assert ExportConfig(batch=MAX_BATCH).batch == MAX_BATCH
    cli = one_line_error(CliRunner().invoke(app, ["export", "minilm-l6", "--out", "/tmp/never-written-rt", "--batch",
                                                  str(MAX_BATCH + 1)]))
    assert str(MAX_BATCH) in cli
    # seq is bounded by the model, in the API as in the CLI: refused before anything is written.
    model = tiny_model(TinySpec("bert"))
    with pytest.raises(ConfigError, match=r"seq 100000 exceeds the \d+ positions the model supports"):
        export(model, tmp_path / "o", ExportConfig(runtime="torch", seq=100_000))
    assert not (tmp_path / "o").exists()


def test_compress_config_bounds_are_the_clis() -> None:
    from surgery.compress.config import CompressConfig

    with pytest.raises(ValueError, match="less than or equal to 100"):
        CompressConfig(max_drop=200)  # the CLI: --max-drop must be between 0 and 100
    with pytest.raises(ValueError, match="less than or equal to 65536"):
        CompressConfig(speedup=2, batch_size=10**9)


def test_the_old_deploy_paths_still_import_and_warn_naming_the_new_one(monkeypatch) -> None:
    # surgery.deploy was documented as public: for one release every old import reads the new module and warns.
    from surgery.runtimes.onnx import onnx_export
    from surgery.runtimes.shared import graph_export, smooth

    monkeypatch.delitem(sys.modules, "surgery.deploy.smooth", raising=False)
    monkeypatch.delitem(sys.modules, "surgery.deploy.export", raising=False)
    with pytest.warns(DeprecationWarning, match=r"surgery\.deploy\.smooth moved to surgery\.runtimes\.shared\.smooth"):
        from surgery.deploy.smooth import text_calibration_batches
    assert text_calibration_batches is smooth.text_calibration_batches
    with pytest.warns(DeprecationWarning, match=r"surgery\.runtimes\.onnx\.onnx_export"):
        from surgery.deploy.export import agreement, export_onnx  # agreement now lives in shared.graph_export
    assert (export_onnx, agreement) == (onnx_export.export_onnx, graph_export.agreement)
    import surgery.deploy

    monkeypatch.delitem(vars(surgery.deploy), "MissingDependencyError", raising=False)
    with pytest.warns(DeprecationWarning, match=r"deploy\.MissingDependencyError moved to surgery\.runtimes\.onnx"):
        assert surgery.deploy.MissingDependencyError is MissingDependencyError
    with pytest.raises(AttributeError), pytest.warns(DeprecationWarning):
        surgery.deploy.no_such_name  # noqa: B018
    with pytest.raises(ImportError):
        import surgery.deploy.no_such_module
