"""The OpenVINO runtimes: ``openvino`` (the fp32 IR, held to f32) and ``openvino-int8`` (NNCF int8, calibrated).

Both wrap :func:`surgery.deploy.openvino_export.export_openvino`: the artefact is the IR directory it
writes (``openvino_model.xml``/``.bin``, ``config.json``, ``surgery-openvino.json``), which ``openvino``
alone serves and optimum-intel's ``OVModelFor*`` loads.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
    >>> spec = TinySpec("distilbert", heads=4)
    >>> runtime = OpenVinoRuntime()
    >>> art = runtime.write_artefact(tiny_model(spec), Path(tempfile.mkdtemp()) / "ir", threads=1)
    >>> art.files, art.parity["max_abs_diff"] < 1e-4
    (('config.json', 'openvino_model.bin', 'openvino_model.xml', 'surgery-openvino.json'), True)
    >>> served = runtime.load(art.directory, config=tiny_model(spec).config, threads=1)
    >>> tuple(served(**tiny_inputs(spec)).last_hidden_state.shape)
    (3, 7, 32)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from torch import nn
from transformers import PretrainedConfig

from surgery.deploy.openvino_export import OPENVINO_HINT, OV_XML, OpenVinoModel, export_openvino, read_openvino_info
from surgery.runtimes.base import Batch, Runtime, RuntimeArtefact, artefact_of, missing_packages


class OpenVinoRuntime(Runtime):
    """OpenVINO on the CPU, the fp32 IR held to f32 (the CPU plugin would otherwise pick bf16 where it can)."""

    name: ClassVar[str] = "openvino"
    extra: ClassVar[str | None] = "openvino"
    description: ClassVar[str] = "OpenVINO, fp32 IR (held to f32)"
    int8: ClassVar[bool] = False
    #: The import names this runtime needs.
    packages: ClassVar[tuple[str, ...]] = ("openvino",)

    def __init__(self, **export_options: Any) -> None:
        #: Further keyword arguments of :func:`surgery.deploy.openvino_export.export_openvino`
        #: (``smooth_quant_alpha`` ...).
        self.export_options = export_options

    def unavailable(self) -> str | None:
        return missing_packages(self.packages, OPENVINO_HINT)

    def write_artefact(self, model: nn.Module, out_dir: Path, *, task: str = "auto",
                       calibration: Sequence[Batch] | None = None, threads: int | None = None,
                       opset: int | None = None) -> RuntimeArtefact:
        self.check_calibration(calibration)
        report = export_openvino(model, out_dir, task=task, threads=threads, int8=self.int8,
                                 calibration=list(calibration) if (self.int8 and calibration) else None,
                                 **self.export_options)
        found = report.int8_drift if report.int8_drift is not None else report.parity
        return artefact_of(self.name, Path(out_dir), task=report.task, output=report.output, found=found,
                           info=report.model_dump(mode="json"))

    def load(self, out_dir: Path, *, config: PretrainedConfig, threads: int | None = None) -> nn.Module:
        info = read_openvino_info(out_dir)
        return OpenVinoModel(Path(out_dir) / OV_XML, config=config, output=info.output, threads=threads,
                             task=info.task)


class OpenVinoInt8Runtime(OpenVinoRuntime):
    """OpenVINO on the CPU, int8 by NNCF post-training quantization (transformer recipe, SmoothQuant) on your texts."""

    name: ClassVar[str] = "openvino-int8"
    description: ClassVar[str] = "OpenVINO, NNCF static int8 calibrated on --calibration texts"
    needs_calibration: ClassVar[bool] = True
    int8: ClassVar[bool] = True
    packages: ClassVar[tuple[str, ...]] = ("openvino", "nncf")
