"""``ExportConfig``: every setting of an export in one validated object, and :func:`export`, the one export verb.

The CLI (``surgery export``) and the Python API build the same object; it is validated once, here:
an unknown field, an unknown runtime, or a setting that belongs to another runtime (``--opset`` for
OpenVINO, ``--int8-fp32`` without ONNX Runtime int8 ...) is refused in one line naming it.

:func:`export` writes the runtime's artefact with the tokenizer next to it (``format="graph"``) or as a
directory stock sentence-transformers loads (``format="sentence-transformers"``): the ONNX graph through
:func:`surgery.deploy.export.export_onnx`, the OpenVINO IR through
:func:`surgery.deploy.openvino_export.export_openvino`, and any other registered runtime (``torch-bf16``,
a third party's) through its own :meth:`~surgery.runtimes.base.Runtime.write_artefact`.

Example:
    >>> ExportConfig(runtime="openvino-int8").runtime
    'openvino-int8'
    >>> ExportConfig(runtime="openvino", opset=17)
    Traceback (most recent call last):
    ...
    pydantic_core._pydantic_core.ValidationError: 1 validation error for ExportConfig
      Value error, opset belongs to the ONNX Runtime runtimes (onnxruntime, onnxruntime-int8); drop it ...
    >>> ExportConfig(runtime="onnx-int8")
    Traceback (most recent call last):
    ...
    pydantic_core._pydantic_core.ValidationError: 1 validation error for ExportConfig
    runtime
      Value error, runtime 'onnx-int8' is not one of torch, torch-bf16, ...
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from surgery.core.errors import ConfigError
from surgery.deploy.names import CALIBRATION_TEXTS, SMOOTH_ALPHA, TASKS
from surgery.runtimes.registry import runtime_names

if TYPE_CHECKING:
    import torch
    from torch import nn

#: What ``format`` may be: the runtime's own artefact directory, or a sentence-transformers directory.
FORMATS = ("graph", "sentence-transformers")
ONNX_RUNTIMES = ("onnxruntime", "onnxruntime-int8")
OPENVINO_RUNTIMES = ("openvino", "openvino-int8")
#: Settings that only the ONNX Runtime exports read, with their CLI spellings.
_ONNX_ONLY = {"opset": "--opset", "optimize": "--optimize", "fuse_attention": "--no-fuse-attention"}
_ORT_INT8_ONLY = {"per_tensor": "--per-tensor", "int8_fp32": "--int8-fp32", "int8_mode": "--int8-mode"}


class ExportConfig(BaseModel):
    """The settings of one export, for every runtime; validated once (unknown fields are refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime: str = Field(default="onnxruntime", description="a registered runtime name (surgery.runtimes)")
    format: Literal["graph", "sentence-transformers"] = Field(
        default="graph", description="graph: the runtime's artefact and the tokenizer; sentence-transformers: a "
        "directory stock SentenceTransformer(DIR, backend='onnx'|'openvino') loads (embedding models)")
    task: str = Field(default="auto", description=f"head to export: {', '.join(TASKS)}")
    calibration_texts: int = Field(default=CALIBRATION_TEXTS, ge=1, description="calibration texts sampled")
    smooth_alpha: float | None = Field(default=None, ge=0.0, le=1.0, description="SmoothQuant strength for the "
                                       f"int8 runtimes (default: onnxruntime-int8 {SMOOTH_ALPHA}, openvino-int8 "
                                       "NNCF's 0.95)")
    per_tensor: bool = Field(default=False, description="onnxruntime-int8: one weight scale per tensor")
    int8_fp32: tuple[str, ...] = Field(default=(), description="onnxruntime-int8: parts whose products stay fp32")
    int8_mode: Literal["dynamic", "static"] = Field(default="dynamic", description="onnxruntime-int8: activation "
                                                    "scales per batch (dynamic) or calibrated (static)")
    optimize: bool = Field(default=False, description="onnxruntime: write ORT's offline-optimized graph")
    fuse_attention: bool = Field(default=True, description="onnxruntime: attention as one fused operator")
    opset: int | None = Field(default=None, ge=7, description="onnxruntime: ONNX opset")
    batch: int = Field(default=4, ge=1, description="parity batch: sequences")
    seq: int = Field(default=32, ge=2, description="parity batch: tokens per sequence (padded)")
    tolerance: float = Field(default=1e-4, gt=0.0, description="largest fp32 max-abs difference accepted")
    threads: int | None = Field(default=None, ge=1, description="threads for the checks")
    max_length: int | None = Field(default=None, ge=2, description="tokens the saved tokenizer truncates at")
    overwrite: bool = False

    @field_validator("runtime")
    @classmethod
    def _known_runtime(cls, value: str) -> str:
        names = runtime_names()
        if value not in names:
            raise ValueError(f"runtime {value!r} is not one of {', '.join(names)}")
        return value

    @field_validator("task")
    @classmethod
    def _known_task(cls, value: str) -> str:
        if value not in TASKS:
            raise ValueError(f"task {value!r} is not one of {', '.join(TASKS)}")
        return value

    @model_validator(mode="after")
    def _settings_fit_the_runtime(self) -> ExportConfig:
        defaults = type(self).model_fields
        given = {name for name in (*_ONNX_ONLY, *_ORT_INT8_ONLY) if getattr(self, name) != defaults[name].default}
        if self.runtime not in ONNX_RUNTIMES and (wrong := sorted(given & set(_ONNX_ONLY))):
            raise ValueError(f"{wrong[0]} belongs to the ONNX Runtime runtimes ({', '.join(ONNX_RUNTIMES)}); drop it "
                             f"for {self.runtime!r} (CLI {_ONNX_ONLY[wrong[0]]})")
        if self.runtime != "onnxruntime-int8" and (wrong := sorted(given & set(_ORT_INT8_ONLY))):
            raise ValueError(f"{wrong[0]} belongs to --runtime onnxruntime-int8; drop it for {self.runtime!r} "
                             f"(CLI {_ORT_INT8_ONLY[wrong[0]]})")
        if self.smooth_alpha is not None and not self.runtime.endswith("-int8"):
            raise ValueError(f"smooth_alpha sets the int8 smoothing; {self.runtime!r} is not an int8 runtime")
        if self.format == "sentence-transformers":
            if self.runtime not in ONNX_RUNTIMES + OPENVINO_RUNTIMES:
                raise ValueError(f"format sentence-transformers writes an ONNX graph or an OpenVINO IR; runtime "
                                 f"{self.runtime!r} has neither (use format graph)")
            if self.task not in ("auto", "base") or self.optimize or self.opset is not None:
                raise ValueError("format sentence-transformers exports the encoder for sentence embeddings at the "
                                 "exporter's default opset; drop task, optimize and opset")
        return self


def export(model: nn.Module, out_dir: str | os.PathLike[str], config: ExportConfig | None = None, *,
           tokenizer: Any = None, calibration: Sequence[Mapping[str, torch.Tensor]] | None = None,
           data: Iterable[Mapping[str, torch.Tensor]] | None = None, sentence_config: Any = None) -> Any:
    """Export ``model`` to ``out_dir`` as ``config`` says; returns the export's report.

    ``calibration`` (tokenized batches of the user's texts) feeds the int8 runtimes; ``data`` (labelled
    batches) records the accuracy of PyTorch and of the artefact (classifiers, ONNX and OpenVINO).
    The report is :class:`~surgery.deploy.export.ExportReport` (ONNX Runtime),
    :class:`~surgery.deploy.openvino_export.OpenVinoExportReport` (OpenVINO) or the runtime's
    :class:`~surgery.runtimes.base.RuntimeArtefact` (any other runtime).

    Example:
        >>> import tempfile
        >>> from surgery.testing import TinySpec, tiny_model
        >>> out = Path(tempfile.mkdtemp()) / "graph"
        >>> report = export(tiny_model(TinySpec("bert")), out, ExportConfig(runtime="onnxruntime", seq=8))
        >>> report.int8, report.parity.max_abs_diff < 1e-4, (out / "model.onnx").is_file()
        (False, True, True)
    """
    from surgery.runtimes.registry import get_runtime

    config = config or ExportConfig()
    runtime = get_runtime(config.runtime)  # refuses an unavailable runtime in one line
    runtime.check_calibration(calibration)
    if calibration is not None and not runtime.needs_calibration:
        raise ConfigError(f"calibration texts set int8 activation scales; runtime {config.runtime!r} does not use "
                          "them: drop --calibration or pick an int8 runtime")
    int8 = config.runtime.endswith("-int8")
    if config.format == "sentence-transformers":
        from surgery.deploy.sentence_interop import export_sentence_transformers

        return export_sentence_transformers(model, out_dir, tokenizer=tokenizer, sentence_config=sentence_config,
                                            runtime="openvino" if config.runtime in OPENVINO_RUNTIMES else "onnx",
                                            int8=int8, per_channel=not config.per_tensor,
                                            int8_fp32=config.int8_fp32, calibration=calibration,
                                            smooth_alpha=_alpha(config), threads=config.threads,
                                            fuse_attention=config.fuse_attention, int8_mode=config.int8_mode,
                                            overwrite=config.overwrite)
    common = dict(tokenizer=tokenizer, task=config.task, int8=int8, calibration=calibration, batch=config.batch,
                  seq=config.seq, tolerance=config.tolerance, data=data, threads=config.threads,
                  overwrite=config.overwrite, max_length=config.max_length)
    if config.runtime in ONNX_RUNTIMES:
        from surgery.deploy.export import export_onnx

        return export_onnx(model, out_dir, per_channel=not config.per_tensor, int8_fp32=config.int8_fp32,
                           smooth_alpha=_alpha(config), optimize=config.optimize, opset=config.opset,
                           fuse_attention=config.fuse_attention, int8_mode=config.int8_mode, **common)
    if config.runtime in OPENVINO_RUNTIMES:
        from surgery.deploy.openvino_export import export_openvino

        return export_openvino(model, out_dir, smooth_quant_alpha=_alpha(config), **common)
    if data is not None:
        raise ConfigError(f"accuracy on --data is recorded by the ONNX and OpenVINO exports; runtime "
                          f"{config.runtime!r} does not: drop --data")
    return _write_other(runtime, model, Path(out_dir), config, tokenizer, calibration)


def _alpha(config: ExportConfig) -> Any:
    if config.smooth_alpha is not None:
        return config.smooth_alpha
    if config.runtime in OPENVINO_RUNTIMES:
        from surgery.deploy.openvino_export import SMOOTH_QUANT_ALPHA

        return SMOOTH_QUANT_ALPHA
    return SMOOTH_ALPHA


def _write_other(runtime: Any, model: nn.Module, out: Path, config: ExportConfig, tokenizer: Any,
                 calibration: Any) -> Any:
    """A registered runtime's own artefact, then the tokenizer beside it; written atomically."""
    from surgery.persist.model_io import atomic_directory

    with atomic_directory(out, overwrite=config.overwrite) as tmp:
        artefact = runtime.write_artefact(model, tmp / "artefact", task=config.task, calibration=calibration,
                                          threads=config.threads)
        for item in artefact.directory.iterdir():
            item.rename(tmp / item.name)
        artefact.directory.rmdir()
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    from dataclasses import replace

    return replace(artefact, directory=out.expanduser().resolve())
