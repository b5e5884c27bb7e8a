"""The ONNX Runtime runtimes: ``onnxruntime`` (the fp32 graph) and ``onnxruntime-int8`` (dynamic int8, smoothed
on calibration texts when given).

Both wrap :func:`surgery.deploy.export.export_onnx`, the one ONNX export (parity check, fused attention,
quantization, smoothing): the artefact is the directory it writes, ``model.onnx`` and ``surgery-onnx.json``.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
    >>> spec = TinySpec("bert", heads=4)
    >>> runtime = OnnxRuntimeRuntime()
    >>> art = runtime.write_artefact(tiny_model(spec), Path(tempfile.mkdtemp()) / "g")
    >>> art.files, art.parity["max_abs_diff"] < 1e-4
    (('model.onnx', 'surgery-onnx.json'), True)
    >>> served = runtime.load(art.directory, config=tiny_model(spec).config)
    >>> tuple(served(**tiny_inputs(spec)).last_hidden_state.shape)
    (3, 7, 32)
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn
from transformers import PretrainedConfig

from surgery.deploy.names import ONNX_NAME
from surgery.runtimes.base import Batch, Runtime, RuntimeArtefact
from surgery.runtimes.parity import agreement_of, reference_batch


class OnnxRuntimeRuntime(Runtime):
    """ONNX Runtime on the CPU, the fp32 graph (each layer's attention one fused operator)."""

    name: ClassVar[str] = "onnxruntime"
    extra: ClassVar[str | None] = "onnx"
    description: ClassVar[str] = "ONNX Runtime, fp32 graph"
    int8: ClassVar[bool] = False

    def unavailable(self) -> str | None:
        from surgery.deploy.runtime import INSTALL_HINT, ONNX_PACKAGES

        missing = [p for p in ONNX_PACKAGES if importlib.util.find_spec(p) is None]
        return f"needs {', '.join(missing)} (not installed): {INSTALL_HINT}" if missing else None

    def write_artefact(self, model: nn.Module, out_dir: Path, *, task: str = "auto",
                       calibration: Sequence[Batch] | None = None, threads: int | None = None,
                       opset: int | None = None) -> RuntimeArtefact:
        from surgery.deploy.export import export_onnx

        report = export_onnx(model, out_dir, task=task, threads=threads, opset=opset, int8=self.int8,
                             calibration=list(calibration) if (self.int8 and calibration) else None)
        ref = reference_batch(model, report.task)
        served = self.load(Path(out_dir), config=ref.module.config, threads=threads)
        with torch.no_grad():
            got = getattr(served(**ref.inputs), report.output)
        del served
        out = Path(out_dir).expanduser().resolve()
        return RuntimeArtefact(self.name, out, tuple(sorted(p.name for p in out.iterdir())), report.task,
                               report.output, agreement_of(ref.expected, got, ref.inputs["attention_mask"]),
                               report.model_dump(mode="json"))

    def load(self, out_dir: Path, *, config: PretrainedConfig, threads: int | None = None) -> nn.Module:
        from surgery.deploy.export import read_export_info
        from surgery.deploy.runtime import OnnxRuntimeModel

        info = read_export_info(out_dir)
        return OnnxRuntimeModel(Path(out_dir) / ONNX_NAME, config=config, output=info.output, threads=threads,
                                task=info.task)


class OnnxRuntimeInt8Runtime(OnnxRuntimeRuntime):
    """ONNX Runtime on the CPU, dynamic int8 (per-channel weights; activations smoothed on calibration texts)."""

    name: ClassVar[str] = "onnxruntime-int8"
    description: ClassVar[str] = "ONNX Runtime, dynamic int8 (smoothed on --calibration texts when given)"
    needs_calibration: ClassVar[bool] = True
    int8: ClassVar[bool] = True
