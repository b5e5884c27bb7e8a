"""The OpenVINO runtimes: ``openvino`` (the fp32 IR, held to f32), ``openvino-bf16`` (the same IR run in bf16)
and ``openvino-int8`` (NNCF int8, calibrated).

All wrap :func:`surgery.runtimes.openvino.openvino_export.export_openvino`: the artefact is the IR directory it
writes (``openvino_model.xml``/``.bin``, ``config.json``, ``surgery-openvino.json``), which ``openvino``
alone serves and optimum-intel's ``OVModelFor*`` loads. The IR records the inference precision it was
checked at in its runtime options (``rt_info``), so it tells whoever compiles it.

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
from typing import TYPE_CHECKING, Any, ClassVar

from surgery.runtimes.shared.runtime import Runtime, RuntimeArtefact, artefact_of, bf16_cpu_missing

if TYPE_CHECKING:  # the class attributes are read before torch is imported (flag checks)
    from torch import nn
    from transformers import PretrainedConfig

    from surgery.core.strategy import Batch


class OpenVinoRuntime(Runtime):
    """OpenVINO on the CPU, the fp32 IR held to f32 (the CPU plugin would otherwise pick bf16 where it can)."""

    name: ClassVar[str] = "openvino"
    extra: ClassVar[str | None] = "openvino"
    description: ClassVar[str] = "OpenVINO, fp32 IR (held to f32)"
    packages: ClassVar[tuple[str, ...]] = ("openvino",)
    versioned: ClassVar[tuple[str, ...]] = ("openvino",)
    artefact_folder: ClassVar[str] = "openvino"
    sentence_backend: ClassVar[str | None] = "openvino"
    #: The ``INFERENCE_PRECISION_HINT`` the IR is served (and recorded) with.
    inference_precision: ClassVar[str] = "f32"

    def __init__(self, **export_options: Any) -> None:
        #: Further keyword arguments of :func:`surgery.runtimes.openvino.openvino_export.export_openvino`
        #: (``smooth_quant_alpha`` ...).
        self.export_options = export_options

    def unavailable(self) -> str | None:
        return self.missing()

    def write_artefact(self, model: nn.Module, out_dir: Path, *, task: str = "auto",
                       calibration: Sequence[Batch] | None = None, threads: int | None = None,
                       opset: int | None = None) -> RuntimeArtefact:
        from surgery.runtimes.openvino.openvino_export import export_openvino

        self.check_calibration(calibration)
        report = export_openvino(model, out_dir, task=task, threads=threads, int8=self.int8,
                                 precision=self.inference_precision,
                                 calibration=list(calibration) if (self.int8 and calibration) else None,
                                 **self.export_options)
        found = report.int8_drift or report.bf16_drift or report.parity
        return artefact_of(self.name, Path(out_dir), task=report.task, output=report.output, found=found,
                           info=report.model_dump(mode="json"))

    def smooth_alpha(self, config: Any) -> float | None:
        from surgery.runtimes.openvino.openvino_export import SMOOTH_QUANT_ALPHA

        return config.smooth_alpha if config.smooth_alpha is not None else SMOOTH_QUANT_ALPHA

    def export(self, model: nn.Module, out_dir: Path, config: Any, *, tokenizer: Any = None,
               calibration: Sequence[Batch] | None = None, data: Any = None) -> Any:
        """The whole OpenVINO export (:func:`surgery.runtimes.openvino.openvino_export.export_openvino`: tokenizer,
        parity batch, accuracy on ``data``), as ``config`` says; returns its
        :class:`~surgery.runtimes.openvino.openvino_export.OpenVinoExportReport`."""
        from surgery.runtimes.openvino.openvino_export import export_openvino

        options = {"smooth_quant_alpha": self.smooth_alpha(config), **self.export_options}
        return export_openvino(model, out_dir, tokenizer=tokenizer, task=config.task, int8=self.int8,
                               precision=self.inference_precision, calibration=calibration, batch=config.batch,
                               seq=config.seq, tolerance=config.tolerance, data=data, threads=config.threads,
                               overwrite=config.overwrite, max_length=config.max_length, **options)

    def serving_code(self, directory: str) -> list[str]:
        from surgery.runtimes.openvino.openvino_export import OV_XML

        return ["import openvino, transformers",
                f'model = openvino.Core().compile_model("{directory}/{OV_XML}", "CPU", {{"INFERENCE_PRECISION_HINT": '
                f'"{self.inference_precision}"}})',
                f'batch = transformers.AutoTokenizer.from_pretrained("{directory}")(texts, padding=True, '
                'return_tensors="np")',
                "outputs = model({p.any_name: batch[p.any_name] for p in model.inputs})"]

    def read_info(self, out_dir: Path) -> dict[str, Any]:
        from surgery.runtimes.openvino.openvino_export import read_openvino_info

        return read_openvino_info(out_dir).model_dump(mode="json")

    def load(self, out_dir: Path, *, config: PretrainedConfig, threads: int | None = None) -> nn.Module:
        from surgery.runtimes.openvino.openvino_export import OV_XML, OpenVinoModel, read_openvino_info

        info = read_openvino_info(out_dir)
        return OpenVinoModel(Path(out_dir) / OV_XML, config=config, output=info.output, threads=threads,
                             task=info.task, precision=self.inference_precision)


class OpenVinoBf16Runtime(OpenVinoRuntime):
    """OpenVINO on the CPU, the fp32 IR run with the bf16 inference precision hint (CPUs with avx512_bf16 or AMX).

    The same f32 IR as ``openvino``, parity-checked in f32 as it is; then run in bf16, its drift from PyTorch
    fp32 must keep a per-example cosine of at least :data:`surgery.runtimes.openvino.openvino_export.BF16_MIN_COSINE`.
    """

    name: ClassVar[str] = "openvino-bf16"
    description: ClassVar[str] = "OpenVINO, fp32 IR run in bf16 (CPU with avx512_bf16 or AMX)"
    precision: ClassVar[str] = "bf16"
    inference_precision: ClassVar[str] = "bf16"

    def unavailable(self) -> str | None:
        missing = self.missing()
        if missing is not None:
            return missing
        reason = bf16_cpu_missing()
        return None if reason is None else f"{reason}; bf16 would run as f32 here: use --runtime openvino"


class OpenVinoInt8Runtime(OpenVinoRuntime):
    """OpenVINO on the CPU, int8 by NNCF post-training quantization (transformer recipe, SmoothQuant) on your texts."""

    name: ClassVar[str] = "openvino-int8"
    description: ClassVar[str] = "OpenVINO, NNCF static int8 calibrated on --calibration texts"
    needs_calibration: ClassVar[bool] = True
    precision: ClassVar[str] = "int8"
    packages: ClassVar[tuple[str, ...]] = ("openvino", "nncf")
    versioned: ClassVar[tuple[str, ...]] = ("openvino", "nncf")
