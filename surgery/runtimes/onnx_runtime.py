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

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from torch import nn
from transformers import PretrainedConfig

from surgery.deploy.names import ONNX_NAME
from surgery.runtimes.base import Batch, Runtime, RuntimeArtefact, artefact_of, missing_packages


class OnnxRuntimeRuntime(Runtime):
    """ONNX Runtime on the CPU, the fp32 graph (each layer's attention one fused operator)."""

    name: ClassVar[str] = "onnxruntime"
    extra: ClassVar[str | None] = "onnx"
    description: ClassVar[str] = "ONNX Runtime, fp32 graph"
    int8: ClassVar[bool] = False

    def __init__(self, **export_options: Any) -> None:
        #: Further keyword arguments of :func:`surgery.deploy.export.export_onnx` (``int8_fp32``, ``smooth_alpha``,
        #: ``per_channel``, ``int8_mode``, ``fuse_attention`` ...), as ``bench --int8-fp32`` passes them.
        self.export_options = export_options

    def unavailable(self) -> str | None:
        from surgery.deploy.runtime import INSTALL_HINT, ONNX_PACKAGES

        return missing_packages(ONNX_PACKAGES, INSTALL_HINT)

    def write_artefact(self, model: nn.Module, out_dir: Path, *, task: str = "auto",
                       calibration: Sequence[Batch] | None = None, threads: int | None = None,
                       opset: int | None = None) -> RuntimeArtefact:
        from surgery.deploy.export import export_onnx

        report = export_onnx(model, out_dir, task=task, threads=threads, opset=opset, int8=self.int8,
                             calibration=list(calibration) if (self.int8 and calibration) else None,
                             **self.export_options)
        found = report.int8_drift if report.int8_drift is not None else report.parity
        return artefact_of(self.name, Path(out_dir), task=report.task, output=report.output, found=found,
                           info=report.model_dump(mode="json"))

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

    def check_calibration(self, calibration: Sequence[Batch] | bool | None) -> None:
        """Calibration is optional here: without it the activations are quantized as they are (no smoothing)."""
