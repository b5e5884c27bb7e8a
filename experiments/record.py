"""The one result schema every study writes (and every legacy result file is read into).

A record is one JSON object::

    {"schema": 1, "study": "head_prune", "run": "head_prune", "source": "...", "command": "...",
     "date": "2026-11-26", "commit": "a3b900e...", "seconds": 123.4,
     "machine": {...surgery.measure.machine.machine_info(): cpu_model, flags, threads, versions...},
     "load_average": {"before": 1.2, "after": 1.4},
     "config": {...what the study ran: model, tasks, seeds, a CompressConfig or a method, runtimes...},
     "rows": [{"name": ..., "task": ..., "seed": ..., "runtime": ..., "speedup": 2.1,
               "speedup_interval": [2.0, 2.2], "accuracy": 0.81, "fidelity": 0.99, "size_bytes": 1234, ...}],
     "notes": ["free text lines computed from the data"]}

``rows`` is a plain list of dicts: the renderer's column spec (``study.toml``) picks keys from them, so a
study adds whatever keys it measures. The keys above are the shared vocabulary: ``speedup`` is measured
against the study's reference (paired where the study pairs), ``speedup_interval`` its interval
(``interval`` in ``config`` says which: bootstrap 95% or IQR), ``accuracy`` a fraction in [0, 1],
``fidelity`` a cosine or agreement against the original, ``size_bytes`` the artefact or parameter bytes.

Example:
    >>> rec = new_record("demo", "demo", command="python experiments/run.py demo", config={"model": "tiny"},
    ...                  machine=False)
    >>> rec["schema"], rec["rows"], check_record(rec, "demo.json")["study"]
    (1, [], 'demo')
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_VERSION = 1
REQUIRED = ("schema", "study", "run", "source", "config", "rows")


def git_commit(root: Path = ROOT) -> str | None:
    """The checkout's HEAD commit, with ``-dirty`` when tracked library files differ from it (None outside git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "surgery",
                                "strategies", "cli"], cwd=root, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty.strip() else "")


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def new_record(study: str, run: str, *, command: str, config: dict[str, Any], machine: bool = True) -> dict[str, Any]:
    """An empty record for a run about to start: commit, date, machine and the load average before it."""
    info = None
    if machine:
        from surgery.measure.machine import machine_info

        info = machine_info().model_dump(mode="json")
    return {"schema": SCHEMA_VERSION, "study": study, "run": run, "source": "experiments/run.py",
            "command": command, "date": datetime.date.today().isoformat(), "commit": git_commit(),
            "seconds": None, "machine": info, "load_average": {"before": load_average(), "after": None},
            "config": config, "rows": [], "notes": []}


def finish_record(record: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Stamp the wall time and the load average after the run."""
    record["seconds"] = round(seconds, 1)
    record["load_average"]["after"] = load_average()
    return record


def check_record(record: Any, where: str) -> dict[str, Any]:
    """``record`` if it has the schema's shape; ValueError naming ``where`` and the first problem otherwise."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a record is a JSON object, got {type(record).__name__}")
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise ValueError(f"{where}: not a study record (missing {', '.join(missing)})")
    if record["schema"] != SCHEMA_VERSION:
        raise ValueError(f"{where}: schema {record['schema']!r}, this runner reads {SCHEMA_VERSION}")
    if not isinstance(record["rows"], list) or not all(isinstance(r, dict) for r in record["rows"]):
        raise ValueError(f"{where}: rows must be a list of objects")
    return record


def write_record(record: dict[str, Any], path: Path) -> Path:
    """Write ``record`` to ``path`` atomically (a temporary file beside it, then a rename)."""
    check_record(record, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read_record(path: Path) -> dict[str, Any]:
    """A record written by :func:`write_record`."""
    return check_record(json.loads(path.read_text()), str(path))
