"""Probe: SIGTERM inside the --overwrite swap, 100 rounds a case, inside a pytest process that holds OpenVINO fp32
and int8 (NNCF) and ONNX Runtime fp32 and int8 sessions, each loaded and run on 2 threads.

tests/test_safe_outputs.py's in-process signal test once ended a full single-process suite run in SIGSEGV; its
sibling probe signal_swap_openvino.py tries that outside pytest. This tries it inside pytest, with SIGTERM raised
in the main thread ("raise") and sent to the process, so that any thread may take it ("kill"), on both swaps
(renameat2's exchange and the two-rename fallback). faulthandler prints every thread on a crash. On the
project's AVX2 EPYC (2026-11-26, load 7-9): 4 passed, no crash.

    python -X faulthandler -m pytest -p no:cacheprovider -rA experiments/probes/signal_swap_in_pytest.py
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys

import pytest

from surgery.persist import atomic
from surgery.persist.atomic import atomic_directory
from surgery.testing import TinySpec, tiny_inputs, tiny_model


class Boom(BaseException):
    """Raised by the probe's own SIGTERM handler, as a KeyboardInterrupt would be."""


def save(out, text, overwrite=False):
    with atomic_directory(out, overwrite=overwrite) as tmp:
        (tmp / "surgery.json").write_text(json.dumps({"format": "surgery", "format_version": 1, "steps": []}))
        (tmp / "which.txt").write_text(text)
    return out


@pytest.fixture(scope="module")
def openvino_loaded(tmp_path_factory):
    """Each runtime's artefact of a tiny BERT, loaded and run on 2 threads, kept alive for the module."""
    from surgery.runtimes import get_runtime

    spec = TinySpec("bert", task="seq-cls")
    model = tiny_model(spec).eval()
    root = tmp_path_factory.mktemp("ov")
    kept = []
    for name in ("openvino", "openvino-int8", "onnxruntime", "onnxruntime-int8"):
        calibration = [tiny_inputs(spec, batch=8, seq=12, seed=s) for s in range(2)]
        runtime = get_runtime(name)
        artefact = runtime.write_artefact(model, root / name, calibration=calibration, threads=2)
        loaded = runtime.load(artefact.directory, config=model.config, threads=2)
        loaded(**tiny_inputs(spec))
        kept.append(loaded)
    print("threads:", len(os.listdir("/proc/self/task")), file=sys.stderr)
    return kept


@pytest.mark.parametrize("how", ["raise", "kill"])
@pytest.mark.parametrize("kind", ["exchange", "two renames"])
def test_sigterm_in_the_swap_with_openvino_and_onnxruntime_loaded(openvino_loaded, tmp_path, kind, how,
                                                                   monkeypatch):
    if kind == "two renames":
        monkeypatch.setattr(atomic, "_renameat2", lambda: None)
    out = save(tmp_path / "m", "previous")
    real_exchange, real_rename = atomic.exchange, os.rename
    seen = []

    def interrupted(signum, frame):
        seen.append((out / "which.txt").read_text() if out.exists() else "missing")
        raise Boom

    def send():
        if how == "kill":
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            signal.raise_signal(signal.SIGTERM)

    def rename_with_signal(src, dst):
        send()
        real_rename(src, dst)

    def exchange_with_signal(a, b):
        send()
        return real_exchange(a, b)

    monkeypatch.setattr(atomic, "exchange", exchange_with_signal)
    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        for i in range(100):
            seen.clear()
            with monkeypatch.context() as patched:
                patched.setattr(os, "rename", rename_with_signal)
                with contextlib.suppress(Boom):
                    save(out, f"new{i}", overwrite=True)
            # a signal sent to the process may reach the handler later than the swap; one raised here may not
            assert how == "kill" or seen == [f"new{i}"], seen
    finally:
        signal.signal(signal.SIGTERM, previous)
