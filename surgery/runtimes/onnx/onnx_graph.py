"""The ONNX graph of any surgered model, with a parity check against PyTorch, optional int8 and graph optimization.

:func:`write_onnx` writes the graph, the artefact of the ONNX Runtime runtimes
(:mod:`surgery.runtimes.onnx.onnx_runtime`), which needs only ``onnxruntime`` to serve:

* ``model.onnx``: one self-contained graph with dynamic batch and sequence axes, exported by
  ``torch.onnx.export(..., dynamo=True)`` (the TorchScript exporter cannot trace SHRP's routed layers
  and is deprecated); with ``int8`` it is the dynamically quantized graph;
* ``surgery-onnx.json``: input and output names, opset, exporter and library versions, the task,
  the parity check (maximum absolute difference and cosine of ONNX Runtime against PyTorch on a
  padded batch), the int8 drift and accuracy, the optimizer's fused operators and timings.

The deployable folder around it (the tokenizer, accuracy on data) is the runtime's
:meth:`~surgery.runtimes.shared.runtime.Runtime.write_folder`, which
:func:`surgery.runtimes.onnx.onnx_export.export_onnx` calls. The export fails with a one-line
:class:`ExportParityError` when the fp32 graph differs from PyTorch by more than ``tolerance`` times the output's
magnitude (at least 1; :func:`~surgery.runtimes.shared.graph_export.check_parity`); quantization error is recorded,
never a failure.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from pydantic import Field
from torch import nn

from surgery.core.errors import ConfigError
from surgery.core.manifest import int8_float_of
from surgery.persist.config_values import check_model_argument, check_opset
from surgery.persist.model_io import atomic_directory
from surgery.runtimes.onnx.fused_attention import FusedAttentionInfo, fused_attention, fusion_info
from surgery.runtimes.onnx.onnx_session import (
    OnnxRuntimeModel,
    op_counts,
    optimize_graph,
    quantize_int8,
    require_onnx,
)
from surgery.runtimes.onnx.static_int8 import check_int8_mode, quantize_static_int8
from surgery.runtimes.shared.graph_export import (
    Agreement,
    ExportParityError,
    ExportRecord,
    agreement,
    check_export_settings,
    check_parity,
    export_record,
    quiet_loggers,
)
from surgery.runtimes.shared.names import INFO_NAME, ONNX_NAME
from surgery.runtimes.shared.parity import reference_batch
from surgery.runtimes.shared.smooth import DEFAULT_ALPHA, SmoothingInfo, smooth_linears
from surgery.runtimes.shared.weight_products import INT8_FP32_PARTS, float_group_modules, part_modules


class ExportReport(ExportRecord):
    """What :func:`write_onnx` wrote and measured; saved as ``surgery-onnx.json`` next to the graph."""

    record_file: ClassVar[str] = INFO_NAME
    accuracy_field: ClassVar[str] = "accuracy_onnx"

    onnx_file: str = ONNX_NAME
    opset: int
    exporter: str
    parity: Agreement = Field(description="fp32 ONNX Runtime against fp32 PyTorch")
    fused_attention: FusedAttentionInfo | None = Field(default=None, description="the layers whose attention is "
                                                       "one fused operator (None: fusion turned off)")
    operators: dict[str, int] = Field(default_factory=dict, description="operator counts of the written graph")
    optimized: dict[str, int] | None = Field(default=None, description="operator counts after ORT's optimizer")
    optimized_parity: Agreement | None = None
    int8: bool = False
    int8_mode: str | None = Field(default=None, description="dynamic: activation scales per batch at run time; "
                                  "static: calibrated on the calibration texts (QDQ); None: no int8")
    int8_per_channel: bool | None = Field(default=None, description="int8 weight scales per output channel "
                                          "(False: per tensor; None: no int8)")
    int8_fp32: list[str] = Field(default_factory=list, description="parts whose products stayed in fp32")
    int8_fp32_nodes: int = Field(default=0, description="weight products left in fp32 by int8_fp32 and int8_float")
    int8_float: list[str] = Field(default_factory=list, description="op groups of the model's recorded precision "
                                  "map, left in fp32")
    int8_smoothing: SmoothingInfo | None = Field(default=None, description="activation smoothing before int8 "
                                                 "(None: activations quantized as they are)")
    int8_drift: Agreement | None = Field(default=None, description="int8 ONNX Runtime against fp32 PyTorch, on "
                                         "the parity batch's real tokens (padded positions left out)")
    accuracy_torch: float | None = Field(default=None, description="fp32 PyTorch accuracy on the given data")
    accuracy_onnx: float | None = Field(default=None, description="accuracy of the written graph on the data")
    onnx_bytes: int
    export_seconds: float

    def served_agreement(self) -> Agreement:
        return self.int8_drift if self.int8_drift is not None else self.parity


def check_int8_fp32(parts: Sequence[str], int8: bool, what: str) -> None:
    """Refuse, in one line, an unknown part or parts to keep in fp32 without int8.

    Example:
        >>> check_int8_fp32(["mlp"], True, "export")
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: export: --int8-fp32 'mlp' is not one of attention, ffn, ffn-up, ffn-down
    """
    unknown = [p for p in parts if p not in INT8_FP32_PARTS]
    if unknown:
        raise ConfigError(f"{what}: --int8-fp32 {unknown[0]!r} is not one of {', '.join(INT8_FP32_PARTS)}")
    if parts and not int8:
        raise ConfigError(f"{what}: --int8-fp32 (parts kept in fp32) needs --int8")


def int8_fp32_scopes(module: nn.Module, parts: Sequence[str]) -> set[str]:
    """The exporter's name scopes of ``parts``' Linear modules once ``module`` is exported (the export
    wraps it as ``model``): what :func:`surgery.runtimes.onnx.onnx_session.quantize_int8` takes as ``keep_fp32``."""
    return _export_scopes(part_modules(module, parts))


def _export_scopes(modules: set[str]) -> set[str]:
    return {f"model.{name}" for name in modules}


def _torch_export(module: nn.Module, inputs: Mapping[str, torch.Tensor], path: Path, *, opset: int | None,
                  max_seq: int | None) -> None:
    batch = torch.export.Dim("batch", min=1)
    seq = torch.export.Dim("sequence", min=2, max=max_seq) if max_seq else torch.export.Dim("sequence", min=2)
    dynamic = {name: {0: batch, 1: seq} for name in inputs}
    kwargs: dict[str, Any] = {"opset_version": opset} if opset is not None else {}
    try:
        # The exporter prints progress to stdout and warns about axis names and tensors that routed layers
        # keep for inspection (last_probs); a library keeps that quiet. Failures still raise.
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(), \
                quiet_loggers("torch.onnx", "onnxscript", "onnx_ir", "torch.export", "torch._dynamo"):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module, args=(), kwargs=dict(inputs), f=str(path), dynamo=True, dynamic_shapes=dynamic,
                input_names=list(inputs), output_names=[module.output], external_data=False, verbose=False,
                **kwargs)
    except Exception as exc:  # the exporter raises many types; all mean "this graph could not be exported"
        detail = " ".join(str(exc).split())[:300]
        raise ExportParityError(f"export: torch.onnx.export(dynamo=True) failed: {detail}") from exc


def _max_positions(config: Any) -> int | None:
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if value else None


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import onnxscript
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__, "onnxscript": onnxscript.__version__}


def write_onnx(
    model: nn.Module,
    out_dir: str | os.PathLike[str],
    *,
    parity_tokenizer: Any = None,
    task: str = "auto",
    int8: bool = False,
    per_channel: bool = True,
    int8_fp32: Sequence[str] = (),
    calibration: Iterable[Mapping[str, torch.Tensor]] | None = None,
    smooth_alpha: float = DEFAULT_ALPHA,
    optimize: bool = False,
    batch: int = 4,
    seq: int = 32,
    tolerance: float = 1e-4,
    opset: int | None = None,
    threads: int | None = None,
    overwrite: bool = False,
    fuse_attention: bool = True,
    int8_mode: str = "dynamic",
) -> ExportReport:
    """Export ``model`` to ``out_dir/model.onnx``, check ONNX Runtime against PyTorch, optionally quantize: the graph
    and its record (``surgery-onnx.json``), never the tokenizer (:func:`surgery.runtimes.onnx.onnx_export.export_onnx`
    writes the deployable folder).

    Args:
        model: any supported model, surgered or not (in any float dtype; the graph is fp32).
        out_dir: a new or empty directory (written atomically).
        parity_tokenizer: builds the parity batch from sample sentences (the tokenizer is not saved here).
        task: ``auto``, ``base``, ``seq-cls`` or ``mlm`` (:func:`~surgery.runtimes.shared.graph_export.export_target`).
        int8: write ONNX Runtime's dynamically quantized graph; its drift from PyTorch is recorded.
        per_channel: with ``int8``, one weight scale per output channel (default) rather than per tensor.
        int8_fp32: with ``int8``, parts whose products stay in fp32 (:data:`INT8_FP32_PARTS`): mixed
            precision for models whose outputs int8 moves too far (see docs/deploy.md).
        calibration: with ``int8``, tokenized batches of the user's own texts (a few hundred texts);
            the activations are smoothed on them before quantization (:mod:`surgery.runtimes.shared.smooth`),
            which on all-MiniLM-L6-v2 lifted recall@10 against the fp32 embeddings from 0.85 to 0.92.
        smooth_alpha: SmoothQuant's migration strength for ``calibration`` (0 to 1).
        optimize: write the graph after ONNX Runtime's offline optimizations (fusions); checked again.
        batch, seq: shape of the parity batch (right-padded); the graph itself takes any shape.
        tolerance: fp32 parity, relative to the output's magnitude: the export fails when the max-abs
            difference exceeds ``tolerance * max(1, largest |PyTorch output| on real tokens)``.
        opset: ONNX opset (default: the exporter's).
        threads: ONNX Runtime threads for the checks (default: torch's).
        overwrite: replace a non-empty ``out_dir``.
        fuse_attention: write each layer's attention core as one ONNX Runtime ``MultiHeadAttention``
            operator with the layer's own head count (:mod:`surgery.runtimes.onnx.fused_attention`); layers
            whose family computes attention its own way stay MatMul + Softmax. False: the plain graph.
        int8_mode: with ``int8``, ``dynamic`` (activation scales per batch at run time) or ``static``
            (scales calibrated once on ``calibration``, after smoothing; :mod:`surgery.runtimes.onnx.static_int8`).

    Example:
        >>> import tempfile
        >>> import surgery
        >>> from surgery.strategies import HeadPruningStrategy
        >>> from surgery.testing import TinySpec, tiny_model
        >>> model = tiny_model(TinySpec("bert"))
        >>> _ = surgery.convert(model, HeadPruningStrategy(heads={0: [1, 2]}))
        >>> report = write_onnx(model, Path(tempfile.mkdtemp()) / "onnx", batch=2, seq=8)
        >>> report.parity.max_abs_diff < 1e-4, report.inputs, report.steps
        (True, ['input_ids', 'attention_mask', 'token_type_ids'], ['head-prune'])
    """
    check_model_argument(model, "export")
    require_onnx()
    check_export_settings(batch, seq, tolerance)
    check_opset(opset, "export: opset")
    check_int8_fp32(int8_fp32, int8, "export")
    if calibration is not None and not int8:
        raise ConfigError("export: calibration batches smooth the activations for int8; they need --int8")
    if calibration is not None:
        calibration = list(calibration)  # read twice with static int8: smoothing, then the activation ranges
    check_int8_mode(int8_mode, int8=int8, calibrated=calibration is not None)
    source_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    # Exported from the reference's fp32 copy: tracing leaves routed layers' inspection attributes (last_probs)
    # pointing at traced tensors, and ORT's CPU kernels are fp32, so a half-precision model is exported as fp32.
    ref = reference_batch(model, task, batch=batch, seq=seq, tokenizer=parity_tokenizer)
    module, wrapper, output, task, names, inputs, expected = (ref.module, ref.wrapper, ref.output, ref.task,
                                                               ref.names, ref.inputs, ref.expected)
    # The model's recorded precision map (compress's, surgery.core.manifest) is replayed: its groups stay fp32.
    float_groups = int8_float_of(model) if int8 else []
    fp32_modules = part_modules(module, int8_fp32) | set(float_group_modules(module, float_groups))
    smoothing = None
    if calibration is not None:
        # Smoothed before the trace, so the fp32 parity check below also proves it changed nothing.
        feeds = ({k: v for k, v in b.items() if k in names} for b in calibration)
        smoothing = smooth_linears(module, feeds, alpha=smooth_alpha, skip=fp32_modules)
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        path = tmp / ONNX_NAME
        start = time.perf_counter()
        with fused_attention(module) if fuse_attention else contextlib.nullcontext() as recorder:
            _torch_export(wrapper, inputs, path, opset=opset, max_seq=_max_positions(module.config))
        if opset is not None and _opset_of(path) != opset:  # the exporter keeps its own when conversion fails
            raise ExportParityError(f"export: the exporter wrote opset {_opset_of(path)}, not the {opset} "
                                    "asked for (it could not convert this graph); leave --opset out or pick "
                                    "another")
        fusion = fusion_info(module, recorder) if fuse_attention else None
        seconds = time.perf_counter() - start

        def session(graph: Path) -> OnnxRuntimeModel:
            return OnnxRuntimeModel(graph, config=module.config, output=output, threads=threads, task=task)

        runtime = session(path)
        parity = check_parity(expected, runtime, inputs, tolerance=tolerance)
        optimized = optimized_parity = drift = None
        fp32_nodes: list[str] = []
        if int8:  # before optimizing: the quantizer's shape inference rejects ORT's fused contrib ops
            quantized = tmp / "model.int8.onnx"
            if int8_mode == "static" and calibration is not None:
                fp32_nodes = quantize_static_int8(path, quantized, calibration, input_names=names,
                                                  per_channel=per_channel, keep_fp32=_export_scopes(fp32_modules))
            else:
                fp32_nodes = quantize_int8(path, quantized, per_channel=per_channel,
                                           keep_fp32=_export_scopes(fp32_modules))
            os.replace(quantized, path)
            runtime = session(path)
            drift = agreement(expected, getattr(runtime(**inputs), output), inputs.get("attention_mask"))
        if optimize:
            fused = tmp / "model.optimized.onnx"
            optimized = optimize_graph(path, fused, threads=threads)
            runtime = session(fused)
            if int8:
                drift = agreement(expected, getattr(runtime(**inputs), output), inputs.get("attention_mask"))
            else:
                optimized_parity = check_parity(expected, runtime, inputs, tolerance=tolerance,
                                                what="the ORT-optimized graph", hint="export without --optimize")
            os.replace(fused, path)
        report = ExportReport(
            **export_record(model, module, task=task, source_dtype=source_dtype, inputs=names, output=output,
                            versions=_versions(), parity_batch=(batch, seq), tolerance=tolerance),
            opset=_opset_of(path), exporter="torch.onnx.export(dynamo=True)",
            parity=parity, fused_attention=fusion, operators=op_counts(path),
            optimized=optimized, optimized_parity=optimized_parity,
            int8=int8, int8_mode=int8_mode if int8 else None,
            int8_per_channel=per_channel if int8 else None, int8_fp32=list(int8_fp32),
            int8_float=float_groups, int8_fp32_nodes=len(fp32_nodes), int8_smoothing=smoothing, int8_drift=drift,
            onnx_bytes=path.stat().st_size, export_seconds=seconds,
        )
        report.write(tmp)
        del runtime  # release the session's file handles before the directory is renamed
    return report


def _opset_of(path: Path) -> int:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return next((int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)


def read_export_info(directory: str | os.PathLike[str]) -> ExportReport:
    """The :class:`ExportReport` saved next to an exported graph."""
    return ExportReport.read(directory)
