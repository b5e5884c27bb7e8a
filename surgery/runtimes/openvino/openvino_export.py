"""``export_openvino``: a model as a directory that needs only ``openvino`` to serve (and optimum-intel loads).

The directory is what every runtime's export writes (:meth:`surgery.runtimes.shared.runtime.Runtime.write_folder`:
atomic, the serving tokenizer, accuracy on data) around the OpenVINO runtime's artefact
(:func:`surgery.runtimes.openvino.openvino_ir.write_openvino`: the IR, ``config.json`` and
``surgery-openvino.json``, parity-checked against PyTorch). ``surgery export --runtime openvino`` writes the same.

The IR's names are importable from here too, as before the IR moved to :mod:`surgery.runtimes.openvino.openvino_ir`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from surgery.core.errors import ConfigError
from surgery.runtimes.openvino.openvino_ir import (
    BF16_MIN_COSINE,
    OV_BIN,
    OV_INFO,
    OV_XML,
    PRECISION_KEY,
    SMOOTH_QUANT_ALPHA,
    OpenVinoExportReport,
    OpenVinoModel,
    compile_config,
    ir_precision,
    quantized_product_inputs,
    read_openvino_info,
    require_openvino,
    served_precision,
    with_float_groups,
    write_openvino,
)
from surgery.runtimes.openvino.openvino_runtime import OpenVinoBf16Runtime, OpenVinoInt8Runtime, OpenVinoRuntime

__all__ = ["BF16_MIN_COSINE", "OV_BIN", "OV_INFO", "OV_XML", "PRECISION_KEY", "SMOOTH_QUANT_ALPHA",
           "OpenVinoExportReport", "OpenVinoModel", "compile_config", "export_openvino", "ir_precision",
           "quantized_product_inputs", "read_openvino_info", "require_openvino", "served_precision",
           "with_float_groups", "write_openvino"]


def export_openvino(model: nn.Module, out_dir: str | os.PathLike[str], *, tokenizer: Any = None, int8: bool = False,
                    calibration: Iterable[Mapping[str, torch.Tensor]] | None = None, precision: str = "f32",
                    task: str = "auto", save_tokenizer: bool = True,
                    data: Iterable[Mapping[str, torch.Tensor]] | None = None, threads: int | None = None,
                    overwrite: bool = False, max_length: int | None = None, **ir: Any) -> OpenVinoExportReport:
    """Export ``model`` to an OpenVINO IR in ``out_dir``, checked against PyTorch, optionally NNCF int8, with the
    tokenizer.

    ``int8``, ``calibration``, ``precision`` and ``**ir`` are the settings of
    :func:`~surgery.runtimes.openvino.openvino_ir.write_openvino` (``smooth_quant_alpha``, ``bf16_min_cosine``,
    ``write_config``, ``batch``, ``seq``, ``tolerance``, ``int8_float``), with their defaults there; ``tokenizer``
    also builds its parity batch. The rest are the folder's
    (:meth:`~surgery.runtimes.shared.runtime.Runtime.write_folder`):

    Args:
        tokenizer: saved next to the IR (unless ``save_tokenizer`` is False) as the serving tokenizer.
        data: labelled batches; the accuracy of PyTorch and of the written IR (as it runs) is recorded.
        threads: OpenVINO threads for the checks (default: torch's).
        overwrite: replace a non-empty ``out_dir`` that surgery wrote.
        max_length: the tokens the saved tokenizer truncates at (as :func:`surgery.runtimes.onnx.export_onnx`).

    Returns the :class:`~surgery.runtimes.openvino.openvino_ir.OpenVinoExportReport` saved as
    ``surgery-openvino.json``.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert")
        >>> model = tiny_model(spec)
        >>> out = Path(tempfile.mkdtemp()) / "ov"
        >>> report = export_openvino(model, out, batch=2, seq=8)
        >>> report.parity.max_abs_diff < 1e-4, sorted(p.name for p in out.iterdir())
        (True, ['.surgery-manifest.json', 'config.json', 'openvino_model.bin', 'openvino_model.xml',
         'surgery-openvino.json'])
        >>> served = OpenVinoModel(out / OV_XML, config=model.config)
        >>> tuple(served(**tiny_inputs(spec, batch=5, seq=11)).last_hidden_state.shape)
        (5, 11, 32)
    """
    if calibration is not None and not int8:
        raise ConfigError("export: calibration texts set the int8 activation scales; they need int8 "
                          "(--runtime openvino-int8)")
    kind = OpenVinoInt8Runtime if int8 else OpenVinoBf16Runtime if precision == "bf16" else OpenVinoRuntime
    runtime = kind(**ir, precision=precision, parity_tokenizer=tokenizer)
    return runtime.write_folder(model, out_dir, task=task, tokenizer=tokenizer if save_tokenizer else None,
                                calibration=None if calibration is None else list(calibration), data=data,
                                threads=threads, overwrite=overwrite, max_length=max_length)
