"""What ``surgery compress`` aims at and what it reports: targets, the report, the result.

The report (written as ``compress.json``) lists every candidate tried with its structure, predicted
and measured speedup, dev accuracy or fidelity and time spent; names the reference every figure is
against (the original model, PyTorch fp32, unless told otherwise); says why the winner won; and
carries the machine, the latency table and the search path, so a run can be checked afterwards.
"""

from __future__ import annotations

import os
import shutil
import weakref
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from surgery.compress.candidates import CandidateResult
from surgery.measure.serving import ServingShape
from surgery.persist.atomic import atomic_directory


class SpeedupTarget(BaseModel):
    """Be at least ``speedup`` times faster than the original; the most accurate candidate that is wins.

    ``max_drop`` (points) is the guard: a winner that loses more is returned with a warning.

    Example:
        >>> SpeedupTarget(speedup=2.0).describe()
        '--speedup 2'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    speedup: float = Field(gt=1.0, description="measured speedup to reach, against the reference runtime")
    max_drop: float | None = Field(default=None, ge=0.0, description="points of accuracy/fidelity it may lose")

    def describe(self) -> str:
        text = f"--speedup {self.speedup:g}"
        return text if self.max_drop is None else f"{text} --max-drop {self.max_drop:g}"


class DropTarget(BaseModel):
    """Lose at most ``max_drop`` points of dev accuracy (or of fidelity); the fastest candidate that does wins.

    Example:
        >>> DropTarget(max_drop=1.0).describe()
        '--max-drop 1'
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_drop: float = Field(ge=0.0, description="points of accuracy (or 100 x mean-cosine fidelity) it may lose")

    def describe(self) -> str:
        return f"--max-drop {self.max_drop:g}"


Target = SpeedupTarget | DropTarget


class CompressReport(BaseModel):
    """Everything one ``compress`` run did, decided and measured (``compress.json``)."""

    target: str
    runtime: str
    against_runtime: str
    objective: str
    reference: str = Field(description="what every accuracy, fidelity and speedup is measured against")
    metric: str
    original: dict[str, float] = Field(default_factory=dict, description="the reference's own dev figures")
    batch_size: int
    seq_len: int
    text_length: dict[str, Any] = Field(default_factory=dict, description="the tokens texts were cut "
                                        "to and why (the data's info['text_length'])")
    threads: int | None = None
    serving_shape: ServingShape | None = Field(default=None, description="the shape every time was measured at: "
                                               "batch, threads, length policy and the drawn lengths' summary")
    stock: bool = False
    budget_minutes: float | None = None
    machine: dict[str, Any] = Field(default_factory=dict)
    latency_table: dict[str, Any] = Field(default_factory=dict)
    unchanged_speedup: float = Field(default=1.0, description="the original on the runtime against the reference")
    importance: dict[str, Any] = Field(default_factory=dict)
    path: list[dict[str, Any]] = Field(default_factory=list, description="the search: one entry per removal")
    units_path: list[dict[str, Any]] = Field(default_factory=list, description="the search over heads and neurons "
                                             "only (none with --stock)")
    uniform_path: list[dict[str, Any]] = Field(default_factory=list, description="the search with every layer cut "
                                               "alike (none with --stock)")
    candidates: list[CandidateResult] = Field(default_factory=list)
    winner: str | None = None
    why: str = ""
    training: dict[str, Any] | None = None
    phases: dict[str, float] = Field(default_factory=dict, description="seconds per phase")
    estimate: dict[str, Any] = Field(default_factory=dict, description="seconds per phase estimated before the "
                                     "work from small timed steps, against the actual; what a budget scaled down")
    peak_rss_bytes: int | None = Field(default=None, description="the process's peak resident memory (ru_maxrss)")
    seconds: float = 0.0
    warnings: list[str] = Field(default_factory=list, description="the target or the guard missed")
    notes: list[str] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict, description="the CompressConfig it ran with, by the same "
                                   "field names (surgery.compress.config)")
    runtimes: list[dict[str, Any]] = Field(default_factory=list, description="--runtime auto: every runtime timed "
                                           "with the unchanged model's ratio, whether it could reach the target, "
                                           "whether it was searched and what its search found")
    artefact: dict[str, str] = Field(default_factory=dict, description="SHA-256 of each file of the winner's runtime "
                                     "artefact, the one judged and timed and the one saved (empty for torch)")
    alignment: dict[str, Any] | None = Field(default=None, description="whether the runtime ran batches padded "
                                             "to a block multiple faster (measured on the unchanged model; "
                                             "surgery.runtimes.shared.alignment): the multiple the saved artefact "
                                             "pads to, and the speedups that chose it")
    judging: dict[str, Any] = Field(default_factory=dict, description="the dev split (search, its screen, the "
                                    "held-out pick part), how many candidates were judged on what, the search's "
                                    "probes, and the rule --max-drop is held by")
    timing: dict[str, Any] = Field(default_factory=dict, description="--max-drop: the candidates within the drop in "
                                   "order of predicted speed, which were timed, and why timing stopped")
    workers: int = Field(default=1, description="processes candidates were built and judged in (timing: this one)")
    worker_threads: int | None = Field(default=None, description="threads each worker ran with")

    def winner_result(self) -> CandidateResult | None:
        return next((c for c in self.candidates if c.name == self.winner), None)


class KeptDirectory(type(Path())):  # type: ignore[misc]  # PosixPath or WindowsPath, as Path() makes
    """A temporary directory's path that keeps the directory on disk while this object lives.

    The directory (and the temporary folder holding it) is deleted once nothing refers to this
    object any more: not the :class:`CompressResult` it came in, not the caller's own variable. A
    path derived from it (``kept / "model.onnx"``) or its ``str`` does not keep it; copy the files
    away (:meth:`CompressResult.save_artefact`) to keep them for good.

    Example:
        >>> import gc, tempfile
        >>> holder = Path(tempfile.mkdtemp())
        >>> kept = KeptDirectory.take(holder)
        >>> kept.is_dir(), kept.parent == holder
        (True, True)
        >>> del kept; _ = gc.collect()
        >>> holder.exists()
        False
    """

    @classmethod
    def take(cls, holder: Path, name: str = "artefact") -> KeptDirectory:
        """``holder / name`` (made if missing), with ``holder`` deleted when the returned path is no longer used."""
        kept = cls(Path(holder) / name)
        kept.mkdir(exist_ok=True)
        weakref.finalize(kept, shutil.rmtree, str(holder), True)
        return kept


class CompressResult:
    """What :func:`surgery.compress` returns: the chosen model (PyTorch), the report, every candidate.

    ``calibration`` holds the training batches the run calibrated int8 activations on. ``artefact``
    is the directory of the winner's runtime artefact (ONNX graph, OpenVINO IR, bf16 weights), the
    very files it was judged and timed on (None for ``torch``): a :class:`KeptDirectory`, on disk as
    long as the result or that path object is kept (``path = surgery.compress(...).artefact`` stays
    valid while ``path`` is used); :meth:`save_artefact` copies it where you say. ``surgery compress``
    copies it into OUT rather than exporting the model again.
    """

    def __init__(self, model: nn.Module, report: CompressReport, calibration: list[Any] | None = None,
                 artefact: Path | None = None) -> None:
        self.model = model
        self.report = report
        self.calibration = calibration or []
        self.artefact = artefact

    @property
    def candidates(self) -> list[CandidateResult]:
        return self.report.candidates

    def save_artefact(self, out_dir: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Copy the winner's artefact (the judged files, byte for byte) to ``out_dir``, atomically; returns it.

        ``out_dir`` follows the rule of every output (:func:`surgery.persist.atomic.output_problem`):
        new or empty, or with ``overwrite`` a directory surgery wrote whole.

        Example:
            >>> import tempfile
            >>> report = CompressReport.model_construct(runtime="onnxruntime")
            >>> held = KeptDirectory.take(Path(tempfile.mkdtemp()))
            >>> _ = (held / "model.onnx").write_bytes(b"graph")
            >>> out = CompressResult(nn.Identity(), report, artefact=held).save_artefact(Path(tempfile.mkdtemp()) / "a")
            >>> (out / "model.onnx").read_bytes()
            b'graph'
        """
        if self.artefact is None:
            raise ValueError(f"this result has no runtime artefact: runtime {self.report.runtime} serves the "
                             "PyTorch model itself (result.model)")
        with atomic_directory(out_dir, overwrite=overwrite) as tmp:
            shutil.copytree(self.artefact, tmp, dirs_exist_ok=True)
        return Path(out_dir).expanduser().resolve()

    def __iter__(self) -> Any:  # model, report, candidates = surgery.compress(...)
        return iter((self.model, self.report, self.candidates))
