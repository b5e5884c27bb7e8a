"""Every docstring example in the package runs (they are the API's first documentation)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import tempfile
from pathlib import Path

import pytest

import surgery
import surgery.cli
import surgery.strategies

# strategies/ and cli/ live beside surgery/ in the tree and install as subpackages, so walk each.
PACKAGES = (surgery, surgery.strategies, surgery.cli)
MODULES = sorted({p.__name__ for p in PACKAGES} | {
    m.name for p in PACKAGES for m in pkgutil.walk_packages(p.__path__, p.__name__ + ".")
    if not m.name.endswith("__main__")})


#: Modules whose examples need an optional extra (module -> import name): skipped where it is not installed.
NEEDS_EXTRA = {"surgery.runtimes.openvino.openvino_export": "openvino",
               "surgery.runtimes.openvino.openvino_ir": "openvino",
               "surgery.runtimes.openvino.openvino_runtime": "openvino",
               "surgery.runtimes.openvino.openvino_ir_bench": "openvino"}


#: Modules whose examples export, train or time models (over ~5 s): they run in the slow lane only.
SLOW = {"surgery.compress.latency_measure", "surgery.runtimes.onnx.onnx_export", "surgery.runtimes.onnx.onnx_graph",
        "surgery.runtimes.openvino.openvino_ir",
        "surgery.runtimes.openvino.openvino_export", "surgery.runtimes.sentence_interop", "surgery.embedding.objective",
        "surgery.runtimes.export_config", "surgery.runtimes.onnx.onnx_runtime",
        "surgery.runtimes.openvino.openvino_runtime", "surgery.strategies.doe.doe",
        "surgery.strategies.shrp.shrp", "surgery.training.recover", "surgery.training.trainer",
        "surgery.runtimes.runtime_bench", "surgery.cli.export_command", "surgery.runtimes.openvino.openvino_ir_bench",
        "surgery.runtimes.openvino.quantized_refit"}


@pytest.mark.parametrize("name", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW else m for m in MODULES])
def test_docstring_examples_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The examples make their directories with tempfile.mkdtemp(), as a reader would; here those land under this
    # test's tmp_path (which pytest removes), not as a leftover in the system's /tmp for every run.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    if name in NEEDS_EXTRA:
        pytest.importorskip(NEEDS_EXTRA[name], reason=f"{name}'s examples need the openvino extra")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {name}"
