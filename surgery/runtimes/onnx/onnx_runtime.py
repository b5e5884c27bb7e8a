"""The ONNX Runtime runtimes: ``onnxruntime`` (the fp32 graph) and ``onnxruntime-int8`` (dynamic int8, smoothed
on calibration texts when given).

Both are :class:`~surgery.runtimes.shared.graph_runtime.GraphRuntime` around
:func:`surgery.runtimes.onnx.onnx_graph.write_onnx`, the one ONNX export (parity check, fused attention,
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

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from surgery.runtimes.shared.graph_runtime import GraphRuntime
from surgery.runtimes.shared.names import GRAPH_FORMAT, ONNX_NAME, ONNX_PACKAGES, SMOOTH_ALPHA

if TYPE_CHECKING:  # the class attributes are read before torch is imported (flag checks)
    from collections.abc import Sequence

    from torch import nn
    from transformers import PretrainedConfig

    from surgery.core.strategy import Batch
    from surgery.runtimes.onnx.onnx_graph import ExportReport


class OnnxRuntimeRuntime(GraphRuntime):
    """ONNX Runtime on the CPU, the fp32 graph (each layer's attention one fused operator).

    ``export_options`` are further keyword arguments of :func:`surgery.runtimes.onnx.onnx_graph.write_onnx`
    (``int8_fp32``, ``smooth_alpha``, ``per_channel``, ``int8_mode``, ``fuse_attention`` ...), as ``bench
    --int8-fp32`` passes them.
    """

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

    def write_graph(self, model: nn.Module, out_dir: Path, *, task: str, threads: int | None,
                    calibration: list[Batch] | None, **options: Any) -> ExportReport:
        from surgery.runtimes.onnx.onnx_graph import write_onnx

        return write_onnx(model, out_dir, task=task, threads=threads, int8=self.int8, calibration=calibration,
                          **options)

    def read_record(self, out_dir: Path) -> ExportReport:
        from surgery.runtimes.onnx.onnx_graph import read_export_info

        return read_export_info(out_dir)

    def served(self, out_dir: Path, record: Any, *, config: PretrainedConfig, threads: int | None = None
               ) -> nn.Module:
        from surgery.runtimes.onnx.onnx_session import OnnxRuntimeModel

        return OnnxRuntimeModel(Path(out_dir) / ONNX_NAME, config=config, output=record.output, threads=threads,
                                task=record.task, pad_to_multiple_of=record.pad_to_multiple_of)

    def smooth_alpha(self, config: Any) -> float | None:
        return config.smooth_alpha if config.smooth_alpha is not None else SMOOTH_ALPHA

    def artefact_options(self, config: Any, *, tokenizer: Any = None) -> dict[str, Any]:
        """The parity batch, opset, optimization, fused attention and the int8 settings of ``config``."""
        return {**super().artefact_options(config, tokenizer=tokenizer), "per_channel": not config.per_tensor,
                "int8_fp32": config.int8_fp32, "smooth_alpha": self.smooth_alpha(config), "optimize": config.optimize,
                "opset": config.opset, "fuse_attention": config.fuse_attention, "int8_mode": config.int8_mode}

    def serving_code(self, directory: str) -> list[str]:
        return ["import onnxruntime, transformers",
                f'session = onnxruntime.InferenceSession("{directory}/{ONNX_NAME}")',
                f'batch = transformers.AutoTokenizer.from_pretrained("{directory}")(texts, padding=True, '
                'return_tensors="np")',
                "outputs = session.run(None, {i.name: batch[i.name] for i in session.get_inputs()})"]


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
