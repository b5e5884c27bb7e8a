"""Pieces of cross-runtime benchmarks that need no runtime registry: a served model's bench row, and accuracy.

The benchmark itself (each model in each named runtime, side by side) is
:func:`surgery.runtimes.runtime_bench.bench_runtimes`; :class:`BenchedRuntimeModel` is how a model served outside
PyTorch (ONNX Runtime, OpenVINO ...) reports the counts :func:`surgery.measure.bench.bench_models`
reads (:func:`surgery.runtimes.onnx.onnx_session.BenchedOnnxModel` builds one for an ONNX graph, as the int8
studies under ``experiments/`` do).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from surgery.core.report import ParamCount
from surgery.core.run import count_params
from surgery.measure.flops import count_flops
from surgery.measure.memory import memory_use


class BenchedRuntimeModel(nn.Module):
    """A model as a runtime runs it, reporting the parameters and FLOPs of the PyTorch model it came from.

    The artefact computes the same products as its source, so FLOPs per batch are counted on the source;
    its size is the artefact's files (int8 weights take a quarter of fp32); memory inside a runtime
    other than PyTorch is not measured. A served model holding torch tensors (``torch-bf16``'s copy) is
    measured as PyTorch models are.

    Example:
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert")
        >>> class Outside(nn.Module):  # a runtime whose weights torch cannot see
        ...     def forward(self, **inputs): return None
        >>> row = BenchedRuntimeModel(Outside(), tiny_model(spec), runtime="mine", artefact_bytes=10)
        >>> counts = row.bench_counts(tiny_inputs(spec))
        >>> counts[2], counts[5], row.runtime
        (10, 'mine artefact size; memory not measured', 'mine')
        >>> copy = BenchedRuntimeModel(tiny_model(spec), tiny_model(spec), runtime="mine", artefact_bytes=0)
        >>> copy.bench_counts(tiny_inputs(spec))[5]
        'mine: torch.profiler allocator events during one forward (tensor bytes), plus weights'
    """

    def __init__(self, served: nn.Module, source: nn.Module, *, runtime: str, artefact_bytes: int) -> None:
        super().__init__()
        self.served = served
        self.config = getattr(served, "config", None) or source.config
        self.runtime = runtime
        self.artefact_bytes = artefact_bytes
        self.params: ParamCount = count_params(source)
        object.__setattr__(self, "_source", source)  # not a submodule: the row owns no torch weights

    def forward(self, **inputs: Any) -> Any:
        return self.served(**inputs)

    def bench_counts(self, inputs: Mapping[str, torch.Tensor]
                     ) -> tuple[ParamCount, int, int, int | None, int | None, str]:
        """Parameters and FLOPs of the source model, and the artefact's size (the hook bench_models calls).

        A runtime that serves a torch copy in memory (``torch-bf16``) writes no artefact: its tensors
        are measured as a PyTorch model's are (weights plus the forward's allocator peak), not read
        as an empty artefact (which showed 0.0 MiB).
        """
        flops = count_flops(self._source, inputs)
        # Only a row with no artefact: ONNX/OpenVINO wrappers may hold a torch tensor or two, not their weights.
        if self.artefact_bytes == 0 and next(self.served.parameters(), None) is not None:
            device = next(iter(inputs.values())).device
            weights, peak, total, method = memory_use(self.served, inputs, device)
            return self.params, flops, weights, peak, total, f"{self.runtime}: {method}"
        return self.params, flops, self.artefact_bytes, None, None, f"{self.runtime} artefact size; memory not measured"


def accuracy_of(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]]) -> float | None:
    """Accuracy of a sequence classifier (any runtime) on labelled batches; None for other heads.

    Example:
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert", task="seq-cls")
        >>> batch = {**tiny_inputs(spec), "labels": torch.tensor([0, 1, 2])}
        >>> 0.0 <= accuracy_of(tiny_model(spec), [batch]) <= 1.0, accuracy_of(tiny_model(TinySpec("bert")), [batch])
        (True, None)
    """
    correct = total = 0
    with torch.inference_mode():
        for batch in batches:
            out = model(**{k: v for k, v in batch.items() if k != "labels"})
            logits = getattr(out, "logits", None)
            if logits is None or logits.shape[-1] != getattr(model.config, "num_labels", -1) or logits.dim() != 2:
                return None
            correct += int((logits.argmax(-1) == batch["labels"]).sum())
            total += int(batch["labels"].numel())
    return correct / total if total else None
