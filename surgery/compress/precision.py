"""Precision as a search dimension on an int8 runtime: which op groups to leave in float, at what cost.

It runs on every runtime that declares :attr:`~surgery.runtimes.Runtime.float_fallback` (OpenVINO int8 does), through
the runtime's own :meth:`~surgery.runtimes.Runtime.with_float_groups` and :meth:`~surgery.runtimes.Runtime.int8_refit`.

Per op group (a layer's attention projections, its FFN up, its FFN down, the classifier:
:func:`surgery.runtimes.shared.weight_products.precision_groups`), int8 or float. NNCF's accuracy control
(``quantize_with_accuracy_control``) ranks quantizer groups by their effect on the user's metric and
reverts the worst to float until the model is within ``max_drop``, for an unchanged model. Here the
ranking is measured the same way on the cut model and put on the same scale as the cuts:

* **gain** (:func:`fallback_gains`): the objective on calibration batches (mean task loss, or mean
  squared embedding distance to the original: the units of the removal path's estimates) of the int8
  artefact, minus the same with that group alone back in float
  (the runtime's :meth:`~surgery.runtimes.Runtime.with_float_groups`; OpenVINO's is the NNCF revert without
  quantizing again);
* **cost** (:func:`surgery.compress.latency_measure.measure_fallback_costs`): milliseconds, measured
  in the runtime on the artefact, per head or neuron of the part; negative where float runs faster
  than int8 there (a CPU without VNNI), and then the fallback is free;
* **trade** (:func:`surgery.compress.removal_path.buy_fallbacks`): a fallback is bought back when its
  gain beats the estimated loss of the further cuts along the path that pay for its milliseconds.

The chosen map is recorded on the model (:func:`surgery.core.manifest.set_int8_float`): the artefact is
quantized with those groups in ``nncf.IgnoredScope``, its manifest and the saved model record them,
and every later export replays them.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from surgery.runtimes import Runtime


def task_loss(batches: Sequence[Mapping[str, torch.Tensor]]) -> Callable[[nn.Module], float]:
    """The mean per-example cross-entropy of a served classifier's logits on labelled ``batches``.

    Example:
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert", task="seq-cls")
        >>> batch = {**tiny_inputs(spec), "labels": torch.tensor([0, 1, 2])}
        >>> task_loss([batch])(tiny_model(spec).eval()) > 0
        True
    """
    def measure(model: nn.Module) -> float:
        total, count = 0.0, 0
        with torch.no_grad():
            for batch in batches:
                logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits.float()
                total += float(torch.nn.functional.cross_entropy(logits, batch["labels"], reduction="sum"))
                count += int(batch["input_ids"].shape[0])
        return total / max(count, 1)

    return measure


def fallback_gains(served_dir: str | Path, model: nn.Module, objective: Callable[[nn.Module], float], *,
                   runtime: Runtime, groups: Sequence[str] | None = None, threads: int | None = None
                   ) -> dict[str, float]:
    """Objective drop when each op group alone goes back to float in the int8 artefact ``served_dir`` of ``runtime``.

    ``objective(served)`` is the objective of a served model on calibration batches (:func:`task_loss`,
    or the embedding distance to the original's); ``groups`` default to every op group of ``model``.
    Positive: the group's int8 error costs that much objective. Each copy is the runtime's own
    (:meth:`~surgery.runtimes.Runtime.with_float_groups`), so any runtime that declares
    :attr:`~surgery.runtimes.Runtime.float_fallback` is measured the same way.

    Example:
        >>> from surgery.runtimes import get_runtime
        >>> from surgery.runtimes.openvino.openvino_export import export_openvino
        >>> from surgery.testing import TinySpec, tiny_inputs, tiny_model
        >>> spec = TinySpec("bert", task="seq-cls", layers=1)
        >>> model = tiny_model(spec).eval()
        >>> batches = [{**tiny_inputs(spec, batch=8, seq=12), "labels": torch.zeros(8, dtype=torch.long)}]
        >>> out = Path(tempfile.mkdtemp()) / "ir"
        >>> _ = export_openvino(model, out, int8=True, calibration=batches, batch=2, seq=8)
        >>> sorted(fallback_gains(out, model, task_loss(batches), runtime=get_runtime("openvino-int8"), threads=1))
        ['classifier', 'layer.0.attention', 'layer.0.ffn-down', 'layer.0.ffn-up']
    """
    from surgery.runtimes.shared.weight_products import precision_groups

    chosen = list(groups) if groups is not None else list(precision_groups(model))

    def load(directory: Path) -> nn.Module:
        return runtime.load(directory, config=model.config, threads=threads)

    base = objective(load(Path(served_dir)))
    gains: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="surgery-precision-") as tmp:
        for group in chosen:
            copy = runtime.with_float_groups(Path(served_dir), model, [group], Path(tmp) / group)
            gains[group] = base - objective(load(copy))
    return gains


def describe_choice(gains: Mapping[str, float], costs: Any, structure: Any) -> list[dict[str, Any]]:
    """Every group's measured gain, cost and gain per millisecond, best first (for reports): groups
    measured faster in float (``free``) first, by gain; then by gain per millisecond.

    Example:
        >>> from surgery.compress.latency_table import FallbackCosts
        >>> from surgery.compress.structure import LayerShape, Structure
        >>> costs = FallbackCosts(runtime="demo", precision="f32", per_unit_ms={"attention": -0.1, "ffn-up": 0.01})
        >>> rows = describe_choice({"layer.0.ffn-up": 0.5, "layer.0.attention": 0.01}, costs,
        ...                        Structure((LayerShape(2, 10),)))
        >>> [(r["group"], r["free"], r["gain_per_ms"]) for r in rows]
        [('layer.0.attention', True, None), ('layer.0.ffn-up', False, 5.0)]
    """
    rows = []
    for group, gain in gains.items():
        cost = costs.cost(group, structure)
        free = bool(cost) and costs.is_free(group)
        rows.append({"group": group, "gain": round(gain, 6), "cost_ms": None if cost is None else round(cost, 6),
                     "free": free, "gain_per_ms": None if free or not cost else round(gain / cost, 6)})
    return sorted(rows, key=lambda r: (not r["free"], -(r["gain"] if r["free"] else r["gain_per_ms"] or 0.0)))


def precision_build(model: nn.Module, judge: Any, int8_float: Sequence[str], *, int8_refit: bool = True) -> list[str]:
    """Prepare a precision candidate: record its map on ``model`` and, with ``int8_refit``, refit it against
    its int8 inputs.

    The runtime's quantization-aware refit (:meth:`~surgery.runtimes.Runtime.int8_refit`; OpenVINO int8's
    quantizes the cut model with its map as the artefact will be, and solves the cut projections
    against the inputs that int8 model feeds them). Without it the weights stay those of the cut that was
    judged, so the candidate differs from it by less int8 error alone. Returns notes for the candidate.
    """
    from surgery.core.manifest import set_int8_float

    set_int8_float(model, int8_float)
    notes = [f"precision map: {', '.join(int8_float)} in float"] if int8_float else []
    if not int8_refit:
        return notes
    solved = judge.runtime.int8_refit(model, judge.original, judge.calibration,
                                      calibration=judge.smoothing or judge.calibration, threads=judge.threads)
    if solved is not None:
        notes.append(f"quantization-aware refit: {', '.join(solved) or 'none'}")
    return notes


def precision_choice(path: Any, step: int, model: nn.Module, served_dir: Path, judge: Any, plan: Any,
                     goal: float, *, free_only: bool = False) -> tuple[Any, list[dict[str, Any]]]:
    """The precision pass at path point ``step`` (its model and int8 artefact): measured gains and costs,
    traded along ``path`` (:func:`surgery.compress.removal_path.buy_fallbacks`); also the ranked groups.

    Costs are measured first (a handful of timed variants). With ``free_only`` (``--max-drop``) only the
    groups of parts measured faster in float have their gains measured, and with none the answer is
    ``(None, [])``.
    """
    from surgery.compress.latency_measure import measure_fallback_costs
    from surgery.compress.removal_path import buy_fallbacks, start_indexed
    from surgery.runtimes.shared.weight_products import precision_groups

    costs = measure_fallback_costs(served_dir, model, runtime=judge.runtime, batch_size=plan.batch_size,
                                   seq_len=plan.seq_len, threads=judge.threads, batches=plan.batches,
                                   pad_to_multiple_of=getattr(getattr(plan, "alignment", None), "multiple", None))
    if free_only and not costs.faster_in_float():
        return None, []
    # With free_only the other groups could not be taken: their gains are not measured.
    groups = [g for g in precision_groups(model) if not free_only or costs.is_free(g)]
    objective = task_loss(judge.calibration) if judge.objective == "task" else judge.calibration_objective
    gains = start_indexed(fallback_gains(served_dir, model, objective, runtime=judge.runtime, groups=groups,
                                         threads=judge.threads), path.removal_at(step))
    choice = buy_fallbacks(path, step, gains, costs, target_speedup=goal, free_only=free_only)
    return choice, describe_choice(gains, costs, path.structure_at(step))
