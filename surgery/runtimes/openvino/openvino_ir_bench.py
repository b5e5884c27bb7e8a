"""An exported OpenVINO IR directory as a ``surgery bench`` row, counted from the graph itself.

``surgery bench DIR`` on the directory ``surgery export --runtime openvino`` wrote serves it with the
openvino runtime's own loader. Its parameters and FLOPs come from the IR, as no PyTorch model stands
behind it: the parameters are the weight constants (those feeding a ``Gather``, the embedding tables,
are left out of ``without_embeddings``), and the FLOPs are those of its matrix products (``MatMul``
and ``ScaledDotProductAttention``, 2 per multiply-add) with the inputs set to the bench's batch x
length, which is how :func:`surgery.measure.flops.count_flops` counts a PyTorch model.

Example:
    >>> import tempfile
    >>> from surgery.runtimes.openvino.openvino_export import export_openvino
    >>> from surgery.testing import TinySpec, tiny_model
    >>> d = Path(tempfile.mkdtemp()) / "ir"
    >>> _ = export_openvino(tiny_model(TinySpec("bert")), d, threads=1)
    >>> params, flops = ir_counts(d / "openvino_model.xml", batch=2, seq_len=8)
    >>> params.total > params.without_embeddings > 0 and flops > 0
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from surgery.core.report import ParamCount
from surgery.runtimes.openvino.vendor_telemetry import import_openvino

_WEIGHT_TYPES = ("f32", "f16", "bf16", "i8", "u8", "i4", "u4")


def _matmul_flops(op: Any) -> int:
    left = list(op.input(0).get_shape())
    attributes = op.get_attributes()
    inner = left[-2] if attributes.get("transpose_a") and len(left) > 1 else left[-1]
    return 2 * math.prod(op.get_output_shape(0)) * int(inner)


def _attention_flops(op: Any) -> int:
    query, key = list(op.input(0).get_shape()), list(op.input(1).get_shape())
    # softmax(Q K^T) V: two products of L x S x D per head.
    return 4 * math.prod(query[:-1]) * int(key[-2]) * int(query[-1])


def ir_counts(xml: str | Path, *, batch: int, seq_len: int) -> tuple[ParamCount, int]:
    """The parameters of an IR's weight constants and the FLOPs of its products on a ``batch`` x ``seq_len`` input."""
    ov = import_openvino()

    model = ov.Core().read_model(str(xml))
    total = embeddings = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Constant" or op.get_output_element_type(0).get_type_name() not in _WEIGHT_TYPES:
            continue
        size = math.prod(op.get_output_shape(0))
        if size < 2:
            continue  # scalars (epsilons, scales): settings, not parameters
        total += size
        if any(target.get_node().get_type_name() == "Gather" for target in op.output(0).get_target_inputs()):
            embeddings += size
    model.reshape({port.get_any_name(): ov.PartialShape([batch, seq_len]) for port in model.inputs})
    flops = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() == "MatMul":
            flops += _matmul_flops(op)
        elif op.get_type_name() == "ScaledDotProductAttention":
            flops += _attention_flops(op)
    return ParamCount(total=total, without_embeddings=total - embeddings), flops


class OpenVinoIrRow(nn.Module):
    """An IR served by OpenVINO, reporting the counts :func:`surgery.measure.bench.bench_models` reads.

    Memory inside OpenVINO is not tensor memory torch can see: the row reports the IR's file size as
    its weights and says so.
    """

    def __init__(self, served: nn.Module, directory: str | Path) -> None:
        super().__init__()
        self.served = served
        self.config = served.config
        self.runtime = "openvino"
        self.directory = Path(directory)

    def forward(self, **inputs: Any) -> Any:
        return self.served(**inputs)

    def bench_counts(self, inputs: Mapping[str, torch.Tensor]) -> tuple[ParamCount, int, int, None, None, str]:
        """Parameters and FLOPs read off the IR, and its files' size (the hook bench_models calls)."""
        batch, seq_len = next(iter(inputs.values())).shape[:2]
        params, flops = ir_counts(self.directory / "openvino_model.xml", batch=int(batch), seq_len=int(seq_len))
        size = sum(p.stat().st_size for p in self.directory.glob("openvino_model.*") if p.is_file())
        return params, flops, size, None, None, "OpenVINO IR size (openvino_model.xml + .bin); memory not measured"
