"""A pytest plugin that records each test's CPU seconds (this process and its children) and wall seconds.

On a shared machine wall time says how busy it was; CPU time says what the test costs, and the
suite's wall time on an idle machine is about the CPU time of its longest worker. Usage (each xdist
worker writes its own file):

    PYTHONPATH=experiments/probes python -m pytest -p cpu_durations -n 2 --dist loadgroup
    python experiments/probes/cpu_durations.py logs/cpu_durations   # per module, and a 2-worker estimate

Writes ``$CPU_DURATIONS_DIR/<worker>.json`` (default logs/cpu_durations): nodeid -> [cpu_s, wall_s].
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

_times: dict[str, list[float]] = {}


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_runtest_protocol(item, nextitem):  # type: ignore[no-untyped-def]
    start_cpu, start_wall = _cpu(), time.perf_counter()
    yield
    _times[item.nodeid] = [round(_cpu() - start_cpu, 3), round(time.perf_counter() - start_wall, 3)]


pytest_runtest_protocol.hookwrapper = True  # type: ignore[attr-defined]


def pytest_sessionfinish(session, exitstatus):  # type: ignore[no-untyped-def]
    out = Path(os.environ.get("CPU_DURATIONS_DIR", "logs/cpu_durations"))
    out.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    if _times:
        (out / f"{worker}.json").write_text(json.dumps(_times, indent=0))


def summary(directory: Path, workers: int = 2) -> None:
    """Per module CPU and wall seconds, and the longest of ``workers`` bins when modules are dealt largest first."""
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for path in directory.glob("*.json"):
        for nodeid, (cpu, wall) in json.loads(path.read_text()).items():
            module = nodeid.split("::")[0]
            modules[module][0] += cpu
            modules[module][1] += wall
    bins = [0.0] * workers
    for cpu, _ in sorted(modules.values(), reverse=True):
        bins[bins.index(min(bins))] += cpu
    for module, (cpu, wall) in sorted(modules.items(), key=lambda kv: -kv[1][0]):
        print(f"{module:<45} cpu {cpu:8.1f} s  wall {wall:8.1f} s")
    total = sum(c for c, _ in modules.values())
    print(f"total cpu {total:.0f} s; dealt to {workers} workers: longest {max(bins):.0f} s")


if __name__ == "__main__":
    summary(Path(sys.argv[1] if len(sys.argv) > 1 else "logs/cpu_durations"))
