"""``ExportConfig``: every setting of an export in one validated object, and :func:`export`, the one export verb.

The CLI (``surgery export``) and the Python API build the same object; it is validated once, here:
an unknown field, an unknown runtime, or a setting that belongs to another runtime (``--opset`` for
OpenVINO, ``--int8-fp32`` without ONNX Runtime int8 ...) is refused in one line naming it.

:func:`export` writes the runtime's artefact with the tokenizer next to it (``format="graph"``) or as a
directory stock sentence-transformers loads (``format="sentence-transformers"``). Which settings a runtime
reads, whether it is int8 and which sentence-transformers backend loads it are the runtime's own answers
(:class:`~surgery.runtimes.shared.runtime.Runtime`); the folder is written by the runtime's
:meth:`~surgery.runtimes.shared.runtime.Runtime.export`, the same for every runtime (built-in or a third party's):
its :meth:`~surgery.runtimes.shared.runtime.Runtime.write_artefact` with the settings it reads from this config
(:meth:`~surgery.runtimes.shared.runtime.Runtime.artefact_options`), the serving tokenizer and, given labelled
data, the accuracy of PyTorch and of the artefact.

Example:
    >>> ExportConfig(runtime="openvino-int8").runtime
    'openvino-int8'
    >>> ExportConfig(runtime="openvino", opset=17)
    Traceback (most recent call last):
    ...
    pydantic_core._pydantic_core.ValidationError: 1 validation error for ExportConfig
      Value error, opset belongs to the runtimes that read it (onnxruntime, onnxruntime-int8); drop it ...
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

from surgery.core.errors import ConfigError, as_field_error
from surgery.persist.config_values import MAX_BATCH, check_tolerance
from surgery.runtimes.runtime_registry import check_runtime_name, runtime_class, runtime_names
from surgery.runtimes.shared.names import CALIBRATION_TEXTS, TASKS

if TYPE_CHECKING:
    import torch
    from torch import nn


#: What ``format`` may be: the runtime's own artefact directory, or a sentence-transformers directory.
FORMATS = ("graph", "sentence-transformers")
#: Settings that only some runtimes read (their :attr:`~surgery.runtimes.shared.runtime.Runtime.export_settings`), with
#: their CLI spellings.
RUNTIME_SETTINGS = {"opset": "--opset", "optimize": "--optimize", "fuse_attention": "--no-fuse-attention",
                    "per_tensor": "--per-tensor", "int8_fp32": "--int8-fp32", "int8_mode": "--int8-mode"}


#: The largest block ``pad_to_multiple_of`` takes (tokens): padding never adds more than an eighth of a batch's
#: length, so a larger block would only pad batches of 4,096 tokens and more.
MAX_PAD_MULTIPLE = 512


class ExportConfig(BaseModel):
    """The settings of one export, for every runtime; validated once (unknown fields are refused).

    Its bounds are the CLI's (``batch`` at most :data:`~surgery.persist.config_values.MAX_BATCH`, a finite
    positive ``tolerance`` ...); ``seq`` is checked against the model's positions when the model is known
    (:func:`export`), as the CLI checks it against the model directory.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime: str = Field(default="onnxruntime", description="a registered runtime name (surgery.runtimes)")
    format: Literal["graph", "sentence-transformers"] = Field(
        default="graph", description="graph: the runtime's artefact and the tokenizer; sentence-transformers: a "
        "directory stock SentenceTransformer(DIR, backend='onnx'|'openvino') loads (embedding models)")
    task: str = Field(default="auto", description=f"head to export: {', '.join(TASKS)}")
    calibration_texts: int = Field(default=CALIBRATION_TEXTS, ge=1, description="calibration texts sampled")
    smooth_alpha: float | None = Field(default=None, ge=0.0, le=1.0, description="SmoothQuant strength for the "
                                       "int8 runtimes (default: the runtime's own)")
    per_tensor: bool = Field(default=False, description="onnxruntime-int8: one weight scale per tensor")
    int8_fp32: tuple[str, ...] = Field(default=(), description="onnxruntime-int8: parts whose products stay fp32")
    int8_mode: Literal["dynamic", "static"] = Field(default="dynamic", description="onnxruntime-int8: activation "
                                                    "scales per batch (dynamic) or calibrated (static)")
    optimize: bool = Field(default=False, description="onnxruntime: write ORT's offline-optimized graph")
    fuse_attention: bool = Field(default=True, description="onnxruntime: attention as one fused operator")
    opset: int | None = Field(default=None, ge=7, description="onnxruntime: ONNX opset")
    batch: int = Field(default=4, ge=1, le=MAX_BATCH, description="parity batch: sequences")
    seq: int = Field(default=32, ge=2, description="parity batch: tokens per sequence (padded; at most the "
                     "model's positions)")
    tolerance: float = Field(default=1e-4, description="fp32 parity: the largest max-abs difference accepted is "
                             "tolerance x max(1, largest |PyTorch output| on real tokens) (finite, positive)")
    threads: int | None = Field(default=None, ge=1, description="threads for the checks")
    max_length: int | None = Field(default=None, ge=2, description="tokens the saved tokenizer truncates at")
    pad_to_multiple_of: int | Literal["auto"] | None = Field(
        default=None, description="graph runtimes: the served model pads each batch to a multiple of this many tokens "
        "(where that adds at most an eighth of its length); auto: the artefact is timed at the calibration texts' or "
        "the data's length as it is and padded, and a multiple is recorded only where it was measured to pay")
    overwrite: bool = False

    @field_validator("runtime")
    @classmethod
    def _known_runtime(cls, value: str) -> str:
        with as_field_error():
            return check_runtime_name(value)

    @field_validator("task")
    @classmethod
    def _known_task(cls, value: str) -> str:
        if value not in TASKS:
            raise ValueError(f"task {value!r} is not one of {', '.join(TASKS)}")
        return value

    @field_validator("tolerance")
    @classmethod
    def _finite_tolerance(cls, value: float) -> float:
        # inf would turn the fp32 parity gate off and NaN compares false with everything: both refused, as the CLI does.
        with as_field_error():
            return check_tolerance(value)

    @model_validator(mode="after")
    def _settings_fit_the_runtime(self) -> ExportConfig:
        runtime = _runtime_class(self.runtime)
        defaults = type(self).model_fields
        for name, flag in RUNTIME_SETTINGS.items():
            if getattr(self, name) != defaults[name].default and name not in runtime.export_settings:
                readers = [n for n in runtime_names() if name in getattr(_runtime_class(n, None), "export_settings",
                                                                          ())]
                raise ValueError(f"{name} belongs to the runtimes that read it ({', '.join(readers) or 'none'}); drop "
                                 f"it for {self.runtime!r} (CLI {flag})")
        if self.pad_to_multiple_of is not None:
            if (refused := runtime.padding_refused()) is not None:
                raise ValueError(refused)
            if self.format == "sentence-transformers":
                raise ValueError("pad_to_multiple_of pads batches in surgery's served model; stock "
                                 "sentence-transformers runs the artefact as given: use format graph, or drop it")
            if self.pad_to_multiple_of != "auto" and not 2 <= self.pad_to_multiple_of <= MAX_PAD_MULTIPLE:
                raise ValueError(f"pad_to_multiple_of must be auto or a whole number from 2 to {MAX_PAD_MULTIPLE} "
                                 f"(tokens), got {self.pad_to_multiple_of}")
        if self.smooth_alpha is not None and runtime.precision != "int8":
            raise ValueError(f"smooth_alpha sets the int8 smoothing; {self.runtime!r} is not an int8 runtime")
        if self.format == "sentence-transformers":
            if runtime.sentence_backend is None:
                raise ValueError(f"format sentence-transformers writes an artefact sentence-transformers loads (an "
                                 f"ONNX graph or an OpenVINO IR); runtime {self.runtime!r} has none (use format graph)")
            if self.task not in ("auto", "base") or self.optimize or self.opset is not None:
                raise ValueError("format sentence-transformers exports the encoder for sentence embeddings at the "
                                 "exporter's default opset; drop task, optimize and opset")
        return self


def _runtime_class(name: str, default: Any = ...) -> Any:
    """The runtime class of ``name`` (its class attributes import no torch); a broken plugin is a ValueError."""
    try:
        return runtime_class(name)
    except ConfigError as exc:
        if default is not ...:
            return default
        raise ValueError(str(exc)) from None


def export(model: nn.Module, out_dir: str | os.PathLike[str], config: ExportConfig | None = None, *,
           tokenizer: Any = None, calibration: Sequence[Mapping[str, torch.Tensor]] | None = None,
           data: Iterable[Mapping[str, torch.Tensor]] | None = None, sentence_config: Any = None) -> Any:
    """Export ``model`` to ``out_dir`` as ``config`` says; returns the export's report.

    ``calibration`` (tokenized batches of the user's texts) feeds the int8 runtimes; ``data`` (labelled
    batches) records the accuracy of PyTorch and of the artefact (sequence classifiers), for every runtime.
    The runtime writes its artefact (:meth:`~surgery.runtimes.shared.runtime.Runtime.export`); the report is
    :class:`~surgery.runtimes.onnx.onnx_graph.ExportReport` (ONNX Runtime),
    :class:`~surgery.runtimes.openvino.openvino_ir.OpenVinoExportReport` (OpenVINO) or the runtime's
    :class:`~surgery.runtimes.shared.runtime.RuntimeArtefact` (any other runtime).

    Example:
        >>> import tempfile
        >>> from surgery.testing import TinySpec, tiny_model
        >>> out = Path(tempfile.mkdtemp()) / "graph"
        >>> report = export(tiny_model(TinySpec("bert")), out, ExportConfig(runtime="onnxruntime", seq=8))
        >>> report.int8, report.parity.max_abs_diff < 1e-4, (out / "model.onnx").is_file()
        (False, True, True)
    """
    from surgery.persist.config_values import check_length
    from surgery.runtimes.runtime_registry import get_runtime

    config = config or ExportConfig()
    runtime = get_runtime(config.runtime)  # refuses an unavailable runtime in one line
    runtime.check_calibration(calibration)
    if calibration is not None and not runtime.needs_calibration:
        raise ConfigError(f"calibration texts set int8 activation scales; runtime {config.runtime!r} does not use "
                          "them: drop --calibration or pick an int8 runtime")
    if getattr(model, "config", None) is not None:  # the CLI checks --seq against the model directory the same way
        check_length(model.config, config.seq, "seq", "the model")
    if config.format == "sentence-transformers":
        from surgery.runtimes.sentence_interop import export_sentence_transformers

        return export_sentence_transformers(model, out_dir, tokenizer=tokenizer, sentence_config=sentence_config,
                                            backend=runtime.sentence_backend or "", int8=runtime.int8,
                                            per_channel=not config.per_tensor, int8_fp32=config.int8_fp32,
                                            calibration=calibration, smooth_alpha=runtime.smooth_alpha(config),
                                            threads=config.threads, fuse_attention=config.fuse_attention,
                                            int8_mode=config.int8_mode, overwrite=config.overwrite,
                                            precision=getattr(runtime, "inference_precision", "f32"))
    return runtime.export(model, Path(out_dir), config, tokenizer=tokenizer, calibration=calibration, data=data)
