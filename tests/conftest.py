"""Test configuration: hypothesis profiles, a quiet single-threaded torch, the garbage collector's settings, and
the fixtures test modules share.

Shared plain helpers are in tests/helpers.py; no test module imports another.

Under pytest-xdist (``scripts/test.sh`` runs ``-n 2 --dist loadfile``) every module is one unit of work, so
module- and session-scoped fixtures are built once per worker; modules that share a session fixture (the
uneven exports below) are one unit together (SHARED_WORKER).
"""

from __future__ import annotations

import gc
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings

# The repository root, so that `from tests.helpers import ...` works under a bare `pytest` as under `python -m pytest`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

torch.set_num_threads(1)
warnings.filterwarnings("ignore", category=FutureWarning)

settings.register_profile(
    "ci", max_examples=20, derandomize=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Tests read what the CLI prints. Under pytest-xdist the temporary paths grow a `popen-gwN` part, and rich,
# at its default 80 columns on a pipe, wraps a long path or note across table cells: the words a test looks
# for are then split. A wide console (for CliRunner and for the subprocesses that inherit it) keeps them whole.
os.environ["COLUMNS"] = "400"


# The cyclic garbage collector, as a test process needs it. A worker's heap holds millions of long-lived objects
# (torch, transformers, the ONNX exporter's and OpenVINO's modules and caches), and every full collection walks all
# of them: each torch.onnx.export ends in an explicit gc.collect() (ONNXProgram.release), and by default every tenth
# second-generation pass is a full one. On this project's 2-core machine (Zen 5, load 4, 2026-11-27) that was 23 s of
# a 77 s run of test_latency + test_embedding_objective (gen-2 time from gc.callbacks). So what is alive after
# collection and after each module's last test (imports, session fixtures, caches) is moved out of the collector's
# reach (gc.freeze: still freed by reference counting, never walked again), and a full pass comes after 100
# second-generation passes, not 10 (CPython frees cyclic garbage later, at the same peak memory there: 774 against
# 765 MB). The same run: 3 s of collection, 54 s in all. Nothing a test checks depends on when cycles are freed;
# the tests that need an object gone call gc.collect() themselves, and objects they make are never frozen.
gc.set_threshold(700, 10, 100)


def freeze_survivors() -> None:
    """Collect what is garbage now, then keep what survives out of every later collection (``gc.freeze``)."""
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    freeze_survivors()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a module's last test is torn down (its module fixtures released), freeze what is still alive."""
    try:
        return (yield)
    finally:
        if nextitem is None or nextitem.path != item.path:
            freeze_survivors()


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Every test starts with torch on one thread, whatever an earlier test left: loading a torch runtime with
    ``threads=N`` sets the process's thread count and keeps it, which made later tests' numbers (and their
    1e-5 tolerances) depend on the order the tests ran in."""
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    yield


@pytest.fixture()
def timed_by_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI measures on this machine; here its times come from shape tables."""
    from surgery.compress.latency_source import MeasuredLatency
    from tests.helpers import tables_for

    monkeypatch.setattr(MeasuredLatency, "table", lambda self, model, runtime: tables_for(model).table(model, runtime))
    monkeypatch.setattr(MeasuredLatency, "speedup",
                        lambda self, original, candidate, *, runtime, reference_runtime, served=None: tables_for(
                            original).speedup(original, candidate, runtime=runtime,
                                              reference_runtime=reference_runtime))


#: Test modules that must share a worker (and so its session fixtures) under ``--dist loadfile``: module -> group.
SHARED_WORKER = {"test_deploy.py": "uneven-exports", "test_fused_attention.py": "uneven-exports"}
#: Modules whose tests share no module fixture: under ``--dist loadfile`` each test is its own unit of work, so
#: that one long module does not keep a worker busy while the other has nothing left.
EACH_TEST_A_UNIT = {"test_docstrings.py"}
#: About how many seconds each long unit of work takes: the scheduler hands out the longest first, so that the last
#: units to finish are short ones. From a profile of the whole suite on this project's 2-core machine (Zen 5,
#: ``pytest -n 2 --dist loadfile --durations=0`` at load 3-4 beside benchmarks, 2026-11-27): every test's setup,
#: call and teardown summed per unit (work_unit), so only the order matters. A unit not named here counts a second
#: per test. The tests made cheaper since are scaled by their own before/after ratio, each measured alone with
#: ``-n 0`` on this machine at load 4-5 (a shared fp32 trace: the int8-fp32 parts 10.2 -> 3.7 s, bench across
#: runtimes 21.7 -> 6.8 s, bench --int8-fp32 4.8 -> 3.0 s, the data-loss classes 26.3 -> 22.3 s; fewer probes or
#: points: doe's contract 3.5 -> 1.8 s, the plugin runtime's cache 8.0 -> 4.7 s, the max-drop precision pass
#: 11.5 -> 10.5 and 9.9 -> 7.0 s).
UNIT_SECONDS: dict[str, float] = {
    "uneven-exports": 239, "test_compress_runtimes.py": 198, "test_latency.py": 163, "test_safe_outputs.py": 147,
    "test_embedding_objective.py": 107, "test_precision.py": 88, "test_stock_configs.py": 69,
    "test_recovery_tiers.py": 60, "test_doe.py": 52, "test_hostile.py": 52, "test_plugins.py": 52,
    "test_save_reload.py": 51, "test_pick.py": 49, "test_flags_and_cache.py": 44, "test_compress.py": 43,
    "test_smooth.py": 43, "test_shrp_safe_cut.py": 29, "test_shrp.py": 25, "test_openvino.py": 25,
    "test_method_contract.py": 24, "test_precision_search.py": 24, "test_registry_lookups.py": 17,
    "test_serving_shapes.py": 16, "test_vendor_telemetry.py": 14, "test_multiprocess.py": 13, "test_reference.py": 12,
    "test_cost_estimate.py": 9, "test_guard.py": 6,
    "test_docstrings.py::test_docstring_examples_run[surgery.runtimes.sentence_interop]": 12,
    "test_docstrings.py::test_docstring_examples_run[surgery.compress.latency_measure]": 11,
    "test_docstrings.py::test_docstring_examples_run[surgery.cli.export_command]": 8,
    "test_docstrings.py::test_docstring_examples_run[surgery.runtimes.onnx.onnx_graph]": 7,
    "test_docstrings.py::test_docstring_examples_run[surgery.runtimes.onnx.onnx_export]": 7,
    "test_docstrings.py::test_docstring_examples_run[surgery.runtimes.runtime_bench]": 7,
    "test_docstrings.py::test_docstring_examples_run[surgery.runtimes.export_config]": 7,
    "test_docstrings.py::test_docstring_examples_run[surgery.embedding.objective]": 7,
    "test_docstrings.py::test_docstring_examples_run[surgery.runtimes.onnx.onnx_runtime]": 6,
    "test_docstrings.py::test_docstring_examples_run[surgery.strategies.doe.doe]": 5,
    "test_docstrings.py::test_docstring_examples_run[surgery.strategies.shrp.shrp]": 5,
}


def work_unit(nodeid: str) -> str:
    """The unit of work ``nodeid`` belongs to under ``--dist loadfile`` (see ``pytest_xdist_make_scheduler``).

    Example:
        >>> work_unit("tests/test_deploy.py::test_x"), work_unit("tests/test_docstrings.py::test_y[m]")
        ('uneven-exports', 'tests/test_docstrings.py::test_y[m]')
    """
    module = nodeid.split("::", 1)[0]
    name = Path(module).name
    if name in EACH_TEST_A_UNIT:
        return nodeid
    return SHARED_WORKER.get(name, module)


def unit_seconds(unit: str, tests: int) -> float:
    """What a unit of work is expected to take: its UNIT_SECONDS (keyed by module file name, group, or
    ``module::test`` for EACH_TEST_A_UNIT), else a second per test."""
    module, _, test = unit.partition("::")
    return UNIT_SECONDS.get(Path(module).name + (f"::{test}" if test else ""), float(tests))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with the units of ``work_unit`` handed out longest first (``unit_seconds``).

    Not ``--dist loadgroup`` with ``xdist_group`` marks: pytest-xdist 3.8 writes the group into
    ``item._nodeid``, which pytest 9.2 no longer reads, so every test became its own unit.
    """
    if config.getoption("dist") != "loadfile":
        return None
    from collections import OrderedDict

    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the queue is complete before the first unit is handed out
                self.workqueue = OrderedDict(sorted(self.workqueue.items(),
                                                    key=lambda item: -unit_seconds(item[0], len(item[1]))))
                self.ordered = True
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


@pytest.fixture(scope="session", autouse=True)
def one_trace_per_graph(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every ONNX trace of a module identical to one already traced in this run, by any test on any worker
    (``tests.helpers.module_fingerprint``: the same classes, config, weights and input shapes, opset and length
    bound), is served from that trace's bytes: ``torch.onnx.export(dynamo=True)`` of a tiny model takes 2-7 s on a
    2-core machine and writes the same bytes again (tests/helpers.py ``identical_graphs_traced_once`` says what stays:
    the module still runs once, and parity checks, quantization, sessions and records are made as usual). The
    traces live in a folder of this run that the xdist workers share, written whole (a rename) or not at all; a
    trace that fails is not kept, so its error is raised again. Child processes trace for themselves."""
    from surgery.runtimes.onnx import onnx_graph
    from tests.helpers import module_fingerprint

    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "onnx-traces"
    folder.mkdir(exist_ok=True)
    real = onnx_graph._torch_export

    def traced(module: torch.nn.Module, inputs: Any, path: Path, *, opset: int | None, max_seq: int | None) -> None:
        kept = folder / f"{module_fingerprint(module, inputs, opset, max_seq)}.onnx"
        if kept.is_file():
            with torch.no_grad():
                module(**inputs)
            path.write_bytes(kept.read_bytes())
            return
        real(module, inputs, path, opset=opset, max_seq=max_seq)
        partial = folder / f"{kept.name}.{os.getpid()}.part"
        partial.write_bytes(path.read_bytes())
        os.replace(partial, kept)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(onnx_graph, "_torch_export", traced)
        yield


@pytest.fixture(scope="session", autouse=True)
def own_latency_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Latency tables are cached under a directory of this run (of this worker), not the user's ~/.cache: a table
    another run measured at another load must not decide what a test sees. Child processes inherit it."""
    before = os.environ.get("SURGERY_CACHE")
    os.environ["SURGERY_CACHE"] = str(tmp_path_factory.mktemp("surgery-cache"))
    yield
    if before is None:
        os.environ.pop("SURGERY_CACHE", None)
    else:
        os.environ["SURGERY_CACHE"] = before


class UnevenExports:
    """Each family's uneven model (tests/helpers.py ``uneven_model``), exported once per session and runtime.

    ``onnx(family)`` is ONNX Runtime's fp32 graph (``export_onnx`` at batch 4 x 12, tolerance 1e-4) and
    ``openvino(family)`` the OpenVINO IR (``get_runtime("openvino").write_artefact``); each returns the model
    exported, its spec, the export's report or artefact and the directory. Tests read them and write nothing
    into them.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[tuple[str, str], dict[str, Any]] = {}

    def onnx(self, family: str) -> dict[str, Any]:
        if (family, "onnx") not in self.done:
            from surgery.runtimes.onnx import export_onnx
            from tests.helpers import uneven_model

            model, spec = uneven_model(family)
            out = self.root / f"{family}-onnx"
            report = export_onnx(model, out, batch=4, seq=12, tolerance=1e-4)
            self.done[family, "onnx"] = {"model": model, "spec": spec, "report": report, "dir": out,
                                         "graph": out / "model.onnx"}
        return self.done[family, "onnx"]

    def openvino(self, family: str) -> dict[str, Any]:
        if (family, "openvino") not in self.done:
            from surgery.runtimes import get_runtime
            from tests.helpers import uneven_model

            model, spec = uneven_model(family, routed=False)
            artefact = get_runtime("openvino").write_artefact(model.eval(), self.root / f"{family}-ir", threads=1)
            self.done[family, "openvino"] = {"model": model, "spec": spec, "artefact": artefact,
                                             "dir": artefact.directory}
        return self.done[family, "openvino"]


@pytest.fixture(scope="session")
def uneven_exports(tmp_path_factory: pytest.TempPathFactory) -> UnevenExports:
    """The uneven model of each family exported once per session (per xdist worker), on first use."""
    return UnevenExports(tmp_path_factory.mktemp("uneven-exports"))
