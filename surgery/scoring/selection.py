"""Choosing which units (heads, neurons) to remove from per-layer importance scores."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import torch

from surgery.core.errors import PlanError

Scope = Literal["global", "layer"]


def lowest_units(
    scores: Mapping[int, torch.Tensor],
    ratio: float,
    *,
    scope: Scope = "global",
    min_keep: int = 1,
) -> dict[int, list[int]]:
    """The units to remove: the lowest-scoring ``ratio`` of all units, per layer or globally.

    ``min_keep`` units always stay in every layer, so no layer is emptied unless ``min_keep=0``.
    Ties are broken by index, so the result is deterministic.

    Example:
        >>> s = {0: torch.tensor([3.0, 1.0, 2.0]), 1: torch.tensor([0.5, 4.0, 0.1])}
        >>> lowest_units(s, 0.5)
        {0: [1], 1: [0, 2]}
        >>> lowest_units(s, 0.34, scope="layer")
        {0: [1], 1: [2]}
    """
    if not 0.0 <= ratio <= 1.0:
        raise PlanError(f"ratio must be within [0, 1], got {ratio}")
    removed: dict[int, list[int]] = {layer: [] for layer in scores}
    if scope == "layer":
        for layer, s in scores.items():
            n = len(s)
            count = min(count_for_ratio(ratio, n), max(n - min_keep, 0))
            order = sorted(range(n), key=lambda i: (float(s[i]), i))
            removed[layer] = sorted(order[:count])
        return removed
    total = sum(len(s) for s in scores.values())
    budget = count_for_ratio(ratio, total)
    ranked = sorted(
        ((float(s[i]), layer, i) for layer, s in scores.items() for i in range(len(s))),
        key=lambda t: (t[0], t[1], t[2]),
    )
    left = {layer: len(s) for layer, s in scores.items()}
    for _, layer, i in ranked:
        if budget <= 0:
            break
        if left[layer] <= min_keep:
            continue
        removed[layer].append(i)
        left[layer] -= 1
        budget -= 1
    return {layer: sorted(units) for layer, units in removed.items()}


def normalise_per_layer(scores: Mapping[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Divide each layer's scores by their L2 norm (Michel et al. 2019, for global head ranking)."""
    return {layer: s / s.norm().clamp_min(1e-12) for layer, s in scores.items()}


def parse_layer_map(value: Mapping[Any, Any], what: str) -> dict[int, list[int]]:
    """Read a ``{layer: [indices]}`` map whose keys may be strings (as from JSON)."""
    try:
        return {int(k): sorted({int(i) for i in v}) for k, v in value.items()}
    except (AttributeError, TypeError, ValueError):  # AttributeError: not a mapping at all (a number, a list)
        raise PlanError(f"{what} must map layer numbers to lists of integers, got {value!r:.80}") from None


def count_for_ratio(ratio: float, n: int) -> int:
    """``round(ratio * n)`` with halves rounded up, so ratio 0.5 of 3 removes 2."""
    return math.floor(ratio * n + 0.5)
