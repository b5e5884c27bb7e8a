"""The ONNX Runtime runtimes: ``onnxruntime`` (the fp32 graph) and ``onnxruntime-int8`` (dynamic int8, smoothed
on calibration texts when given).

Both wrap :func:`surgery.runtimes.onnx.onnx_export.export_onnx`, the one ONNX export (parity check, fused attention,
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
from typing import TYPE_CHECKING, Any, ClassVar

from surgery.runtimes.shared.names import GRAPH_FORMAT, ONNX_NAME, ONNX_PACKAGES
from surgery.runtimes.shared.runtime import Runtime, RuntimeArtefact, artefact_of

if TYPE_CHECKING:  # the class attributes are read before torch is imported (flag checks)
    from torch import nn
    from transformers import PretrainedConfig

    from surgery.core.strategy import Batch


class OnnxRuntimeRuntime(Runtime):
    """ONNX Runtime on the CPU, the fp32 graph (each layer's attention one fused operator)."""

    name: ClassVar[str] = "onnxruntime"
    extra: ClassVar[str | None] = "onnx"
    description: ClassVar[str] = "ONNX Runtime, fp32 graph"
    packages: ClassVar[tuple[str, ...]] = ONNX_PACKAGES
    #: onnx writes the graph; onnxruntime's own version is in the machine's versions already.
    versioned: ClassVar[tuple[str, ...]] = ("onnx",)
    graph_format: ClassVar[int | None] = GRAPH_FORMAT
    artefact_folder: ClassVar[str] = "onnx"
    sentence_backend: ClassVar[str | None] = "onnx"
    export_settings: ClassVar[frozenset[str]] = frozenset({"opset", "optimize", "fuse_attention"})

    def __init__(self, **export_options: Any) -> None:
        #: Further keyword arguments of :func:`surgery.runtimes.onnx.onnx_export.export_onnx` (``int8_fp32``,
        #: ``smooth_alpha``, ``per_channel``, ``int8_mode``, ``fuse_attention`` ...), as ``bench --int8-fp32``
        #: passes them.
        self.export_options = export_options

    def unavailable(self) -> str | None:
        return self.missing()

    def write_artefact(self, model: nn.Module, out_dir: Path, *, task: str = "auto",
                       calibration: Sequence[Batch] | None = None, threads: int | None = None,
                       opset: int | None = None) -> RuntimeArtefact:
        from surgery.runtimes.onnx.onnx_export import export_onnx

        report = export_onnx(model, out_dir, task=task, threads=threads, opset=opset, int8=self.int8,
                             calibration=list(calibration) if (self.int8 and calibration) else None,
                             **self.export_options)
        found = report.int8_drift if report.int8_drift is not None else report.parity
        return artefact_of(self.name, Path(out_dir), task=report.task, output=report.output, found=found,
                           info=report.model_dump(mode="json"))

    def smooth_alpha(self, config: Any) -> float | None:
        from surgery.runtimes.shared.names import SMOOTH_ALPHA

        return config.smooth_alpha if config.smooth_alpha is not None else SMOOTH_ALPHA

    def export(self, model: nn.Module, out_dir: Path, config: Any, *, tokenizer: Any = None,
               calibration: Sequence[Batch] | None = None, data: Any = None) -> Any:
        """The whole ONNX export (:func:`surgery.runtimes.onnx.onnx_export.export_onnx`: tokenizer, parity batch,
        accuracy on ``data``), as ``config`` says; returns its
        :class:`~surgery.runtimes.onnx.onnx_export.ExportReport`."""
        from surgery.runtimes.onnx.onnx_export import export_onnx

        options = {"per_channel": not config.per_tensor, "int8_fp32": config.int8_fp32,
                   "smooth_alpha": self.smooth_alpha(config), "optimize": config.optimize, "opset": config.opset,
                   "fuse_attention": config.fuse_attention, "int8_mode": config.int8_mode, **self.export_options}
        return export_onnx(model, out_dir, tokenizer=tokenizer, task=config.task, int8=self.int8,
                           calibration=calibration, batch=config.batch, seq=config.seq, tolerance=config.tolerance,
                           data=data, threads=config.threads, overwrite=config.overwrite,
                           max_length=config.max_length, **options)

    def serving_code(self, directory: str) -> list[str]:
        return ["import onnxruntime, transformers",
                f'session = onnxruntime.InferenceSession("{directory}/{ONNX_NAME}")',
                f'batch = transformers.AutoTokenizer.from_pretrained("{directory}")(texts, padding=True, '
                'return_tensors="np")',
                "outputs = session.run(None, {i.name: batch[i.name] for i in session.get_inputs()})"]

    def read_info(self, out_dir: Path) -> dict[str, Any]:
        from surgery.runtimes.onnx.onnx_export import read_export_info

        return read_export_info(out_dir).model_dump(mode="json")

    def load(self, out_dir: Path, *, config: PretrainedConfig, threads: int | None = None) -> nn.Module:
        from surgery.runtimes.onnx.onnx_export import read_export_info
        from surgery.runtimes.onnx.onnx_session import OnnxRuntimeModel

        info = read_export_info(out_dir)
        return OnnxRuntimeModel(Path(out_dir) / ONNX_NAME, config=config, output=info.output, threads=threads,
                                task=info.task)


class OnnxRuntimeInt8Runtime(OnnxRuntimeRuntime):
    """ONNX Runtime on the CPU, dynamic int8 (per-channel weights; activations smoothed on calibration texts)."""

    name: ClassVar[str] = "onnxruntime-int8"
    description: ClassVar[str] = "ONNX Runtime, dynamic int8 (smoothed on --calibration texts when given)"
    needs_calibration: ClassVar[bool] = True
    precision: ClassVar[str] = "int8"
    export_settings: ClassVar[frozenset[str]] = OnnxRuntimeRuntime.export_settings | {"per_tensor", "int8_fp32",
                                                                                       "int8_mode"}

    def check_calibration(self, calibration: Sequence[Batch] | bool | None) -> None:
        """Calibration is optional here: without it the activations are quantized as they are (no smoothing)."""
