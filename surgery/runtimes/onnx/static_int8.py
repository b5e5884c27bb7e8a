"""Static int8: activation scales calibrated once on the user's texts (QDQ), instead of per batch at run time.

Dynamic int8 (:func:`surgery.runtimes.onnx.onnx_session.quantize_int8`) measures every product input's range on
each batch while serving: one reduction and one quantization pass per product per batch. Static
int8 fixes those ranges beforehand from calibration batches (ONNX Runtime's ``quantize_static``,
MinMax calibration) and writes them into the graph as QuantizeLinear/DequantizeLinear pairs around
each product, which ONNX Runtime fuses into integer kernels when the session is built. It needs
texts like the ones the model will serve: the same batches ``--calibration`` already takes for
activation smoothing (:mod:`surgery.runtimes.shared.smooth`), which runs first, so the ranges are measured on
the smoothed activations.

Weights are signed int8 with one scale per output channel and activations unsigned int8
(ONNX Runtime's U8S8, the fast path of its x86 kernels); only product inputs are quantized, so each
product runs as ``MatMulIntegerToFloat`` with an fp32 result; a fused ``MultiHeadAttention`` stays fp32.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from surgery.core.errors import ConfigError
from surgery.runtimes.onnx.onnx_session import prepared_for_quantization, quantizer_options, require_onnx
from surgery.runtimes.shared.graph_export import graph_feeds

#: How export_onnx's ``int8_mode`` can quantize.
INT8_MODES = ("dynamic", "static")


def check_int8_mode(mode: str, *, int8: bool, calibrated: bool, what: str = "export") -> None:
    """Refuse, in one line, an unknown mode, or static int8 without int8 or without calibration batches.

    Example:
        >>> check_int8_mode("static", int8=False, calibrated=True)
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: export: int8_mode 'static' needs --int8
    """
    if mode not in INT8_MODES:
        raise ConfigError(f"{what}: int8_mode {mode!r} is not one of {', '.join(INT8_MODES)}")
    if mode == "static" and not int8:
        raise ConfigError(f"{what}: int8_mode 'static' needs --int8")
    if mode == "static" and not calibrated:
        raise ConfigError(f"{what}: int8_mode 'static' calibrates activation scales on your texts; pass --calibration "
                          "FILE")


def _reader_class() -> type:
    from onnxruntime.quantization import CalibrationDataReader

    class BatchReader(CalibrationDataReader):  # type: ignore[misc]
        """ONNX Runtime's calibration reader over tokenized batches, fed as the graph's int64 inputs."""

        def __init__(self, batches: Sequence[Mapping[str, torch.Tensor]], names: Sequence[str]) -> None:
            self._feeds = [graph_feeds(batch, names) for batch in batches]
            self._next: Iterator[dict[str, np.ndarray]] = iter(self._feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._next, None)

        def rewind(self) -> None:
            self._next = iter(self._feeds)

    return BatchReader


def calibration_reader(batches: Iterable[Mapping[str, torch.Tensor]], names: Sequence[str]) -> Any:
    """A ``CalibrationDataReader`` that feeds ``batches`` (tokenized, any lengths) as the graph inputs ``names``.

    Example:
        >>> reader = calibration_reader([{"input_ids": torch.tensor([[2, 5]])}], ["input_ids", "attention_mask"])
        >>> sorted(reader.get_next()), reader.get_next()
        (['attention_mask', 'input_ids'], None)
    """
    require_onnx("static int8 quantization")
    batches = list(batches)
    if not batches:
        raise ConfigError("export: calibration has no batches; pass texts with --calibration FILE")
    return _reader_class()(batches, names)


def quantize_static_int8(src: Path, dst: Path, batches: Iterable[Mapping[str, torch.Tensor]], *,
                         input_names: Sequence[str], per_channel: bool = True,
                         keep_fp32: Collection[str] = ()) -> list[str]:
    """ONNX Runtime static (QDQ) quantization of ``src`` to ``dst``, activation ranges calibrated on ``batches``.

    ``keep_fp32`` names modules whose products stay fp32 (as in
    :func:`surgery.runtimes.onnx.onnx_session.quantize_int8`); the names of those nodes are returned.
    """
    require_onnx("static int8 quantization")
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    reader = calibration_reader(batches, input_names)
    with prepared_for_quantization(src, dst, keep_fp32) as (bare, kept, excluded):
        quantize_static(str(bare), str(dst), reader, quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"],
                        per_channel=per_channel, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax, nodes_to_exclude=excluded,
                        # Inputs only: ORT then runs each product as MatMulIntegerToFloat with an fp32 result
                        # (as dynamic int8 does), instead of re-quantizing every product's output.
                        extra_options={**quantizer_options(), "OpTypesToExcludeOutputQuantization": ["MatMul"]})
    return kept
