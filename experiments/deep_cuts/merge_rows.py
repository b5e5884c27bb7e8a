"""Merge the rows of benchmark runs (each a ``bench_deep_cuts.py --out`` file) into one results file.

    python experiments/deep_cuts/merge_rows.py --into experiments/deep_cuts/results/deep_cuts_zen5.json \\
        --current LANE.json ... [--superseded LANE.json ...]

``--current`` rows go under ``runs`` by their key (``task|seed|target``), moving a row already there to
``superseded`` as ``key@commit``; ``--superseded`` rows go straight there (an A/B baseline:
``paired.py --results INTO`` pairs each current row with it). The machine, lscpu and threads of the
first file are kept; a file from another machine (another hardware fingerprint) is refused, so that one
file never mixes machines.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def same_machine(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two recorded machines are the same hardware: their
    :attr:`~surgery.measure.machine.MachineInfo.fingerprint` (CPU, flags, core count; the latency cache's own key).

    Example:
        >>> zen3 = {"cpu_model": "X", "cpu_family": "25/1", "arch": "x86_64", "system": "Linux", "flags": ["avx"]}
        >>> same_machine(zen3, {**zen3, "torch_threads": 2}), same_machine(zen3, {**zen3, "cpu_family": "26/2"})
        (True, False)
    """
    from surgery.measure.machine import MachineInfo

    return MachineInfo.model_validate(a).fingerprint == MachineInfo.model_validate(b).fingerprint


def merge(into: dict[str, Any], lane: dict[str, Any], *, current: bool, name: str) -> None:
    """Add ``lane``'s rows to ``into`` (see the module doc); refuse a lane from another machine."""
    if "machine" not in into:
        into.update(machine=lane["machine"], lscpu=lane.get("lscpu"), threads=lane.get("threads"))
    elif not same_machine(into["machine"], lane["machine"]):
        raise SystemExit(f"{name}: measured on another machine ({lane['machine'].get('cpu_family')}, "
                         f"{into['machine'].get('cpu_family')} in the results file); keep it in a file of its own")
    runs, superseded = into.setdefault("runs", {}), into.setdefault("superseded", {})
    for key, row in lane["runs"].items():
        if current:
            if key in runs:
                old = runs.pop(key)
                superseded[f"{key}@{old.get('commit')}"] = old
            runs[key] = row
        else:
            superseded[f"{key}@{row.get('commit')}"] = row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--into", type=Path, required=True)
    parser.add_argument("--current", type=Path, nargs="*", default=[])
    parser.add_argument("--superseded", type=Path, nargs="*", default=[])
    args = parser.parse_args()
    into = json.loads(args.into.read_text()) if args.into.exists() else {}
    for paths, current in ((args.superseded, False), (args.current, True)):
        for path in paths:
            merge(into, json.loads(path.read_text()), current=current, name=str(path))
    args.into.write_text(json.dumps(into, indent=1) + "\n")
    print(f"{args.into}: {len(into.get('runs', {}))} current rows, {len(into.get('superseded', {}))} superseded")


if __name__ == "__main__":
    main()
