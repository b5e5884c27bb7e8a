"""Probe: SIGTERM during the --overwrite swap (renameat2) in a process that loaded OpenVINO/NNCF and ran a model.

tests/test_safe_outputs.py runs its in-process signal test in a child interpreter because, once, inside a
long pytest process that had loaded OpenVINO and NNCF, it ended in SIGSEGV. This reproduces the conditions
outside pytest: MODE ``none`` (no OpenVINO), ``ov`` (an fp32 IR compiled and run) or ``nncf`` (an NNCF int8
IR), then N saves with overwrite, each with a SIGTERM raised inside the exchange (``kill`` as the third
argument: sent to the process with os.kill, so any thread may receive it). faulthandler prints every
thread on a crash; "ok" at the end means every signal landed after the swap, with no crash.

    python experiments/probes/signal_swap_openvino.py nncf 200 kill
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from surgery.persist import atomic
from surgery.persist.atomic import atomic_directory
from surgery.testing import TinySpec, tiny_inputs, tiny_model

MANIFEST = json.dumps({"format": "surgery", "format_version": 1, "steps": []})


class Boom(BaseException):
    """Raised by the test's own SIGTERM handler, as a KeyboardInterrupt would be."""


def load_openvino(mode: str) -> None:
    """Compile and run an IR (fp32 or NNCF int8), so that OpenVINO's and NNCF's threads are alive."""
    from surgery.runtimes import get_runtime

    spec = TinySpec("bert", task="seq-cls")
    model = tiny_model(spec).eval()
    root = Path(tempfile.mkdtemp())
    name = "openvino-int8" if mode == "nncf" else "openvino"
    calibration = [tiny_inputs(spec, batch=8, seq=12, seed=s) for s in range(2)] if mode == "nncf" else None
    runtime = get_runtime(name)
    artefact = runtime.write_artefact(model, root / name, calibration=calibration, threads=1)
    runtime.load(artefact.directory, config=model.config, threads=1)(**tiny_inputs(spec))
    print("openvino loaded, threads:", len(os.listdir("/proc/self/task")), flush=True)


def save(out: Path, text: str, overwrite: bool = False) -> Path:
    with atomic_directory(out, overwrite=overwrite) as tmp:
        tmp.mkdir(exist_ok=True)
        (tmp / "which.txt").write_text(text)
        (tmp / "surgery.json").write_text(MANIFEST)
    return out


def main(mode: str, rounds: int, how: str) -> None:
    faulthandler.enable(all_threads=True)
    if mode in ("ov", "nncf"):
        load_openvino(mode)
    out = save(Path(tempfile.mkdtemp()) / "m", "previous")
    seen: list[str] = []

    def interrupted(signum: int, frame: Any) -> None:
        seen.append((out / "which.txt").read_text())
        raise Boom

    real_exchange = atomic.exchange

    def exchange_with_signal(a: Path, b: Path) -> bool:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGTERM)  # process-directed: any thread may take it
        else:
            signal.raise_signal(signal.SIGTERM)  # to this (the main) thread
        return real_exchange(a, b)

    atomic.exchange = exchange_with_signal
    signal.signal(signal.SIGTERM, interrupted)
    for i in range(rounds):
        seen.clear()
        with contextlib.suppress(Boom):
            save(out, f"new{i}", overwrite=True)
        assert seen == [f"new{i}"], seen  # the handler ran once, after the swap
    print("ok", mode, how, rounds, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20, sys.argv[3] if len(sys.argv) > 3 else "raise")
