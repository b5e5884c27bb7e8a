"""The OpenVINO runtimes: ``openvino`` (the fp32 IR, held to f32), ``openvino-bf16`` (the same IR run in bf16)
and ``openvino-int8`` (NNCF int8, calibrated).

All are :class:`~surgery.runtimes.shared.graph_runtime.GraphRuntime` around
:func:`surgery.runtimes.openvino.openvino_ir.write_openvino`: the artefact is the IR directory it writes
(``openvino_model.xml``/``.bin``, ``config.json``, ``surgery-openvino.json``), which ``openvino`` alone serves and
optimum-intel's ``OVModelFor*`` loads. The IR records the inference precision it was checked at in its runtime
options (``rt_info``), so it tells whoever compiles it.

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

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from surgery.runtimes.openvino.vendor_telemetry import import_openvino
from surgery.runtimes.shared.graph_runtime import GraphRuntime
from surgery.runtimes.shared.runtime import bf16_cpu_missing

if TYPE_CHECKING:  # the class attributes are read before torch is imported (flag checks)
    from collections.abc import Sequence

    from torch import nn
    from transformers import PretrainedConfig

    from surgery.core.strategy import Batch
    from surgery.runtimes.openvino.openvino_ir import OpenVinoExportReport


class OpenVinoRuntime(GraphRuntime):
    """OpenVINO on the CPU, the fp32 IR held to f32 (the CPU plugin would otherwise pick bf16 where it can).

    ``export_options`` are further keyword arguments of :func:`surgery.runtimes.openvino.openvino_ir.write_openvino`
    (``smooth_quant_alpha`` ...).
    """

    name: ClassVar[str] = "openvino"
    extra: ClassVar[str | None] = "openvino"
    description: ClassVar[str] = "OpenVINO, fp32 IR (held to f32)"
    packages: ClassVar[tuple[str, ...]] = ("openvino",)
    versioned: ClassVar[tuple[str, ...]] = ("openvino",)
    artefact_folder: ClassVar[str] = "openvino"
    sentence_backend: ClassVar[str | None] = "openvino"
    #: The ``INFERENCE_PRECISION_HINT`` the IR is served (and recorded) with.
    inference_precision: ClassVar[str] = "f32"

    def write_graph(self, model: nn.Module, out_dir: Path, *, task: str, threads: int | None,
                    calibration: list[Batch] | None, **options: Any) -> OpenVinoExportReport:
        from surgery.runtimes.openvino.openvino_ir import write_openvino

        return write_openvino(model, out_dir, task=task, threads=threads, int8=self.int8, calibration=calibration,
                              **{"precision": self.inference_precision, **options})

    def read_record(self, out_dir: Path) -> OpenVinoExportReport:
        from surgery.runtimes.openvino.openvino_ir import read_openvino_info

        return read_openvino_info(out_dir)

    def served(self, out_dir: Path, record: Any, *, config: PretrainedConfig, threads: int | None = None
               ) -> nn.Module:
        from surgery.runtimes.openvino.openvino_ir import OV_XML, OpenVinoModel

        return OpenVinoModel(Path(out_dir) / OV_XML, config=config, output=record.output, threads=threads,
                             task=record.task, precision=self.inference_precision,
                             pad_to_multiple_of=record.pad_to_multiple_of)

    def smooth_alpha(self, config: Any) -> float | None:
        from surgery.runtimes.openvino.openvino_ir import SMOOTH_QUANT_ALPHA

        return config.smooth_alpha if config.smooth_alpha is not None else SMOOTH_QUANT_ALPHA

    def artefact_options(self, config: Any, *, tokenizer: Any = None) -> dict[str, Any]:
        """The parity batch and the int8 smoothing strength of ``config``."""
        return {**super().artefact_options(config, tokenizer=tokenizer),
                "smooth_quant_alpha": self.smooth_alpha(config)}

    def serving_code(self, directory: str) -> list[str]:
        from surgery.runtimes.openvino.openvino_ir import OV_XML

        return ["import openvino, transformers",
                f'model = openvino.Core().compile_model("{directory}/{OV_XML}", "CPU", {{"INFERENCE_PRECISION_HINT": '
                f'"{self.inference_precision}"}})',
                f'batch = transformers.AutoTokenizer.from_pretrained("{directory}")(texts, padding=True, '
                'return_tensors="np")',
                "outputs = model({p.any_name: batch[p.any_name] for p in model.inputs})"]


class OpenVinoBf16Runtime(OpenVinoRuntime):
    """OpenVINO on the CPU, the fp32 IR run with the bf16 inference precision hint (CPUs with avx512_bf16 or AMX).

    The same f32 IR as ``openvino``, parity-checked in f32 as it is; then run in bf16, its drift from PyTorch
    fp32 must keep a per-example cosine of at least :data:`surgery.runtimes.openvino.openvino_ir.BF16_MIN_COSINE`.
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
    float_fallback: ClassVar[bool] = True

    def with_float_groups(self, served_dir: Path, model: nn.Module, groups: Sequence[str], out_dir: Path) -> Path:
        """The IR with ``groups``' products back in float, beside a copy of the record
        (:func:`surgery.runtimes.openvino.openvino_ir.with_float_groups`: NNCF's revert without quantizing again)."""
        import shutil

        ov = import_openvino()

        from surgery.runtimes.openvino.openvino_ir import OV_INFO, OV_XML, with_float_groups

        out = Path(out_dir)
        out.mkdir(parents=True)
        quantized = ov.Core().read_model(str(Path(served_dir) / OV_XML))
        ov.save_model(with_float_groups(quantized, model, list(groups)), str(out / OV_XML), compress_to_fp16=False)
        shutil.copyfile(Path(served_dir) / OV_INFO, out / OV_INFO)
        return out

    def int8_refit(self, model: nn.Module, teacher: nn.Module, batches: Sequence[Batch], *,
                   calibration: Sequence[Batch], threads: int | None = None) -> list[str] | None:
        """The quantization-aware refit (:func:`surgery.runtimes.openvino.quantized_refit.quantization_aware_refit`)."""
        from surgery.runtimes.openvino.quantized_refit import quantization_aware_refit

        return quantization_aware_refit(model, teacher, batches, calibration=calibration, threads=threads).projections
