"""The OpenVINO IR of any surgered model, with a parity check against PyTorch, and NNCF int8; the model it serves.

:func:`write_openvino` writes the artefact of the OpenVINO runtimes (:mod:`surgery.runtimes.openvino.openvino_runtime`),
which needs only ``openvino`` to serve (the deployable folder around it, tokenizer and accuracy on data, is
:meth:`~surgery.runtimes.shared.runtime.Runtime.write_folder`'s, which
:func:`surgery.runtimes.openvino.openvino_export.export_openvino` calls):

* ``openvino_model.xml`` + ``openvino_model.bin``: the IR, converted by ``openvino.convert_model`` from the
  surgery model itself (uneven heads and FFN widths are just the shapes of its weights), with dynamic
  batch and sequence dimensions and one output named ``last_hidden_state`` or ``logits``; with
  ``int8`` it is NNCF's post-training quantization of that IR (``model_type=TRANSFORMER``, SmoothQuant,
  fast bias correction: the recipe optimum-intel and sentence-transformers' static OpenVINO export use)
  calibrated on the user's texts;
* ``config.json``: the layout optimum-intel's ``OVModelFor*`` classes
  and sentence-transformers' ``backend="openvino"`` load;
* ``surgery-openvino.json``: inputs, output, versions, the fp32 parity check (OpenVINO held to f32
  against PyTorch on a padded batch), the int8 or bf16 drift and the NNCF settings.

OpenVINO's CPU plugin runs an fp32 IR in bf16 on CPUs that have bf16 instructions unless told not to;
:class:`OpenVinoModel` runs it at the precision it was checked at (``INFERENCE_PRECISION_HINT``: f32,
or bf16 for ``precision="bf16"``), and to ``threads`` (``INFERENCE_NUM_THREADS``, pinning off) so
timings side by side are fair. The IR itself carries that precision in its runtime options
(``rt_info["runtime_options"]["INFERENCE_PRECISION_HINT"]``, :data:`PRECISION_KEY`), the place OpenVINO
keeps the settings a model is meant to be compiled with, so a reader of the bare IR knows it too. OpenVINO
2026.4's CPU plugin does not apply that key by itself: a plain ``compile_model`` runs its default, bf16 on a
bf16 CPU (what ``openvino-bf16`` wants; the f32 IR served outside surgery needs the f32 hint passed:
experiments/openvino_bf16).

openvino and nncf are the ``openvino`` extra (``pip install 'encoder-surgery[openvino]'``).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import importlib.util
import io
import os
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from transformers.modeling_outputs import BaseModelOutput, MaskedLMOutput, SequenceClassifierOutput

from surgery.anatomy.empty_ffn import fill_empty_ffns_
from surgery.core.errors import ConfigError, MissingDependencyError
from surgery.core.manifest import int8_float_of
from surgery.persist.model_io import atomic_directory
from surgery.runtimes.openvino.vendor_telemetry import import_openvino, vendor_telemetry_held_off
from surgery.runtimes.shared.alignment import pad_batch, per_token_output, trim
from surgery.runtimes.shared.graph_export import (
    Agreement,
    ExportParityError,
    ExportRecord,
    agreement,
    check_export_settings,
    check_parity,
    export_record,
    export_target,
    graph_feeds,
    quiet_loggers,
)
from surgery.runtimes.shared.parity import reference_batch
from surgery.runtimes.shared.weight_products import float_group_modules

#: The IR file names optimum-intel and sentence-transformers' OpenVINO backend look for.
OV_XML = "openvino_model.xml"
OV_BIN = "openvino_model.bin"
OV_INFO = "surgery-openvino.json"
OPENVINO_HINT = "pip install 'encoder-surgery[openvino]'"
#: NNCF's SmoothQuant strength for the products (its own default for transformers, recorded in the report).
SMOOTH_QUANT_ALPHA = 0.95
#: Calibration texts of one length NNCF reads as one item at most (:func:`length_groups`): a bound on memory at long
#: lengths, not on speed.
CALIBRATION_GROUP = 32
#: Where the IR keeps the precision it is meant to run at: OpenVINO's runtime options in the model's rt_info.
PRECISION_KEY = ("runtime_options", "INFERENCE_PRECISION_HINT")
#: The inference precisions an fp32 IR is exported for (``INFERENCE_PRECISION_HINT`` values).
HINT_PRECISIONS = ("f32", "bf16")
#: The least per-example cosine (real tokens) a bf16 run may keep against fp32 PyTorch on the parity batch.
#: bf16 keeps 8 bits of mantissa: measured on the tiny test models and on all-MiniLM-L6-v2
#: (experiments/openvino_bf16), its cosine stays far above this; a broken graph or a wrong dtype falls far below.
BF16_MIN_COSINE = 0.999


def require_openvino(feature: str = "OpenVINO export", *, int8: bool = False) -> None:
    """Raise a one-line :class:`MissingDependencyError` unless openvino (and, for ``int8``, nncf) import.

    Example:
        >>> require_openvino()  # silent when the extra is installed
    """
    missing = [name for name in ("openvino", *(("nncf",) if int8 else ())) if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingDependencyError(f"{feature} needs {', '.join(missing)} (not installed); install the extra: "
                                     f"{OPENVINO_HINT}")


def compile_config(threads: int | None, precision: str = "f32") -> dict[str, Any]:
    """The CPU plugin settings every OpenVINO model here runs with: ``precision``, ``threads`` threads, no pinning.

    Example:
        >>> compile_config(1)["INFERENCE_PRECISION_HINT"], compile_config(1)["INFERENCE_NUM_THREADS"]
        ('f32', 1)
        >>> compile_config(1, "bf16")["INFERENCE_PRECISION_HINT"]
        'bf16'
    """
    if precision not in HINT_PRECISIONS:
        raise ConfigError(f"OpenVINO precision {precision!r} is not one of {', '.join(HINT_PRECISIONS)}")
    return {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": int(threads or torch.get_num_threads()),
            "ENABLE_CPU_PINNING": False, "PERFORMANCE_HINT": "LATENCY"}


def ir_precision(model: Any) -> str | None:
    """The inference precision an IR (a read ``openvino.Model``) carries in its runtime options; None if none.

    IRs written before surgery recorded it carry none (they were f32, as :class:`OpenVinoModel` runs them).
    """
    if not model.has_rt_info(list(PRECISION_KEY)):
        return None
    return str(model.get_rt_info(list(PRECISION_KEY)).value)


def served_precision(compiled: Any) -> str:
    """The precision OpenVINO compiled ``compiled`` for (``f32``, ``bf16``): what it will really compute in."""
    return str(compiled.get_property("INFERENCE_PRECISION_HINT").to_string())


class OpenVinoModel(nn.Module):
    """An OpenVINO IR compiled for the CPU, callable like the Hugging Face model it came from.

    ``model(input_ids=..., attention_mask=...)`` returns ``.last_hidden_state`` or ``.logits`` as torch
    tensors (``MaskedLMOutput`` for an ``mlm`` task), like :class:`surgery.runtimes.onnx.onnx_session.OnnxRuntimeModel`,
    so evaluation and benchmark code written for torch models runs unchanged. :func:`export_openvino`'s
    docstring shows it in use.
    """

    runtime = "openvino"

    def __init__(self, path: str | os.PathLike[str], *, config: Any, output: str | None = None,
                 threads: int | None = None, task: str | None = None, precision: str | None = None,
                 pad_to_multiple_of: int | None = None) -> None:
        super().__init__()
        require_openvino("OpenVINO inference")
        ov = import_openvino()

        self.path = Path(path)
        self.config = config
        core = ov.Core()
        model = core.read_model(str(self.path))
        self.input_names = [port.get_any_name() for port in model.inputs]
        self.output = output or next(iter(model.outputs[0].get_names()), "last_hidden_state")
        self.task = task
        #: batches are padded to a multiple of this where it pays (measured: surgery.runtimes.shared.alignment)
        self.pad_to_multiple_of = pad_to_multiple_of
        # The precision the IR says it runs at (an IR from before that record: f32, as it was checked).
        self.compiled = core.compile_model(model, "CPU", compile_config(threads, precision or ir_precision(model)
                                                                        or "f32"))
        #: What OpenVINO really computes in (a bf16 hint on a CPU without bf16 products falls back to f32).
        self.precision = served_precision(self.compiled)
        self.request = self.compiled.create_infer_request()
        # No weights live in torch; this empty parameter only tells device-aware callers "cpu".
        self.device_anchor = nn.Parameter(torch.empty(0), requires_grad=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, **_: Any) -> Any:
        given, length = pad_batch({"input_ids": input_ids, "attention_mask": attention_mask,
                                   "token_type_ids": token_type_ids}, self.pad_to_multiple_of)
        result = self.request.infer(graph_feeds(given, self.input_names))
        tensor = trim(torch.from_numpy(result[self.compiled.outputs[0]].copy()), length,
                      per_token_output(self.output, self.task))
        if self.output == "logits" and self.task == "mlm":
            return MaskedLMOutput(logits=tensor)
        if self.output == "logits":
            return SequenceClassifierOutput(logits=tensor)
        return BaseModelOutput(last_hidden_state=tensor)

    def release_memory(self) -> None:
        """Free the compiled model's intermediate buffers (its next call allocates them again): what timing many
        models side by side at long inputs does to stay within memory (:class:`surgery.measure.timing.BufferBound`)."""
        self.compiled.release_memory()

    def file_bytes(self) -> int:
        """Size of the IR (``.xml`` and ``.bin``)."""
        return self.path.stat().st_size + self.path.with_suffix(".bin").stat().st_size


class QuantizationInfo(BaseModel):
    """How NNCF quantized the IR (what a reader needs to reproduce it)."""

    model_config = ConfigDict(extra="forbid")

    method: str = "nncf.quantize (post-training, static activation scales)"
    model_type: str = "transformer"
    preset: str = Field(description="NNCF's preset for the transformer model type (mixed: symmetric weights, "
                        "asymmetric activations)")
    smooth_quant_alpha: float
    fast_bias_correction: bool = True
    calibration_texts: int = Field(description="calibration examples (each text unpadded)")
    calibration_tokens: int
    calibration_items: int | None = Field(None, description="what NNCF ran: texts of one length stacked, at most "
                                          "CALIBRATION_GROUP each, with batchwise statistics (each text's its own); "
                                          "None: one text an item (before 0.2)")


class OpenVinoExportReport(ExportRecord):
    """What :func:`write_openvino` wrote and measured; saved as ``surgery-openvino.json`` next to the IR."""

    record_file: ClassVar[str] = OV_INFO
    record_kind: ClassVar[str] = "OpenVINO export record"
    accuracy_field: ClassVar[str] = "accuracy_openvino"

    xml_file: str = OV_XML
    converter: str = "openvino.convert_model(torch module, example_input=...)"
    precision: str = Field(description="f32, bf16 (the f32 IR run with the bf16 hint), or int8 (NNCF)")
    inference_precision_hint: str = Field(default="f32", description="what the IR is compiled with (also in its "
                                          "rt_info runtime_options)")
    parity: Agreement = Field(description="the fp32 IR in OpenVINO (f32) against fp32 PyTorch")
    int8: bool = False
    int8_quantization: QuantizationInfo | None = None
    int8_float: list[str] = Field(default_factory=list, description="op groups left out of quantization (the "
                                  "precision map; they run in inference_precision_hint)")
    int8_float_nodes: int = Field(default=0, description="IR products NNCF left out of quantization for int8_float")
    int8_drift: Agreement | None = Field(default=None, description="the int8 IR against fp32 PyTorch, on the "
                                         "parity batch's real tokens (padded positions left out)")
    bf16_drift: Agreement | None = Field(default=None, description="the IR run in bf16 against fp32 PyTorch, on "
                                         "the parity batch's real tokens")
    bf16_min_cosine: float | None = Field(default=None, description="the least per-example cosine accepted for "
                                          "bf16")
    accuracy_torch: float | None = None
    accuracy_openvino: float | None = None
    ir_bytes: int
    export_seconds: float
    quantize_seconds: float | None = None

    def served_agreement(self) -> Agreement:
        return self.int8_drift or self.bf16_drift or self.parity


def read_openvino_info(directory: str | os.PathLike[str]) -> OpenVinoExportReport:
    """The :class:`OpenVinoExportReport` saved next to an exported IR."""
    return OpenVinoExportReport.read(directory)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # The TorchScript tracer behind convert_model warns about every Python branch on a shape, and NNCF
    # prints progress bars; a library keeps that quiet. Failures still raise. Both tools also report usage
    # unless the user opted out; surgery's calls are not the user's (vendor_telemetry).
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings(), quiet_loggers("nncf", "openvino", "torch.jit"), vendor_telemetry_held_off():
        warnings.simplefilter("ignore")
        yield


def convert_to_ir(wrapper: nn.Module, inputs: Mapping[str, torch.Tensor]) -> Any:
    """``openvino.convert_model`` of ``wrapper`` (a :class:`SingleOutput`), dynamic batch and sequence, int64 inputs."""
    ov = import_openvino()

    shapes = [(name, ov.PartialShape([-1, -1]), ov.Type.i64) for name in inputs]
    try:
        with _quiet(), torch.no_grad():
            model = ov.convert_model(wrapper, example_input=dict(inputs), input=shapes)
    except Exception as exc:  # the converter raises many types; all mean "this model could not be converted"
        detail = " ".join(str(exc).split())[:300]
        raise ExportParityError(f"export: openvino.convert_model failed: {detail}") from exc
    model.outputs[0].get_tensor().set_names({wrapper.output})
    return model


def calibration_examples(batches: Iterable[Mapping[str, torch.Tensor]], names: Sequence[str]) -> list[dict[str, Any]]:
    """Each text of tokenized ``batches`` on its own, padding cut off: NNCF's calibration items.

    One text per item, as optimum-intel calibrates (batch size 1): padded positions would otherwise
    enter the activation ranges.

    Example:
        >>> batch = {"input_ids": torch.tensor([[2, 5, 0], [2, 6, 7]]), "attention_mask": torch.tensor([[1, 1, 0],
        ...          [1, 1, 1]])}
        >>> [item["input_ids"].tolist() for item in calibration_examples([batch], ["input_ids", "attention_mask"])]
        [[[2, 5]], [[2, 6, 7]]]
    """
    items = []
    for batch in batches:
        feeds = graph_feeds(batch, names)
        lengths = feeds["attention_mask"].sum(-1) if "attention_mask" in feeds else None
        for row in range(feeds["input_ids"].shape[0]):
            keep = int(lengths[row]) if lengths is not None else feeds["input_ids"].shape[1]
            items.append({name: value[row: row + 1, :keep] for name, value in feeds.items()})
    return items


def length_groups(items: Sequence[Mapping[str, Any]], most: int = CALIBRATION_GROUP) -> list[dict[str, Any]]:
    """Calibration texts (:func:`calibration_examples`: one each, unpadded) of the same length stacked into one item,
    at most ``most`` a item, in the order each length first appears.

    No padding enters either way, and with NNCF's batchwise statistics each text's statistics stay its own; NNCF's
    statistics passes then run one inference and one Python round of bookkeeping per group, not per text (the suite's
    320 calibration texts a task ran as 50-53 items: experiments/probes/int8_length_groups.py).

    Example:
        >>> items = [{"input_ids": np.array([[2, 5]])}, {"input_ids": np.array([[2, 6, 7]])},
        ...          {"input_ids": np.array([[2, 8]])}]
        >>> [tuple(group["input_ids"].shape) for group in length_groups(items)]
        [(2, 2), (1, 3)]
    """
    by_length: dict[int, list[Mapping[str, Any]]] = {}
    for item in items:
        by_length.setdefault(int(item["input_ids"].shape[-1]), []).append(item)
    return [{name: np.concatenate([one[name] for one in same[start:start + most]], axis=0) for name in same[0]}
            for same in by_length.values() for start in range(0, len(same), max(most, 1))]


def quantize(model: Any, items: Sequence[Mapping[str, Any]], *, alpha: float = SMOOTH_QUANT_ALPHA,
             ignored: Sequence[str] = ()) -> tuple[Any, QuantizationInfo]:
    """NNCF post-training int8 of the IR ``model`` on ``items`` (:func:`calibration_examples`), transformer recipe.

    ``ignored`` names IR nodes NNCF leaves out of quantization (``nncf.IgnoredScope``): they run in
    the compiled model's inference precision.
    """
    with _quiet():  # NNCF reports its own import too
        import nncf

        advanced = nncf.AdvancedQuantizationParameters(
            smooth_quant_alphas=nncf.AdvancedSmoothQuantParameters(matmul=alpha), batchwise_statistics=True)
        scope = nncf.IgnoredScope(names=list(ignored)) if ignored else None
        groups = length_groups(items)
        quantized = nncf.quantize(model, nncf.Dataset(groups), model_type=nncf.ModelType.TRANSFORMER,
                                  subset_size=len(groups), fast_bias_correction=True, advanced_parameters=advanced,
                                  ignored_scope=scope)
    info = QuantizationInfo(preset="mixed", smooth_quant_alpha=alpha, calibration_texts=len(items),
                            calibration_tokens=int(sum(item["input_ids"].size for item in items)),
                            calibration_items=len(groups))
    return quantized, info


def check_bf16(expected: torch.Tensor, runtime: OpenVinoModel, inputs: Mapping[str, torch.Tensor], *,
               min_cosine: float = BF16_MIN_COSINE) -> Agreement:
    """The bf16 run's agreement with fp32 PyTorch on ``inputs``' real tokens; refused in one line when OpenVINO
    did not compile it for bf16 (a CPU without bf16 products) or when a per-example cosine falls below ``min_cosine``.
    """
    if runtime.precision != "bf16":
        raise ConfigError(f"export: OpenVINO compiled the IR for {runtime.precision}, not bf16: this CPU has no bf16 "
                          "products (avx512_bf16 or AMX); use --runtime openvino")
    found = agreement(expected, getattr(runtime(**inputs), runtime.output), inputs.get("attention_mask"))
    if not found.min_cosine >= min_cosine:
        raise ExportParityError(f"export: OpenVINO in bf16 differs from PyTorch fp32 beyond its tolerance: an "
                                f"example's cosine is {found.min_cosine:.6f} < {min_cosine:g} (max abs "
                                f"{found.max_abs_diff:.3g}); use --runtime openvino (f32)")
    return found


def product_nodes(ov_model: Any, modules: Iterable[str], *, optional: Iterable[str] = ()) -> dict[str, str]:
    """The IR MatMul node of each torch Linear module (qualified names under the exported module).

    ``openvino.convert_model`` names a traced Linear's product ``__module.model.<module>/aten::linear/MatMul``
    (the export wraps the module as ``model``); a module whose product is not in the IR is refused,
    unless it is ``optional`` (a pooler the exported output does not use is not in the IR).
    """
    found: dict[str, str] = {}
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() == "MatMul":
            name = op.get_friendly_name()
            found.setdefault(name.split("/", 1)[0].removeprefix("__module.model."), name)
    skip = set(optional)
    wanted = [m for m in modules if m in found or m not in skip]
    missing = [m for m in wanted if m not in found]
    if missing:
        raise ExportParityError(f"export: no product of {missing[0]!r} in the OpenVINO IR; the precision map cannot "
                                "leave it in float")
    return {m: found[m] for m in wanted}


def head_modules(module: nn.Module) -> tuple[str, ...]:
    """The Linear modules of ``module``'s ``classifier`` op group (pooler, task head); none for a bare encoder."""
    from surgery.runtimes.shared.weight_products import CLASSIFIER_GROUP, precision_groups

    return precision_groups(module).get(CLASSIFIER_GROUP, ())


def _smoothing(activation: Any) -> Any:
    """The per-input-channel factor NNCF's SmoothQuant multiplied a product's input by (None: not smoothed)."""
    node = activation.get_node()
    if node.get_type_name() != "Multiply":
        return None
    for port in node.inputs():
        source = port.get_source_output().get_node()
        if source.get_type_name() == "Constant":
            return torch.from_numpy(source.get_data().copy()).float().reshape(-1)
    return None


def with_float_groups(quantized: Any, module: nn.Module, groups: Sequence[str]) -> Any:
    """A copy of the int8 IR ``quantized`` (of ``module``) with ``groups``' products back in float.

    Each product of the groups reads its input before the activation FakeQuantize and the module's
    own fp32 weights (scaled by the SmoothQuant factor NNCF folded into the int8 ones): what NNCF's
    accuracy control does when it reverts a quantizer group, without quantizing again. The biases keep
    NNCF's bias correction (a small shift). This ranks groups cheaply; the artefact a map is deployed
    as is quantized again with the groups in ``nncf.IgnoredScope`` (:func:`export_openvino`).
    """
    ov = import_openvino()

    model = quantized.clone()
    ops = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
    linears = dict(module.named_modules())
    for name, node in product_nodes(model, float_group_modules(module, groups),
                                    optional=head_modules(module)).items():
        weight = linears[name].weight.detach().float()
        if weight.numel() == 0:  # an emptied FFN's projection: the IR's stand-in product has no weights to restore
            continue
        matmul = ops[node]
        activation = matmul.input_value(0)
        if activation.get_node().get_type_name() == "FakeQuantize":
            activation = activation.get_node().input_value(0)
            matmul.input(0).replace_source_output(activation)
        factor = _smoothing(activation)
        if factor is not None and factor.numel() == weight.shape[1]:
            weight = weight / factor  # x·(1/s) times W·s: the product unchanged
        if not matmul.get_attributes().get("transpose_b", False):
            weight = weight.T
        matmul.input(1).replace_source_output(ov.opset13.constant(weight.contiguous().numpy()).output(0))
    model.validate_nodes_and_infer_types()
    return model


def quantized_product_inputs(quantized: Any, module: nn.Module, names: Sequence[str], *,
                             threads: int | None = None) -> Any:
    """A function of a batch giving the inputs the int8 IR ``quantized`` feeds the products of ``names``.

    For each Linear module named, the IR's activation FakeQuantize output in front of its product,
    divided back by the SmoothQuant factor: the int8 values the quantized model actually multiplies,
    in the torch module's units (``[batch, seq, in_features]``). Every earlier layer's int8 error is
    in them: what a quantization-aware refit (GPTQ-style) solves against.
    """
    ov = import_openvino()

    model = quantized.clone()
    ops = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
    taps: dict[str, tuple[Any, Any]] = {}
    for name, node in product_nodes(model, names).items():
        activation = ops[node].input_value(0)
        source = activation.get_node().input_value(0) if activation.get_node().get_type_name() == "FakeQuantize" \
            else activation
        taps[name] = (activation, _smoothing(source))
    first = len(model.outputs)
    model.add_outputs([tap for tap, _ in taps.values()])
    compiled = ov.Core().compile_model(model, "CPU", compile_config(threads))
    request = compiled.create_infer_request()
    feeds_names = [port.get_any_name() for port in model.inputs]

    def inputs(batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        result = request.infer(graph_feeds(batch, feeds_names))
        found = {}
        for j, (name, (_, factor)) in enumerate(taps.items()):
            value = torch.from_numpy(result[compiled.outputs[first + j]].copy()).float()
            found[name] = value / factor if factor is not None and factor.numel() == value.shape[-1] else value
        return found

    return inputs


def _versions() -> dict[str, str]:
    import transformers

    found = {"torch": torch.__version__, "transformers": transformers.__version__}
    for name in ("openvino", "nncf"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def write_model_config(module: nn.Module, directory: Path) -> None:
    """``config.json`` of ``module`` with its class as ``architectures`` (what ``OVModelFor*`` reads)."""
    config = copy.deepcopy(module.config)
    config.architectures = [type(module).__name__]
    config.to_json_file(str(directory / "config.json"))


def write_openvino(
    model: nn.Module,
    out_dir: str | os.PathLike[str],
    *,
    parity_tokenizer: Any = None,
    task: str = "auto",
    int8: bool = False,
    calibration: Iterable[Mapping[str, torch.Tensor]] | None = None,
    smooth_quant_alpha: float = SMOOTH_QUANT_ALPHA,
    precision: str = "f32",
    bf16_min_cosine: float = BF16_MIN_COSINE,
    write_config: bool = True,
    batch: int = 4,
    seq: int = 32,
    tolerance: float = 1e-4,
    threads: int | None = None,
    overwrite: bool = False,
    int8_float: Sequence[str] | None = None,
) -> OpenVinoExportReport:
    """Export ``model`` to an OpenVINO IR in ``out_dir``, check it against PyTorch, optionally NNCF int8: the IR,
    ``config.json`` and the record (``surgery-openvino.json``), never the tokenizer
    (:func:`surgery.runtimes.openvino.openvino_export.export_openvino` writes the deployable folder).

    Args:
        model: any supported model, surgered or not (in any float dtype; the IR is fp32 or int8).
        out_dir: a new or empty directory (written atomically).
        parity_tokenizer: builds the parity batch from sample sentences (the tokenizer is not saved here).
        task: ``auto``, ``base``, ``seq-cls`` or ``mlm`` (:func:`surgery.runtimes.shared.graph_export.export_target`).
        int8: quantize the IR with NNCF on ``calibration`` (required); its drift from PyTorch is recorded.
        calibration: tokenized batches of the user's own texts (a few hundred texts); each text is one
            calibration example, unpadded.
        smooth_quant_alpha: NNCF's SmoothQuant strength for the products (0 to 1).
        precision: ``f32``, or ``bf16``: the same f32 IR, recorded (its rt_info runtime options) and served
            with the bf16 inference precision hint, for CPUs with bf16 products (avx512_bf16 or AMX); the
            f32 run is parity-checked as always, then the bf16 run's drift is measured and must keep a
            per-example cosine of at least ``bf16_min_cosine``.
        write_config: write ``config.json`` (optimum-intel's loaders read it).
        batch, seq: shape of the parity batch (right-padded); the IR itself takes any shape.
        tolerance: fp32 parity, relative to the output's magnitude: the export fails when the max-abs
            difference exceeds ``tolerance * max(1, largest |PyTorch output| on real tokens)``.
        threads: OpenVINO threads for the checks (default: torch's).
        overwrite: replace a non-empty ``out_dir``.
        int8_float: with ``int8``, op groups left out of quantization (``layer.N.attention``,
            ``layer.N.ffn-up``, ``layer.N.ffn-down``, ``classifier``: the precision map); default: the
            map recorded on the model (:func:`surgery.core.manifest.int8_float_of`, saved with it).

    Example:
        >>> import tempfile
        >>> import surgery
        >>> from surgery.strategies import HeadPruningStrategy
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert")
        >>> model = tiny_model(spec)
        >>> _ = surgery.convert(model, HeadPruningStrategy(heads={0: [1, 2]}))
        >>> out = Path(tempfile.mkdtemp()) / "ov"
        >>> report = write_openvino(model, out, batch=2, seq=8)
        >>> report.parity.max_abs_diff < 1e-4, report.steps, sorted(p.name for p in out.iterdir())
        (True, ['head-prune'], ['.surgery-manifest.json', 'config.json', 'openvino_model.bin', 'openvino_model.xml',
         'surgery-openvino.json'])
        >>> served = OpenVinoModel(out / OV_XML, config=model.config)
        >>> tuple(served(**tiny_inputs(spec, batch=5, seq=11)).last_hidden_state.shape)
        (5, 11, 32)
    """
    require_openvino("OpenVINO export" + (" with int8" if int8 else ""), int8=int8)
    ov = import_openvino()

    check_export_settings(batch, seq, tolerance)
    if not 0.0 <= smooth_quant_alpha <= 1.0:
        raise ConfigError(f"export: smooth_quant_alpha must be in [0, 1], got {smooth_quant_alpha}")
    if precision not in HINT_PRECISIONS:
        raise ConfigError(f"export: OpenVINO precision {precision!r} is not one of {', '.join(HINT_PRECISIONS)}")
    if precision != "f32" and int8:
        raise ConfigError(f"export: int8 and precision {precision!r} exclude each other (int8 quantizes the f32 IR)")
    if not 0.0 < bf16_min_cosine <= 1.0:  # NaN fails too
        raise ConfigError(f"export: bf16_min_cosine must be in (0, 1], got {bf16_min_cosine}")
    if calibration is not None and not int8:
        raise ConfigError("export: calibration texts set the int8 activation scales; they need int8 "
                          "(--runtime openvino-int8)")
    calibration = list(calibration) if calibration is not None else None
    if int8 and not calibration:
        raise ConfigError("export: OpenVINO int8 (NNCF) sets static activation scales from your texts: pass "
                          "--calibration FILE (a few hundred representative texts)")
    export_target(model, task)  # a task the model has no head for is refused first, in one line
    float_groups = sorted(int8_float_of(model) if int8_float is None else set(int8_float))
    if float_groups and not int8:
        if int8_float is not None:
            raise ConfigError("export: int8_float (op groups left in float) needs int8 (--runtime openvino-int8)")
        float_groups = []  # a recorded map means nothing to a float export
    source_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    ref = reference_batch(model, task, batch=batch, seq=seq, tokenizer=parity_tokenizer)
    module, wrapper, output, task, names, inputs, expected = (ref.module, ref.wrapper, ref.output, ref.task,
                                                               ref.names, ref.inputs, ref.expected)
    float_modules = float_group_modules(module, float_groups)
    fill_empty_ffns_(module)  # OpenVINO returns nothing for a zero-sized product: one zero neuron (same outputs)
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        start = time.perf_counter()
        ov_model = convert_to_ir(wrapper, inputs)
        seconds = time.perf_counter() - start
        path = tmp / OV_XML
        # The IR says the precision it is meant to run at (OpenVINO's runtime options), so that the bare
        # file tells a reader; compress_to_fp16=False: the default would store the weights in fp16, which
        # the parity check below would then have to forgive.
        ov_model.set_rt_info(precision, list(PRECISION_KEY))
        ov.save_model(ov_model, str(path), compress_to_fp16=False)

        def served(xml: Path, at: str | None = None) -> OpenVinoModel:
            return OpenVinoModel(xml, config=module.config, output=output, threads=threads, task=task,
                                 precision=at)

        runtime = served(path, "f32")  # the conversion itself is checked in f32, whatever the IR runs at
        parity = check_parity(expected, runtime, inputs, tolerance=tolerance, what="OpenVINO (f32)")
        drift = quantization = quantize_seconds = bf16_drift = None
        ignored: list[str] = []
        if int8 and calibration:
            start = time.perf_counter()
            ignored = list(product_nodes(ov_model, float_modules, optional=head_modules(module)).values())
            quantized, quantization = quantize(ov_model, calibration_examples(calibration, names),
                                               alpha=smooth_quant_alpha, ignored=ignored)
            quantize_seconds = time.perf_counter() - start
            del runtime
            quantized.set_rt_info(precision, list(PRECISION_KEY))
            ov.save_model(quantized, str(path), compress_to_fp16=False)
            runtime = served(path)
            drift = agreement(expected, getattr(runtime(**inputs), output), inputs.get("attention_mask"))
        if precision == "bf16":
            del runtime
            runtime = served(path)  # as the IR says: bf16
            bf16_drift = check_bf16(expected, runtime, inputs, min_cosine=bf16_min_cosine)
        if write_config:
            write_model_config(module, tmp)
        report = OpenVinoExportReport(
            **export_record(model, module, task=task, source_dtype=source_dtype, inputs=names, output=output,
                            versions=_versions(), parity_batch=(batch, seq), tolerance=tolerance),
            precision="int8" if int8 else precision, inference_precision_hint=precision, parity=parity,
            int8=int8, int8_quantization=quantization, int8_float=float_groups, int8_float_nodes=len(ignored),
            int8_drift=drift, bf16_drift=bf16_drift,
            bf16_min_cosine=bf16_min_cosine if precision == "bf16" else None, ir_bytes=runtime.file_bytes(),
            export_seconds=seconds, quantize_seconds=quantize_seconds)
        report.write(tmp)
        del runtime  # release the compiled model before the directory is renamed
    return report
