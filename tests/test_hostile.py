"""Hostile and broken input through the API and real processes (issue 12).

The command-line table of bad inputs is in test_cli.py; here are the cases that need the Python API
(wrong types, opt-in pickles, concurrent saves inside one process), a real process (signals, two
writers at once, what a redirected run prints, which modules a fast answer imports) or many random
inputs (a fuzzed ``surgery.json``).
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from torch import nn

import surgery
from surgery.cli.render import ProgressDisplay
from surgery.core.errors import ConfigError, ModelLoadError, OutputPathError, PlanError, SurgeryError
from surgery.core.progress import ProgressEvent
from surgery.persist.atomic import atomic_directory
from surgery.strategies import HeadPruningStrategy
from surgery.testing import TinySpec, tiny_inputs, tiny_model

REPO = Path(__file__).resolve().parents[1]
EVIL = "import pathlib\npathlib.Path(__file__).with_name('PWNED').write_text('ran')\n"


def run_cli(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "surgery.cli", *args], capture_output=True, text=True,
                          timeout=300, **kwargs)  # type: ignore[call-overload]


def one_error_line(stderr: str) -> str:
    # `note:` lines are progress (e.g. which objective was chosen); the failure itself must be one line.
    lines = [line for line in stderr.strip().splitlines() if not line.startswith("note: ")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture(scope="module")
def pruned(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, Path]:
    model = tiny_model(TinySpec("bert"))
    surgery.convert(model, HeadPruningStrategy(heads={0: [1], 1: [0, 3]}))
    return model, surgery.save_pretrained(model, tmp_path_factory.mktemp("pruned") / "m")


# -- 1. no code from a model directory, 2. no pickles -----------------------------------------------
def test_custom_code_never_runs_and_a_known_type_ignores_its_auto_map(tmp_path: Path) -> None:
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "evil-net", "auto_map": {"AutoConfig": "evil.C"}}))
    (unknown / "evil.py").write_text(EVIL)
    with pytest.raises(ModelLoadError, match="asks to run Python code from the model directory"):
        surgery.from_pretrained(unknown)
    with pytest.raises(ModelLoadError, match="trust_remote_code=True is not supported"):
        surgery.from_pretrained(tmp_path.parent / tmp_path.name / "unknown", trust_remote_code=True)
    # A BERT whose config also carries an auto_map loads as transformers' own BertModel.
    known = tmp_path / "known"
    tiny_model(TinySpec("bert")).save_pretrained(known)
    config = json.loads((known / "config.json").read_text())
    (known / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "evil.EvilModel"}}))
    (known / "evil.py").write_text(EVIL)
    assert type(surgery.from_pretrained(known)).__name__ == "BertModel"
    assert not (unknown / "PWNED").exists() and not (known / "PWNED").exists()


def test_pickled_weights_load_only_with_the_opt_in_and_weights_only(tmp_path: Path) -> None:
    model = tiny_model(TinySpec("bert"))
    plain = tmp_path / "plain"
    model.config.save_pretrained(plain)
    torch.save(model.state_dict(), plain / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match=r"holds only pickled weights \(pytorch_model.bin\).*safetensors"):
        surgery.from_pretrained(plain)
    loaded = surgery.from_pretrained(plain, allow_pickle=True)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values(),
                                                  strict=True))

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {tmp_path / 'PWNED'}",))

    hostile = tmp_path / "hostile"
    model.config.save_pretrained(hostile)
    torch.save({"x": Evil()}, hostile / "pytorch_model.bin")
    with pytest.raises(ModelLoadError) as caught:
        surgery.from_pretrained(hostile, allow_pickle=True)  # even opted in: torch's weights-only loader refuses
    assert "\n" not in str(caught.value) and not (tmp_path / "PWNED").exists()


# -- 3. concurrent saves, 4. the input is never touched, 5. leftovers ------------------------------
def test_a_save_never_replaces_what_another_writer_finished(tmp_path: Path) -> None:
    model = tiny_model(TinySpec("bert"))
    out = tmp_path / "m"

    def second_writer_meanwhile(tmp: Path) -> None:
        # Through the API: the same process saves to the same path while this save is still writing.
        with pytest.raises(OutputPathError, match=r"is being written by process \d+"):
            surgery.save_pretrained(model, out)
        # A writer that takes no lock at all: it finishes first; this save must not replace its result.
        out.mkdir()
        (out / "theirs.txt").write_text("kept")

    with pytest.raises(OutputPathError, match="was created by someone else during the save; nothing was replaced"):
        surgery.save_pretrained(model, out, extra=second_writer_meanwhile)
    assert [p.name for p in out.iterdir()] == ["theirs.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary directory, no lock left


@pytest.mark.multiprocess
def test_stale_leftovers_of_a_killed_save_are_cleaned_and_a_live_lock_is_named(tmp_path: Path) -> None:
    out = tmp_path / "m"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    planted = tmp_path / f".m.tmp-{int(dead.stdout)}-deadbeef"  # the form surgery makes, but nothing says it is ours
    planted.mkdir()
    (planted / "model.safetensors").write_bytes(b"the user's")
    leftover = tmp_path / f".m.tmp-{int(dead.stdout)}-feedface"  # what a killed writer leaves: named by its lock
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"partial")
    (leftover / ".surgery-writing").write_text("feedface")  # the ownership record written when it was made
    (tmp_path / ".m.lock").write_text(f"{os.uname().nodename}:{int(dead.stdout)}:feedface")  # its process has exited
    with atomic_directory(out) as tmp:
        (tmp / "a").write_text("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == [planted.name, "m"]
    assert (planted / "model.safetensors").read_bytes() == b"the user's"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / ".n.lock").write_text(f"{os.uname().nodename}:{sleeper.pid}")
        with pytest.raises(OutputPathError, match=rf"being written by process {sleeper.pid} .*lock file"), \
                atomic_directory(tmp_path / "n"):
            pass
    finally:
        sleeper.kill()
        sleeper.wait()


def test_save_refuses_paths_inside_or_around_its_source(pruned: tuple[nn.Module, Path], tmp_path: Path) -> None:
    _, saved = pruned
    model = surgery.from_pretrained(saved)
    for target, message in ((saved / "sub", "is inside the input"), (saved.parent, "contains the input"),
                            (saved, "is the input model directory")):
        with pytest.raises(OutputPathError, match=message):
            surgery.save_pretrained(model, target, overwrite=True)
    link = tmp_path / "link"
    link.symlink_to(saved, target_is_directory=True)
    with pytest.raises(OutputPathError, match="is the input model directory"):
        surgery.save_pretrained(model, link, overwrite=True)
    assert sorted(p.name for p in saved.iterdir()) == [".surgery-manifest.json", "config.json", "model.safetensors",
                                                        "surgery.json"]


def _tiny_dir(root: Path) -> Path:
    tiny_model(TinySpec("bert")).save_pretrained(root / "bare")
    return root / "bare"


SLOW_SAVE = """
import sys, time
from pathlib import Path
import surgery.persist.model_io
from surgery.cli import main

real, ready = surgery.persist.model_io.save_model, Path(sys.argv[1])
def slow(model, filename, **kwargs):
    real(model, filename, **kwargs)
    Path(filename).with_name("model.safetensors").write_bytes(b"partial")  # half-written, as when killed
    ready.write_text("saving")
    time.sleep(120)
surgery.persist.model_io.save_model = slow
sys.argv = ["surgery", *sys.argv[2:]]
main()
"""


def _as_from_a_terminal() -> None:
    """A child started from a shell: SIGINT at its default. pytest-xdist's workers ignore SIGINT and their children
    inherit that, and the CLI rightly keeps an ignored SIGINT ignored (as under nohup), so Ctrl-C was never seen."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_writers_and_signals_in_real_processes(tmp_path: Path) -> None:
    """Two writers to one --out: one success, one clear error. SIGTERM/SIGINT in a save: cleanup, one line.

    All four processes run at once, as each pays seconds of imports on a shared machine.
    """
    bare, out = _tiny_dir(tmp_path), tmp_path / "o" / "m"
    writers = [subprocess.Popen([sys.executable, "-m", "surgery.cli", "apply", str(bare), "-s", "head-prune", "--set",
                                 f"ratio={ratio}", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for ratio in (0.25, 0.5)]
    killed = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        killed[signum] = subprocess.Popen(
            [sys.executable, "-c", SLOW_SAVE, str(tmp_path / f"ready-{signum}"), "apply", str(bare), "-s", "head-prune",
             "--set", "ratio=0.5", "--out", str(tmp_path / f"out-{signum}")], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, preexec_fn=_as_from_a_terminal)
    deadline = time.monotonic() + 240
    for signum, run in killed.items():
        while not (tmp_path / f"ready-{signum}").exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        run.send_signal(signum)
    for signum, run in killed.items():
        _, stderr = run.communicate(timeout=240)  # clean-up and interpreter exit share the CPU with 3 more
        assert run.returncode == {signal.SIGTERM: 143, signal.SIGINT: 130}[signum], stderr
        assert f"interrupted ({signal.Signals(signum).name})" in one_error_line(stderr)
    # No output, no temporary directory and no lock file of the interrupted saves.
    assert {p.name for p in tmp_path.iterdir()} == {"bare", "o", f"ready-{signal.SIGINT}", f"ready-{signal.SIGTERM}"}

    results = [(run.wait(timeout=300), *run.communicate()) for run in writers]
    assert sorted(code for code, _, _ in results) == [0, 2], results
    loser = one_error_line(next(err for code, _, err in results if code == 2))
    assert "exists and is not empty" in loser or "is being written by" in loser
    winner = next(stdout for code, stdout, _ in results if code == 0)
    assert f"saved to {out}" in " ".join(winner.split())
    assert len(surgery.from_pretrained(out).encoder.layer) == 2
    assert sorted(p.name for p in out.parent.iterdir()) == ["m"]


@pytest.mark.multiprocess
def test_no_traceback_for_ctrl_c_while_importing_or_while_exiting(tmp_path: Path) -> None:
    during_import = """
import importlib.abc, sys
class Interrupt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "typer":
            raise KeyboardInterrupt
sys.meta_path.insert(0, Interrupt())
sys.argv = ["surgery", "strategies"]
from surgery.cli import main
main()
"""
    result = subprocess.run([sys.executable, "-c", during_import], capture_output=True, text=True, timeout=120)
    assert result.returncode == 130 and "interrupted" in one_error_line(result.stderr)
    at_exit = """
import atexit, os, signal, sys, time
atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2)))  # Ctrl-C as Python shuts down
sys.argv = ["surgery", "strategies", "--json"]
from surgery.cli import main
main()
"""
    result = subprocess.run([sys.executable, "-c", at_exit], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr


# -- 6.-8. broken weights and manifests, 12. wrong types -------------------------------------------
def test_steps_removed_from_a_pruned_save_give_a_readable_shape_message(pruned: tuple[nn.Module, Path],
                                                                        tmp_path: Path) -> None:
    _, saved = pruned
    edited = tmp_path / "edited"
    shutil.copytree(saved, edited)
    manifest = json.loads((edited / "surgery.json").read_text())
    (edited / "surgery.json").write_text(json.dumps({**manifest, "steps": []}))
    with pytest.raises(ModelLoadError) as caught:
        surgery.from_pretrained(edited)
    assert re.search(r"\.weight has shape \[\d+(, \d+)?\] in the file but \[\d+(, \d+)?\] in the rebuilt model;",
                     str(caught.value)), caught.value
    assert "torch.Size" not in str(caught.value)


def test_wrong_types_through_the_api_give_clear_errors(tmp_path: Path) -> None:
    model = tiny_model(TinySpec("bert"))
    with pytest.raises(ConfigError, match="strategy must be a Strategy object, got the str 'head-prune'"):
        surgery.convert(model, "head-prune")  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="plan must be a mapping"):
        surgery.apply_plan(model, HeadPruningStrategy(heads={0: [0]}), None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"needs a transformers model .* got Linear"):
        surgery.save_pretrained(nn.Linear(2, 2), tmp_path / "linear")
    with pytest.raises(ConfigError, match=r"model must be a torch nn\.Module"):
        surgery.plan("bert", HeadPruningStrategy(heads={0: [0]}))  # type: ignore[arg-type]
    assert not (tmp_path / "linear").exists()


def _mutations() -> st.SearchStrategy[object]:
    json_values = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False)
                               | st.text(max_size=8),
                               lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                           max_size=3),
                               max_leaves=6)
    paths = st.sampled_from([(), ("format",), ("format_version",), ("versions",), ("model_class",), ("model_type",),
                             ("attn_implementation",), ("steps",), ("steps", 0), ("steps", 0, "strategy"),
                             ("steps", 0, "plan_version"), ("steps", 0, "config"), ("steps", 0, "plan"),
                             ("steps", 0, "plan", "heads"), ("steps", 0, "config", "heads")])
    return st.tuples(paths, st.sampled_from(["drop", "retype"]), json_values)


def _mutate(manifest: dict[str, object], path: tuple[object, ...], action: str, value: object) -> object:
    if not path:
        return value  # the whole file replaced by random JSON
    data = copy.deepcopy(manifest)
    parent: object = data
    for key in path[:-1]:
        parent = parent[key]  # type: ignore[index]
    if action == "drop" and isinstance(parent, dict):
        parent.pop(path[-1], None)
    elif action == "drop" and isinstance(parent, list):
        parent.clear()
    else:
        parent[path[-1]] = value  # type: ignore[index]
    return data


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutation=_mutations())
def test_fuzzed_manifest_loads_equal_or_fails_in_one_line(pruned: tuple[nn.Module, Path], tmp_path: Path,
                                                          mutation: tuple[tuple[object, ...], str, object]) -> None:
    model, saved = pruned
    inputs = tiny_inputs(TinySpec("bert"))
    target = tmp_path / f"fuzz-{time.monotonic_ns()}"
    shutil.copytree(saved, target)
    manifest = json.loads((saved / "surgery.json").read_text())
    (target / "surgery.json").write_text(json.dumps(_mutate(manifest, *mutation)))
    try:
        loaded = surgery.from_pretrained(target)
    except SurgeryError as exc:
        assert "\n" not in str(exc) and str(exc), repr(exc)
        return
    finally:
        shutil.rmtree(target, ignore_errors=True)
    with torch.no_grad():
        expected = model.eval()(**inputs).last_hidden_state
        got = loaded(**inputs).last_hidden_state
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)  # eager/sdpa differ in the last bits


# -- what users feel first ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.multiprocess
def test_help_strategies_and_input_errors_import_no_heavy_library(tmp_path: Path) -> None:
    probe = """
import sys
from typer.testing import CliRunner
from surgery.cli.app import app
result = CliRunner().invoke(app, sys.argv[1:])
heavy = sorted(m for m in ("torch", "transformers", "datasets") if m in sys.modules)
print(result.exit_code, heavy)
"""
    for args in (["--help"], ["strategies"], ["inspect", str(tmp_path / "missing")],
                 ["apply", str(tmp_path / "missing"), "-s", "head-prune", "-o", str(tmp_path / "o")],
                 ["apply", str(tmp_path), "-s", "no-such", "-o", str(tmp_path / "o")]):
        result = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=120)
        assert result.stdout.strip().splitlines()[-1].endswith("[]"), (args, result.stdout, result.stderr)


def test_redirected_output_shows_progress_lines_and_uncut_tables() -> None:
    sink = io.StringIO()
    with ProgressDisplay(Console(file=sink, width=80)) as show:
        for step in range(1, 101):
            show(ProgressEvent("calibration", step, 100, {"loss": 1 / step}))
    lines = sink.getvalue().splitlines()
    assert lines[0].startswith("calibration: 1/100") and lines[-1].startswith("calibration: 100/100")
    assert 10 <= len(lines) <= 12
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    table = run_cli(["strategies"], env=env).stdout  # stdout is a pipe, not a terminal
    assert max(len(line) for line in table.splitlines()) > 80
    assert any("head-prune" in line and "Remove attention heads" in line for line in table.splitlines())


def test_bench_writes_nothing_to_stderr_below_python(capfd: pytest.CaptureFixture[str]) -> None:
    from surgery.measure.bench import bench_models

    report = bench_models({"tiny": tiny_model(TinySpec("bert"))}, batch_size=2, seq_len=8, repeats=1, warmup=0)
    assert report.models[0].activation_peak_bytes
    assert "USDT" not in capfd.readouterr().err


# -- config.json values (issue 22) -------------------------------------------------------------------
CONFIG_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
               "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "hidden_dropout_prob",
               "attention_probs_dropout_prob", "initializer_range", "pad_token_id", "hidden_act",
               "_attn_implementation", "position_embedding_type", "model_type", "architectures", "dtype")


def _config_values() -> st.SearchStrategy[object]:
    scalars = (st.none() | st.booleans() | st.integers(-3, 40) | st.sampled_from([0, -1, 100_000, 10**12])
               | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
               | st.sampled_from(["gelu", "relu", "eager", "sdpa", "bert", "gpt2", "kernels-community/x"]))
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=4)


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plain") / "bert"
    tiny_model(TinySpec("bert")).save_pretrained(path)
    return path


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(saved_by_surgery=st.booleans(), edits=st.dictionaries(st.sampled_from(CONFIG_KEYS), _config_values(),
                                                            min_size=1, max_size=3))
def test_fuzzed_config_loads_or_fails_in_one_line(pruned: tuple[nn.Module, Path], plain_dir: Path, tmp_path: Path,
                                                  saved_by_surgery: bool, edits: dict[str, object]) -> None:
    """Any config.json values: the model loads and runs, or loading fails with one SurgeryError line."""
    source = pruned[1] if saved_by_surgery else plain_dir
    target = tmp_path / f"fuzz-{time.monotonic_ns()}"
    shutil.copytree(source, target)
    config = json.loads((source / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **edits}))
    try:
        loaded = surgery.from_pretrained(target)
    except SurgeryError as exc:
        assert "\n" not in str(exc) and str(exc), repr(exc)
        return
    finally:
        shutil.rmtree(target, ignore_errors=True)
    assert sum(p.numel() for p in loaded.parameters()) > 0
