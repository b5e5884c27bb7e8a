"""Quantization-aware refit: the cut projections solved against the inputs the int8 model actually feeds them.

:func:`surgery.training.refit.refit_projections` solves each cut projection so that, on calibration
text, it reproduces the original's output from the cut model's fp32 inputs; the int8 artefact then
adds its own error on top, and the two are fixed apart. GPTQ / OBC (Frantar et al., 2022) solve each
layer against the inputs of the *quantized* model instead, so a layer also compensates the
quantization error of everything below it. Here the cheapest honest way to get those inputs: the
student is exported and quantized exactly as its artefact will be (:func:`export_openvino`, NNCF's
recipe, the same calibration texts and the same precision map), and the IR itself is read: OpenVINO
adds an output at each projection's activation FakeQuantize, whose values (divided back by the
SmoothQuant factor) are what the int8 product multiplies. The projections are solved against those
(one pass; the inputs are fixed), and the artefact is then exported again from the refitted weights.

The teacher's outputs stay fp32: the target is still the original model.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from surgery.runtimes.openvino.openvino_ir import OV_XML, SMOOTH_QUANT_ALPHA, quantized_product_inputs, write_openvino
from surgery.runtimes.openvino.vendor_telemetry import import_openvino
from surgery.training.refit import RefitResult, projection, projection_name, refit_projections, refit_targets


def quantization_aware_refit(student: nn.Module, teacher: nn.Module, batches: Sequence[Mapping[str, torch.Tensor]],
                             *, calibration: Iterable[Mapping[str, torch.Tensor]],
                             smooth_quant_alpha: float = SMOOTH_QUANT_ALPHA, only_changed: bool = True,
                             ridge: float = 1e-2, threads: int | None = None) -> RefitResult:
    """Refit ``student``'s projections (in place) against the inputs its OpenVINO int8 artefact feeds them.

    ``batches`` are the refit's (re-iterable) calibration batches; ``calibration`` the texts NNCF sets
    the activation scales from (as the artefact's export will). ``only_changed`` as in
    :func:`surgery.training.refit.refit_projections` (False: every output projection, as GPTQ does).
    The student's recorded precision map (op groups left in float) is quantized as the artefact is.

    Example:
        >>> import copy
        >>> from surgery.anatomy import adapter_for
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert", layers=2, ffn=37)
        >>> teacher = tiny_model(spec).eval()
        >>> student = copy.deepcopy(teacher)
        >>> adapter_for(student).remove_units(1, {"neurons": list(range(12))})
        >>> batches = [tiny_inputs(spec, batch=16, seq=12)]
        >>> quantization_aware_refit(student, teacher, batches, calibration=batches, threads=1).projections
        ['1:down']
    """
    _, targets = refit_targets(student, teacher, only_changed=only_changed)
    if not targets:
        return RefitResult()
    names = [projection_name(student, layer, name) for layer, name in targets
             if (linear := projection(student, layer, name)) is not None and linear.in_features > 0]
    with tempfile.TemporaryDirectory(prefix="surgery-qa-refit-") as tmp:
        write_openvino(student, Path(tmp) / "ir", task="auto", int8=True, calibration=calibration,
                       smooth_quant_alpha=smooth_quant_alpha, write_config=False, threads=threads, batch=2, seq=8)
        ov = import_openvino()

        quantized = ov.Core().read_model(str(Path(tmp) / "ir" / OV_XML))
        reader = quantized_product_inputs(quantized, student, names, threads=threads)
        return refit_projections(student, teacher, batches, only_changed=only_changed, ridge=ridge,
                                 quantized_inputs=reader)
