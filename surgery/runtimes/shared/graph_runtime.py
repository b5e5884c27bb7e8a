"""What the runtimes that serve an exported graph share (ONNX Runtime, OpenVINO): a Runtime around one exporter.

A graph runtime's artefact is the directory its exporter writes (the graph, and its record: an
:class:`~surgery.runtimes.shared.graph_export.ExportRecord`); the folder a user deploys (tokenizer, accuracy on
data, atomic write) is :meth:`~surgery.runtimes.shared.runtime.Runtime.write_folder`'s, as for every runtime. As
optimum's exporters keep "export the graph" apart from "save the deployable directory", a subclass says only what
is its own: :meth:`GraphRuntime.write_graph` (its exporter, with its settings from :meth:`artefact_options`),
:meth:`GraphRuntime.read_record` and :meth:`GraphRuntime.served` (its model as it runs). The class attributes
import no torch.

Example:
    >>> from surgery.runtimes import get_runtime
    >>> runtime = get_runtime("onnxruntime")
    >>> isinstance(runtime, GraphRuntime), runtime.export_options
    (True, {})
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from surgery.runtimes.shared.runtime import Runtime, RuntimeArtefact, artefact_of

if TYPE_CHECKING:  # the class attributes are read before torch is imported (flag checks)
    from torch import nn
    from transformers import PretrainedConfig

    from surgery.core.strategy import Batch
    from surgery.runtimes.shared.graph_export import ExportRecord

__all__ = ["GraphRuntime"]


class GraphRuntime(Runtime):
    """A runtime whose artefact is one exporter's directory: the graph and its record (see the module docstring).

    ``export_options`` (keyword arguments of the exporter: ``int8_fp32``, ``smooth_alpha`` ...) are passed to
    every export this object makes, over those an export's settings give (``bench --int8-fp32`` passes them).
    """

    aligns = True

    def __init__(self, **export_options: Any) -> None:
        #: Further keyword arguments of the exporter (:meth:`write_graph`), over an export's own settings.
        self.export_options = export_options

    def unavailable(self) -> str | None:
        return self.missing()

    def write_graph(self, model: nn.Module, out_dir: Path, *, task: str, threads: int | None,
                    calibration: list[Batch] | None, **options: Any) -> ExportRecord:
        """Export ``model`` into ``out_dir`` (new or empty) with the exporter's ``options``; return its record."""
        raise NotImplementedError

    def read_record(self, out_dir: Path) -> ExportRecord:
        """The record the exporter saved in ``out_dir`` (a one-line error when it is missing or damaged)."""
        raise NotImplementedError

    def served(self, out_dir: Path, record: ExportRecord, *, config: PretrainedConfig,
               threads: int | None = None) -> nn.Module:
        """The graph in ``out_dir`` as it runs (``record`` is its record)."""
        raise NotImplementedError

    def artefact_options(self, config: Any, *, tokenizer: Any = None) -> dict[str, Any]:
        """The parity batch's settings of ``config`` (an ExportConfig; ``tokenizer`` builds its texts); a subclass
        adds its own exporter's."""
        return {"batch": config.batch, "seq": config.seq, "tolerance": config.tolerance, "parity_tokenizer": tokenizer}

    def write_artefact(self, model: nn.Module, out_dir: Path, *, task: str = "auto",
                       calibration: Sequence[Batch] | None = None, threads: int | None = None,
                       opset: int | None = None, **options: Any) -> RuntimeArtefact:
        """:meth:`write_graph`; the parity figures are the record's :meth:`~ExportRecord.served_agreement`.

        ``calibration`` reaches the exporter only for an int8 runtime; ``opset`` only when given.
        """
        given = {**options, **({"opset": opset} if opset is not None else {}), **self.export_options}
        record = self.write_graph(model, Path(out_dir), task=task, threads=threads,
                                  calibration=list(calibration) if (self.int8 and calibration) else None, **given)
        return artefact_of(self.name, Path(out_dir), task=record.task, output=record.output,
                           found=record.served_agreement(), info=record.model_dump(mode="json"))

    def read_info(self, out_dir: Path) -> dict[str, Any]:
        return self.read_record(out_dir).model_dump(mode="json")

    def load(self, out_dir: Path, *, config: PretrainedConfig, threads: int | None = None) -> nn.Module:
        return self.served(Path(out_dir), self.read_record(out_dir), config=config, threads=threads)

    def record_accuracy(self, out_dir: Path, info: dict[str, Any], *, accuracy_torch: float, accuracy: float
                        ) -> dict[str, Any]:
        """The accuracies go into the exporter's record: ``accuracy_torch`` and its
        :attr:`~surgery.runtimes.shared.graph_export.ExportRecord.accuracy_field`."""
        record = self.read_record(out_dir)
        record = record.model_copy(update={"accuracy_torch": accuracy_torch, record.accuracy_field: accuracy})
        record.write(out_dir)
        return record.model_dump(mode="json")

    def align(self, out_dir: Path, multiple: int | None, why: str | None = None) -> None:
        """Record in ``out_dir``'s export record that its served model pads batches to a multiple of ``multiple``
        (:mod:`surgery.runtimes.shared.alignment`; None: as given), and ``why`` (how it was chosen)."""
        record = self.read_record(Path(out_dir))
        record.model_copy(update={"pad_to_multiple_of": multiple, "padding": why}).write(Path(out_dir))

    def export_report(self, artefact: RuntimeArtefact) -> ExportRecord:
        """The exporter's record of the folder (what ``surgery export`` renders)."""
        return self.read_record(artefact.directory)
