"""A pytest plugin that says where the suite's time goes: the calls to the heavy parts each test makes.

``cpu_durations.py`` beside it says which tests cost most; this says *what* they spend it on: ONNX traces
(``torch.onnx.export``), NNCF quantization, OpenVINO conversions and compilations, ONNX Runtime quantization and
sessions, latency timing rounds, the HF Trainer, and the wall time a test waits on a child process (a ``surgery``
CLI, torchrun) that does its own work. Times are exclusive: a compilation inside ``nncf.quantize`` counts as NNCF,
not twice. What no category names (the tests' own Python, torch forwards, refits, imports) is the rest.

    PYTHONPATH=experiments/probes python -m pytest -p suite_costs -n 2 --dist loadfile
    python experiments/probes/suite_costs.py logs/suite_costs --out experiments/probes/results/suite_costs.json

Each process (the controller and every xdist worker) writes ``$SUITE_COSTS_DIR/<worker>.json`` (default
logs/suite_costs); the second command merges them with the machine's CPU model and flags.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: category -> (module, attribute path) of each call counted under it.
CATEGORIES: dict[str, list[tuple[str, str]]] = {
    "onnx trace": [("torch.onnx", "export")],
    "nncf quantize": [("nncf", "quantize")],
    "openvino convert": [("openvino", "convert_model")],
    "openvino compile": [("openvino", "Core.compile_model")],
    "ort quantize": [("onnxruntime.quantization", "quantize_dynamic"), ("onnxruntime.quantization", "quantize_static")],
    "ort session": [("onnxruntime", "InferenceSession.__init__")],
    "timing rounds": [("surgery.measure.timing", "time_models")],
    "trainer": [("transformers", "Trainer.train")],
    "child process wait": [("subprocess", "Popen.communicate"), ("subprocess", "Popen.wait")],
}

_stack: list[list[float]] = []  # per active counted call: [children's seconds]
_calls: list[tuple[str, float, str]] = []  # (category, exclusive seconds, test nodeid)
_tests: dict[str, float] = {}  # nodeid -> seconds of setup + call + teardown
_session: dict[str, float] = {}


def _test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]


def _counted(fn: Callable[..., Any], category: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        _stack.append([0.0])
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start
            children = _stack.pop()[0]
            if _stack:
                _stack[-1][0] += elapsed
            _calls.append((category, elapsed - children, _test()))
    return wrapped


def _patch() -> None:
    for category, targets in CATEGORIES.items():
        for module_name, path in targets:
            try:
                holder: Any = importlib.import_module(module_name)
            except Exception:  # an extra not installed: nothing of it runs
                continue
            *owners, name = path.split(".")
            for owner in owners:
                holder = getattr(holder, owner, None)
            if holder is None or not hasattr(holder, name):
                continue
            setattr(holder, name, _counted(getattr(holder, name), category))
            if module_name == "surgery.measure.timing":  # bound by name where it is imported
                for user in [m for n, m in list(sys.modules.items()) if n.startswith("surgery.")]:
                    if getattr(user, name, None) is getattr(holder, name).__wrapped__:
                        setattr(user, name, getattr(holder, name))


def pytest_configure(config: Any) -> None:
    _session["start"] = time.time()
    _patch()


def pytest_runtest_logreport(report: Any) -> None:
    _tests[report.nodeid] = _tests.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    folder = Path(os.environ.get("SUITE_COSTS_DIR", "logs/suite_costs"))
    folder.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    record = {"worker": worker, "start": _session["start"], "end": time.time(), "tests": _tests,
              "calls": [list(c) for c in _calls], "exit_status": int(exitstatus)}
    (folder / f"{worker}.json").write_text(json.dumps(record))


def summarize(folder: Path) -> dict[str, Any]:
    """The workers' records merged: the suite's wall time, the test seconds per category and per module."""
    from surgery.measure.machine import machine_info

    records = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    workers = [r for r in records if r["worker"] != "controller"] or records
    tests = {k: v for r in workers for k, v in r["tests"].items()}
    by_category: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    by_module: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in workers:
        for category, seconds, nodeid in r["calls"]:
            by_category[category][0] += seconds
            by_category[category][1] += 1
            by_module[nodeid.split("::")[0]][category] += seconds
    total = sum(tests.values())
    counted = sum(s for s, _ in by_category.values())
    modules = defaultdict(float)
    for nodeid, seconds in tests.items():
        modules[nodeid.split("::")[0]] += seconds
    machine = machine_info()
    return {
        "machine": {"cpu_model": machine.cpu_model, "summary": machine.summary(), "flags": machine.flags,
                    "usable_cpus": machine.usable_cpus},
        "workers": len(workers),
        "wall_seconds": round(max(r["end"] for r in records) - min(r["start"] for r in records), 1),
        "test_seconds": round(total, 1),
        "categories": {k: {"seconds": round(s, 1), "calls": int(n), "share": round(s / total, 3)}
                       for k, (s, n) in sorted(by_category.items(), key=lambda kv: -kv[1][0])},
        "rest_seconds": round(total - counted, 1),
        "modules": {m: {"seconds": round(s, 1), **{k: round(v, 1) for k, v in sorted(by_module[m].items())}}
                    for m, s in sorted(modules.items(), key=lambda kv: -kv[1])[:25]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    summary = json.dumps(summarize(args.folder), indent=1)
    if args.out:
        args.out.write_text(summary + "\n")
    print(summary)


if __name__ == "__main__":
    main()
