"""The overwrite swap with SIGTERM raised inside it, for tests/test_safe_outputs.py to run in an interpreter of its
own: ``python tests/swap_child.py KIND OUT`` prints what the handler saw, what was recorded as saved and what is
left beside OUT, as JSON. It imports ``surgery.persist`` alone (no torch, no ONNX Runtime, no OpenVINO), so that no
thread pool of another test's libraries is in the process the signal is raised in.

``save`` (what surgery's writers do) is here so that the test module and this child write outputs the same way.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from surgery.persist import atomic
from surgery.persist.atomic import atomic_directory, saved_outputs


def save(out: Path, text: str = "new", *, overwrite: bool = False) -> Path:
    """What surgery's writers do: files into atomic_directory's temporary directory (which adds the manifest)."""
    with atomic_directory(out, overwrite=overwrite) as tmp:
        (tmp / "surgery.json").write_text(json.dumps({"format": "surgery", "format_version": 1, "steps": []}))
        (tmp / "which.txt").write_text(text)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "weights.bin").write_bytes(b"\0" * 64)
    return out


class Boom(BaseException):
    """Stands for anything raised mid-swap: a KeyboardInterrupt, a MemoryError."""


def swap_with_raised_signal(out: Path, kind: str) -> dict[str, object]:
    """Replace ``out`` (an earlier output) with ``save(out, "new", overwrite=True)`` while SIGTERM is raised in the
    middle of the swap: in the exchange (``kind`` "exchange") or in the rename of ``out`` aside ("two renames", the
    fallback where renameat2 is missing). The handler notes what ``out`` held when it ran, then raises ``Boom``."""
    real_exchange, real_rename = atomic.exchange, os.rename
    seen: list[str] = []

    def interrupted(signum: int, frame: object) -> None:
        seen.append((out / "which.txt").read_text() if out.exists() else "missing")
        raise Boom

    # raise_signal: to this (the main) thread, as a handler runs in Python whichever thread a signal reaches.
    def rename_with_signal(src: object, dst: object) -> None:
        signal.raise_signal(signal.SIGTERM)  # in the middle of the swap
        real_rename(src, dst)

    def exchange_with_signal(a: Path, b: Path) -> bool:
        signal.raise_signal(signal.SIGTERM)
        return real_exchange(a, b)

    if kind == "two renames":
        atomic._renameat2 = lambda: None
    atomic.exchange = exchange_with_signal
    signal.signal(signal.SIGTERM, interrupted)
    before = len(saved_outputs())
    raised = False
    os.rename = rename_with_signal
    try:
        save(out, "new", overwrite=True)
    except Boom:
        raised = True
    finally:
        os.rename = real_rename
    return {"raised": raised, "seen": seen, "saved": [str(path) for path in saved_outputs()[before:]]}


if __name__ == "__main__":
    print(json.dumps(swap_with_raised_signal(Path(sys.argv[2]), sys.argv[1])))
