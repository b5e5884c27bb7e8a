"""The latency table: how long each part of an encoder takes on one runtime, machine and batch shape.

The table holds, for one family and width, measured milliseconds per forward pass of a batch:
``base_ms`` (everything outside the encoder layers: embeddings, pooling, task head), the attention
block at a grid of head counts, the FFN at a grid of widths, and ``overhead_ms`` (what a layer costs
whatever its width: norms, residual adds). A layer's time is ``overhead + attention(h) + ffn(w)``,
linear between grid points; a removed layer costs nothing. Measuring fills it (``latency_measure``);
this module only holds and reads it, so the search can be tested on any table.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from surgery.compress.structure import LayerShape, Structure
from surgery.measure.serving import LengthSummary


def _monotone(points: Mapping[int, float], what: str) -> dict[int, float]:
    """Grid points sorted by size, each at least its predecessor (timing noise must not make a cut cost time)."""
    if not points:
        raise ValueError(f"{what}: the grid is empty; measure at least the full width")
    out: dict[int, float] = {}
    best = 0.0
    for size in sorted(points):
        if size < 0 or points[size] < 0 or points[size] != points[size]:
            raise ValueError(f"{what}: grid point {size} -> {points[size]} is not a size >= 0 with a time >= 0")
        best = max(best, float(points[size]))
        out[size] = best
    return out


def round_up(size: int, step: int) -> int:
    """``size`` rounded up to a multiple of ``step`` (matrix kernels work in blocks: a product 154 wide
    can take as long as one 192 wide).

    Example:
        >>> round_up(154, 64), round_up(192, 64), round_up(0, 64), round_up(154, 1)
        (192, 192, 0, 154)
    """
    return -(-size // step) * step


def _interpolate(points: Mapping[int, float], size: int) -> float:
    """Piecewise-linear time at ``size``; 0 at size 0; beyond the grid, linear from the last two points."""
    if size <= 0:
        return 0.0
    sizes = [0, *[s for s in sorted(points) if s > 0]]
    times = [0.0, *[points[s] for s in sizes[1:]]]
    i = bisect.bisect_left(sizes, size)
    if i < len(sizes) and sizes[i] == size:
        return times[i]
    lo, hi = (i - 1, i) if i < len(sizes) else (len(sizes) - 2, len(sizes) - 1)
    slope = (times[hi] - times[lo]) / (sizes[hi] - sizes[lo])
    return max(0.0, times[lo] + slope * (size - sizes[lo]))


class LatencyTable(BaseModel):
    """Measured per-part latency of one model shape on one runtime, machine and batch shape.

    Example:
        >>> table = LatencyTable(runtime="torch", batch_size=8, seq_len=64, threads=1, model_key="demo",
        ...                      base_ms=2.0, overhead_ms=0.5, attention_ms={4: 3.0, 2: 1.6},
        ...                      ffn_ms={37: 4.0, 18: 2.1})
        >>> table.layer_ms(LayerShape(heads=4, ffn_width=37))
        7.5
        >>> table.predict_ms(Structure((LayerShape(4, 37), None)))
        9.5
        >>> table.layer_ms(LayerShape(heads=3, ffn_width=37)) < 7.5
        True
        >>> table.model_copy(update={"ffn_step": 16}).layer_ms(LayerShape(4, 17)) == table.layer_ms(LayerShape(4, 32))
        True
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    runtime: str = Field(description="the registered runtime it was measured in (surgery.runtimes)")
    batch_size: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    threads: int | None = Field(default=None, ge=1)
    lengths: str = Field(default="fixed", description="fixed: every sequence seq_len tokens; data: batches of the "
                         "user's texts, each padded to its own longest (seq_len is then the longest batch)")
    length_summary: LengthSummary | None = Field(default=None, description="data: the timed batches' lengths")
    model_key: str = Field(description="what the table was measured for: family, hidden size, head dim, widths")
    machine: dict[str, Any] = Field(default_factory=dict, description="CPU model and flags it was measured on")
    base_ms: float = Field(ge=0.0, description="everything outside the encoder layers")
    overhead_ms: float = Field(ge=0.0, description="what a kept layer costs whatever its width")
    attention_ms: dict[int, float] = Field(description="heads -> ms of the attention block")
    ffn_ms: dict[int, float] = Field(description="FFN width -> ms of the FFN block")
    ffn_step: int = Field(default=1, ge=1, description="an FFN width costs as much as the next multiple of this "
                          "(the runtime's matrix kernels work in blocks); measured with the table")
    reference_runtime: str | None = Field(default=None, description="the runtime the original was also timed "
                                              "in, in the same rounds (for speedups across runtimes)")
    reference_ms: float | None = Field(default=None, ge=0.0, description="the original model in reference_runtime")
    measured: dict[str, Any] = Field(default_factory=dict, description="how it was measured (repeats, spread)")

    @field_validator("attention_ms", "ffn_ms")
    @classmethod
    def _grid(cls, value: dict[int, float], info: Any) -> dict[int, float]:
        return _monotone(value, info.field_name)

    def layer_ms(self, shape: LayerShape | None) -> float:
        """Predicted time of one layer of this shape (0 for a removed layer)."""
        if shape is None:
            return 0.0
        return self.overhead_ms + _interpolate(self.attention_ms, shape.heads) + _interpolate(
            self.ffn_ms, round_up(shape.ffn_width, self.ffn_step))

    def predict_ms(self, structure: Structure) -> float:
        """Predicted time of a forward pass of a model of this structure."""
        return self.base_ms + sum(self.layer_ms(layer) for layer in structure.layers)

    def speedup(self, structure: Structure, original: Structure) -> float:
        """Predicted speedup of ``structure`` in this runtime over ``original`` in the reference runtime
        (this runtime when the table has no reference). Both times come from the same rounds, so the
        load of the moment cancels, also across runtimes.

        Example:
            >>> table = LatencyTable(runtime="onnxruntime-int8", batch_size=8, seq_len=64, model_key="demo",
            ...                      base_ms=1.0, overhead_ms=0.0, attention_ms={4: 2.0}, ffn_ms={37: 2.0},
            ...                      reference_runtime="torch", reference_ms=27.0)
            >>> full = Structure((LayerShape(4, 37), LayerShape(4, 37)))
            >>> table.speedup(full, full), table.model_copy(update={"reference_ms": None}).speedup(full, full)
            (3.0, 1.0)
        """
        reference = self.reference_ms if self.reference_ms is not None else self.predict_ms(original)
        return reference / self.predict_ms(structure)

    def saving_ms(self, before: LayerShape | None, after: LayerShape | None) -> float:
        """Time saved by changing one layer from ``before`` to ``after`` (``None``: the layer removed)."""
        return self.layer_ms(before) - self.layer_ms(after)


#: The op-group parts a precision map names, and the unit their fallback cost scales with.
FALLBACK_UNITS = {"attention": "heads", "ffn-up": "neurons", "ffn-down": "neurons", "classifier": "whole"}


class FallbackCosts(BaseModel):
    """What leaving one op group in float costs on an int8 runtime, measured: milliseconds per unit.

    ``per_unit_ms`` holds, per part, the extra milliseconds per head (``attention``: its q, k, v and
    output projections), per FFN neuron (``ffn-up``, ``ffn-down``) or for the whole ``classifier``,
    measured as the extra time of the int8 model with that part in float in every layer, split over
    the layers by their widths (the products scale with them). A cost is signed: negative where the
    part runs faster in float than in int8. ``precision`` is what a float group runs in there (the
    compiled model's inference precision).

    Example:
        >>> costs = FallbackCosts(runtime="openvino-int8", precision="f32",
        ...                       per_unit_ms={"attention": 0.01, "ffn-down": 0.001, "classifier": 0.2})
        >>> structure = Structure((LayerShape(12, 1536), LayerShape(8, 512)))
        >>> costs.cost("layer.1.attention", structure), costs.cost("layer.0.ffn-down", structure)
        (0.08, 1.536)
        >>> costs.cost("classifier", structure), costs.cost("layer.1.ffn-up", structure)
        (0.2, None)
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    runtime: str
    precision: str = Field(description="what a float group runs in (the runtime's inference precision)")
    per_unit_ms: dict[str, float] = Field(description="part -> ms per head / per neuron / whole classifier")
    measured: dict[str, Any] = Field(default_factory=dict, description="how it was measured")

    def cost(self, group: str, structure: Structure) -> float | None:
        """Extra milliseconds of ``group`` (``layer.N.part`` or ``classifier``) in float at ``structure``.

        None when the group is not there (its layer removed) or its part was not measured.
        """
        from surgery.runtimes.shared.weight_products import split_group

        layer, part = split_group(group)
        if layer is None:
            return self.per_unit_ms.get(part)
        shape = structure.layers[layer] if layer < len(structure.layers) else None
        if shape is None or part not in self.per_unit_ms:
            return None
        units = shape.heads if FALLBACK_UNITS[part] == "heads" else shape.ffn_width
        return round(self.per_unit_ms[part] * units, 9)

    def faster_in_float(self) -> list[str]:
        """The parts measured faster in float than in int8 (a negative cost): the one test of "free".

        Example:
            >>> FallbackCosts(runtime="demo", precision="f32",
            ...               per_unit_ms={"attention": -0.01, "ffn-up": 0.0, "ffn-down": 0.002}).faster_in_float()
            ['attention']
        """
        return [part for part, ms in self.per_unit_ms.items() if ms < 0]

    def is_free(self, group: str) -> bool:
        """Whether ``group``'s part is one :meth:`faster_in_float` names.

        Example:
            >>> costs = FallbackCosts(runtime="demo", precision="f32", per_unit_ms={"attention": -0.01})
            >>> costs.is_free("layer.2.attention"), costs.is_free("layer.2.ffn-up")
            (True, False)
        """
        from surgery.runtimes.shared.weight_products import split_group

        return split_group(group)[1] in self.faster_in_float()
