"""A third-party strategy and command registered only through entry points: API, CLI, save/reload, plugin control.

``tests/plugin_pkg`` is a complete package (``surgery-ffn-align``). The tests install it without
network or a build step, the way pip lays out an installed package: the module plus a
``*.dist-info`` directory whose ``entry_points.txt`` is generated from the package's own
``pyproject.toml``, in a temporary directory put on ``sys.path`` (and ``PYTHONPATH`` for
subprocesses). ``importlib.metadata`` then finds it like any installed distribution.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import surgery
from surgery.cli.app import app
from surgery.core import registry
from surgery.testing import TinySpec, main_output, tiny_inputs, tiny_model

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

PLUGIN_PKG = Path(__file__).parent / "plugin_pkg"
GUIDE = Path(__file__).parent.parent / "docs" / "writing-a-strategy.md"
PLUGIN_DIST = "surgery-ffn-align"
PLUGIN_NAME = "ffn-align"
BROKEN_DIST = "surgery-broken-plugin"
BROKEN_NAME = "broken-strategy"


def install_like_pip(site: Path, project: dict, modules: dict[str, Path]) -> None:
    """Lay out an installed distribution in ``site``: its modules and a ``*.dist-info`` with entry points."""
    for name, source in modules.items():
        if source.is_dir():
            shutil.copytree(source, site / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, site / f"{name}.py")
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = []
    for group, entries in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines.extend(f"{name} = {target}" for name, target in entries.items())
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    project = tomllib.loads((PLUGIN_PKG / "pyproject.toml").read_text())["project"]
    install_like_pip(site, project, {"surgery_ffn_align": PLUGIN_PKG / "surgery_ffn_align",
                                     "surgery_ffn_align_cli": PLUGIN_PKG / "surgery_ffn_align_cli.py"})
    return site


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("broken")
    module = site / "src" / "broken_surgery_plugin.py"
    module.parent.mkdir()
    module.write_text("raise ImportError('broken_surgery_plugin needs the package missing-dependency')\n")
    project = {"name": BROKEN_DIST, "version": "0.0.1",
               "entry-points": {"surgery.strategies": {BROKEN_NAME: "broken_surgery_plugin:BrokenStrategy"}}}
    install_like_pip(site, project, {"broken_surgery_plugin": module})
    return site


def _use_sites(monkeypatch: pytest.MonkeyPatch, *sites: Path) -> None:
    for site in sites:
        monkeypatch.syspath_prepend(str(site))
    paths = [str(s) for s in sites] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    monkeypatch.delenv("SURGERY_PLUGINS", raising=False)
    registry.refresh()


@pytest.fixture
def installed(plugin_site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The plugin is installed for this test only."""
    _use_sites(monkeypatch, plugin_site)
    yield plugin_site
    registry.refresh()
    for name in [m for m in sys.modules if m.startswith(("surgery_ffn_align", "broken_surgery_plugin"))]:
        del sys.modules[name]


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return surgery.save_pretrained(tiny_model(TinySpec("bert", ffn=37, task="seq-cls")), tmp_path / "model")


def test_not_registered_until_installed() -> None:
    registry.refresh()
    assert PLUGIN_NAME not in registry.methods()
    with pytest.raises(surgery.StrategyNotFoundError, match=PLUGIN_NAME):
        registry.get_method(PLUGIN_NAME)


def test_discovered_through_entry_point(installed: Path) -> None:
    info = registry.methods()[PLUGIN_NAME]
    assert info.source == PLUGIN_DIST
    assert info.summary.startswith("Round every FFN width down")
    cls = registry.get_method(PLUGIN_NAME)
    assert Path(sys.modules[cls.__module__].__file__).is_relative_to(installed)
    assert "head-prune" in registry.methods()  # built-ins load through the same path


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_api_convert_equals_masking_and_survives_reload(installed: Path, tmp_path: Path, family: str) -> None:
    spec = TinySpec(family, ffn=37, task="seq-cls")
    model, reference = tiny_model(spec), tiny_model(spec)
    strategy = registry.get_method(PLUGIN_NAME)({"multiple": 8})
    report = surgery.convert(model, strategy)
    assert [(c.layer, c.before, c.after) for c in report.changes] == [(0, 37, 32), (1, 37, 32)]
    assert [layer.ffn_width for layer in surgery.inspect(model).layers] == [32, 32]
    # Removing neurons equals silencing them: zero their down-projection columns in the unpruned twin.
    adapter = surgery.adapter_for(reference)
    with torch.no_grad():
        for key, neurons in report.plan["neurons"].items():
            adapter.layer(int(key)).ffn.down.weight[:, neurons] = 0
    inputs = tiny_inputs(spec)
    with torch.no_grad():
        torch.testing.assert_close(main_output(model, inputs), main_output(reference, inputs), atol=1e-5, rtol=0)

    out = surgery.save_pretrained(model, tmp_path / "aligned")
    manifest = json.loads((out / "surgery.json").read_text())
    assert [s["strategy"] for s in manifest["steps"]] == [PLUGIN_NAME]
    reloaded = surgery.from_pretrained(out)  # replays ffn-align's apply() through the registry
    assert [layer.ffn_width for layer in surgery.inspect(reloaded).layers] == [32, 32]
    with torch.no_grad():
        torch.testing.assert_close(main_output(reloaded, inputs), main_output(model, inputs), atol=0, rtol=0)


def _surgery_command() -> list[str]:
    script = Path(sys.executable).with_name("surgery")
    return [str(script)] if script.exists() else [sys.executable, "-m", "surgery.cli"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_cli_subprocess_apply_and_reload(installed: Path, model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "aligned"
    env = {**os.environ, "PYTHONPATH": os.environ["PYTHONPATH"], "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*_surgery_command(), "apply", "--strategy", PLUGIN_NAME, str(model_dir), "--out", str(out),
         "--set", "multiple=16"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "aligned to 16" in result.stdout
    reloaded = surgery.from_pretrained(out)
    assert [layer.ffn_width for layer in surgery.inspect(reloaded).layers] == [32, 32]
    assert [s.strategy for s in surgery.inspect(reloaded).steps] == [PLUGIN_NAME]


def test_cli_runner_lists_dry_runs_and_validates(installed: Path, model_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(app, ["strategies", "--json"])
    assert listed.exit_code == 0
    assert {"name": PLUGIN_NAME, "package": PLUGIN_DIST} in [
        {k: row[k] for k in ("name", "package")} for row in json.loads(listed.stdout)]

    dry = runner.invoke(app, ["apply", "-s", PLUGIN_NAME, str(model_dir), "--set", "multiple=8", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    step = json.loads(dry.stdout)
    assert step["strategy"] == PLUGIN_NAME and sorted(step["plan"]["neurons"]) == ["0", "1"]
    assert all(len(v) == 37 % 8 for v in step["plan"]["neurons"].values())

    bad = runner.invoke(app, ["apply", "-s", PLUGIN_NAME, str(model_dir), "--set", "multiple=0", "--out",
                              str(tmp_path / "x")])
    assert bad.exit_code == 2
    assert bad.stderr.strip().splitlines() == [
        "error: invalid config for strategy 'ffn-align': multiple: Input should be greater than or equal to 1 (got 0)"]


def _run_surgery(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": os.environ["PYTHONPATH"], "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([*_surgery_command(), *args], capture_output=True, text=True, env=full_env, timeout=300)


# What `surgery --help` imported: the commands of every plugin are loaded, so they must stay light.
HELP_PROBE = """
import sys
from typer.testing import CliRunner
from surgery.cli.app import app
result = CliRunner().invoke(app, ["--help"])
heavy = sorted(m for m in ("torch", "transformers", "datasets", "surgery_ffn_align") if m in sys.modules)
print(result.exit_code, "ffn-align-check" in result.stdout, "experts" in result.stdout, heavy)
"""


@pytest.mark.slow
@pytest.mark.multiprocess
def test_plugin_command_is_listed_lazily_and_runs(installed: Path, model_dir: Path) -> None:
    probe = subprocess.run([sys.executable, "-c", HELP_PROBE], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": os.environ["PYTHONPATH"]})
    assert probe.stdout.strip().splitlines()[-1] == "0 True True []", (probe.stdout, probe.stderr)

    ran = _run_surgery(["ffn-align-check", str(model_dir), "--multiple", "16"])
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["layer 0: FFN width 37 -> 32", "layer 1: FFN width 37 -> 32"]
    bad = _run_surgery(["ffn-align-check", str(model_dir.parent / "missing")])
    assert bad.returncode == 2 and bad.stderr.startswith("error: model directory") and "Traceback" not in bad.stderr

    only_builtins = _run_surgery(["--help"], SURGERY_PLUGINS="")  # surgery's own commands load regardless
    assert "ffn-align-check" not in only_builtins.stdout and "experts" in only_builtins.stdout


@pytest.fixture(scope="module")
def broken_commands_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three command plugins that each fail differently: on import, while registering, and on a taken name."""
    site = tmp_path_factory.mktemp("broken_commands")
    src = site / "src"
    src.mkdir()
    (src / "cmd_import.py").write_text("raise ImportError('cmd_import needs the package missing-dependency')\n")
    (src / "cmd_register.py").write_text("def register(app):\n    raise RuntimeError('no app of mine')\n")
    (src / "cmd_clash.py").write_text("def register(app):\n    app.command('apply')(lambda: None)\n")
    entries = {"bad-import": "cmd_import:register", "bad-register": "cmd_register:register",
               "bad-clash": "cmd_clash:register"}
    project = {"name": "surgery-broken-commands", "version": "0.0.1", "entry-points": {"surgery.commands": entries}}
    install_like_pip(site, project, {name: src / f"{name}.py" for name in ("cmd_import", "cmd_register", "cmd_clash")})
    return site


def test_broken_plugin_commands_warn_in_one_line_and_are_skipped(
        plugin_site: Path, broken_commands_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _use_sites(monkeypatch, plugin_site, broken_commands_site)
    try:
        result = _run_surgery(["--help"])
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
        warned = result.stderr.strip().splitlines()
        assert len(warned) == 3 and all(line.startswith("warning: surgery") for line in warned), warned
        for name, why in (("bad-import", "missing-dependency"), ("bad-register", "no app of mine"),
                          ("bad-clash", "'apply' is already used")):
            assert any(f"'{name}'" in line and why in line for line in warned), (name, warned)
        assert "ffn-align-check" in result.stdout and "experts" in result.stdout
        applied = _run_surgery(["apply", "--help"])  # `apply` is still surgery's own
        assert applied.returncode == 0 and "--strategy" in applied.stdout
    finally:
        registry.refresh()


def test_broken_plugin_warns_and_is_skipped(plugin_site: Path, broken_site: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _use_sites(monkeypatch, plugin_site, broken_site)
    try:
        with pytest.warns(RuntimeWarning, match=f"{BROKEN_NAME}.*{BROKEN_DIST}.*failed to import"):
            names = registry.methods()
        assert PLUGIN_NAME in names and "head-prune" in names and BROKEN_NAME not in names

        registry.refresh()
        result = CliRunner().invoke(app, ["strategies"])
        assert result.exit_code == 0
        warned = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
        assert len(warned) == 1 and BROKEN_NAME in warned[0] and "missing-dependency" in warned[0]
        assert PLUGIN_NAME in result.stdout
    finally:
        registry.refresh()
        sys.modules.pop("surgery_ffn_align", None)


def test_surgery_plugins_restricts_third_party(plugin_site: Path, broken_site: Path, model_dir: Path,
                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _use_sites(monkeypatch, plugin_site, broken_site)
    try:
        saved = tmp_path / "aligned"
        model = surgery.from_pretrained(model_dir)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the broken plugin, tested above
            surgery.convert(model, registry.get_method(PLUGIN_NAME)(multiple=8))
        surgery.save_pretrained(model, saved)

        monkeypatch.setenv("SURGERY_PLUGINS", "")  # built-ins only
        registry.refresh()
        names = registry.methods()
        assert "head-prune" in names and PLUGIN_NAME not in names
        with pytest.raises(surgery.ModelLoadError, match=f"strategy '{PLUGIN_NAME}', which is not installed"):
            surgery.from_pretrained(saved)
        result = CliRunner().invoke(app, ["apply", "-s", PLUGIN_NAME, str(model_dir), "--dry-run"])
        assert result.exit_code == 2 and result.stderr.startswith(f"error: unknown strategy '{PLUGIN_NAME}'")

        monkeypatch.setenv("SURGERY_PLUGINS", PLUGIN_DIST)  # this one only: the broken one is not even imported
        registry.refresh()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            names = registry.methods()
        assert PLUGIN_NAME in names and not [w for w in caught if BROKEN_NAME in str(w.message)]
        assert [layer.ffn_width for layer in surgery.inspect(surgery.from_pretrained(saved)).layers] == [32, 32]
    finally:
        registry.refresh()
        sys.modules.pop("surgery_ffn_align", None)


def test_plugin_package_own_tests_pass(installed: Path, tmp_path: Path) -> None:
    """The package's own tests (shown in docs/writing-a-strategy.md) pass once it is installed."""
    spec = importlib.util.spec_from_file_location("surgery_ffn_align_own_tests",
                                                  PLUGIN_PKG / "tests" / "test_ffn_align.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tests = {name: fn for name, fn in vars(module).items() if name.startswith("test_") and callable(fn)}
    assert len(tests) == 5
    for name, test in tests.items():
        if "tmp_path" in inspect.signature(test).parameters:
            test(tmp_path=tmp_path / name)
        else:
            test()  # hypothesis draws the examples itself


def test_guide_shows_the_package_verbatim() -> None:
    """Every file docs/writing-a-strategy.md shows is the real file of tests/plugin_pkg, so the guide cannot rot."""
    shown = re.findall(r"<!-- file: (\S+) -->\n```[a-z]*\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert {name for name, _ in shown} >= {"pyproject.toml", "surgery_ffn_align/__init__.py",
                                           "tests/test_ffn_align.py"}
    for name, text in shown:
        assert text == (PLUGIN_PKG / name).read_text(), f"docs/writing-a-strategy.md is out of date for {name}"


# -- a third party's runtime, registered only through an entry point, gets what a built-in gets ------------------
RUNTIME_DIST = "surgery-copy-runtime"
RUNTIME_MODULE = '''
"""A third party's runtimes: the model's artefact is its safetensors (one fp32, one 'int8')."""
from surgery.runtimes.torch.torch_runtime import TorchRuntime


class CopyRuntime(TorchRuntime):
    """The model written to safetensors and loaded from the files (a stand-in for a real engine)."""

    name = "copy-rt"
    description = "fp32 safetensors, served from the files"
    as_is = False


class CopyInt8Runtime(CopyRuntime):
    """Says it is int8 and calibrates, as a quantizing engine would."""

    name = "copy-rt-int8"
    precision = "int8"
    needs_calibration = True
'''


def install_runtime_plugin(site: Path, version: str) -> None:
    """The runtime plugin laid out as pip would (its dist-info names the module it ships: version-keyed caches)."""
    (site / "copy_runtime.py").write_text(RUNTIME_MODULE)
    for old in site.glob("surgery_copy_runtime-*.dist-info"):
        shutil.rmtree(old)
    info = site / f"surgery_copy_runtime-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {RUNTIME_DIST}\nVersion: {version}\n")
    (info / "top_level.txt").write_text("copy_runtime\n")
    (info / "entry_points.txt").write_text("[surgery.runtimes]\ncopy-rt = copy_runtime:CopyRuntime\n"
                                           "copy-rt-int8 = copy_runtime:CopyInt8Runtime\n")


@pytest.fixture
def runtime_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    site = tmp_path / "runtime-site"
    site.mkdir()
    install_runtime_plugin(site, "0.1")
    _use_sites(monkeypatch, site)
    yield site
    sys.modules.pop("copy_runtime", None)


@pytest.mark.slow
def test_a_plugin_runtime_gets_data_accuracy_and_int8_detection(runtime_plugin: Path, tmp_path: Path) -> None:
    from surgery.compress.auto_runtime import plan_runtimes, precision
    from surgery.compress.config import CompressConfig
    from surgery.core.errors import ConfigError
    from surgery.runtimes import available_runtimes, get_runtime
    from surgery.runtimes.export_config import ExportConfig, export

    assert available_runtimes()["copy-rt"] is None and available_runtimes()["copy-rt-int8"] is None
    spec = TinySpec("bert", task="seq-cls")
    model = tiny_model(spec)
    labelled = [{**tiny_inputs(spec), "labels": torch.tensor([0, 1, 2])}]
    with torch.no_grad():
        expected = float((model(**tiny_inputs(spec)).logits.argmax(-1) == labelled[0]["labels"]).float().mean())
    # --data accuracy: PyTorch's and the artefact's, the artefact loaded by the plugin's own load().
    artefact = export(model, tmp_path / "out", ExportConfig(runtime="copy-rt"), data=labelled)
    assert artefact.info["accuracy_torch"] == pytest.approx(expected)
    assert artefact.info["accuracy"] == pytest.approx(expected)
    assert "model.safetensors" in artefact.files and artefact.directory == (tmp_path / "out").resolve()
    # int8 is what the runtime says, not its name: calibration required, smoothing allowed, auto groups it as int8.
    assert get_runtime("copy-rt-int8").int8 and precision("copy-rt-int8") == "int8"
    assert ExportConfig(runtime="copy-rt-int8", smooth_alpha=0.5).smooth_alpha == 0.5
    with pytest.raises(ValueError, match="not an int8 runtime"):
        ExportConfig(runtime="copy-rt", smooth_alpha=0.5)
    with pytest.raises(ConfigError, match="--calibration FILE"):
        export(model, tmp_path / "int8", ExportConfig(runtime="copy-rt-int8"))
    rows = {r["runtime"]: r for r in plan_runtimes({"torch": 1.0, "copy-rt": 1.5, "copy-rt-int8": 1.2}, {},
                                                     CompressConfig(speedup=1.1, runtime="auto"))}
    assert rows["copy-rt-int8"]["precision"] == "int8" and rows["copy-rt-int8"]["searched"]
    assert rows["copy-rt"]["precision"] == "fp32" and not rows["torch"]["searched"]  # the faster fp32 is searched
    assert get_runtime("copy-rt").folder == "copy-rt"


@pytest.mark.slow
def test_a_plugin_runtimes_timings_are_cached_and_keyed_on_its_version(runtime_plugin: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import surgery.compress.latency_measure as latency_measure
    from surgery.compress.latency_measure import measure_latency_table
    from surgery.runtimes import get_runtime

    assert get_runtime("copy-rt").cache_key()["versions"] == {RUNTIME_DIST: "0.1"}
    # A hit is checked against the model's own time elsewhere (tests/test_flags_and_cache.py); not the point here.
    monkeypatch.setattr(latency_measure, "cache_disagreement", lambda *args, **kwargs: None)
    # Nor is the grid (tests/test_latency.py): heads none or all and the FFN whole, each probe still written and
    # served by the plugin, and timed in units of the usual length so that the table is worth keeping under load.
    monkeypatch.setattr(latency_measure, "HEAD_FRACTIONS", (0.0, 1.0))
    monkeypatch.setattr(latency_measure, "WIDTH_FRACTIONS", (1.0,))
    model = tiny_model(TinySpec("bert", layers=2))
    settings = {"runtime": "copy-rt", "batch_size": 2, "seq_len": 8, "threads": 1, "repeats": 3, "cache": True,
                "cache_dir": tmp_path / "cache"}
    assert not measure_latency_table(model, **settings).measured["cached"]
    assert measure_latency_table(model, **settings).measured["cached"]
    install_runtime_plugin(runtime_plugin, "0.2")  # a new release of the engine: its old timings say nothing
    assert get_runtime("copy-rt").cache_key()["versions"] == {RUNTIME_DIST: "0.2"}
    assert not measure_latency_table(model, **settings).measured["cached"]
