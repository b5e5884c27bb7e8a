"""Binary search of the largest acceptable setting of a monotone knob on a grid (DoE, Algorithm 1).

The search is pure: it only calls ``accept`` and records what it saw, so any strategy with a
monotone knob (pruned fraction, kept experts ...) can use it and it can be tested on its own.

Guarantee. For a grid of ``n`` points, Algorithm 1 (``l, h = 0, n - 1``; probe ``m = (l + h) // 2``;
accept → ``l = m + 1``, reject → ``h = m - 1``) decides the boundary of a monotone predicate in at
most ``ceil(log2(n + 1))`` probes: there are ``n + 1`` possible answers (nothing accepted, or the
largest accepted point is point 0..n-1) and each probe halves the candidates. For the DoE grid
{0, 0.05, ..., 1} (``n = 21``) that is ``ceil(log2 22) = 5``: with the default ``max_probes=5`` the
search is *exact*. With fewer probes than that (or a non-monotone predicate) the result is still
an accepted point (or ``None``), but only a lower bound: the true boundary lies in
``[best, upper]``, and :attr:`SearchResult.exact` says which case happened.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from surgery.core.errors import ConfigError


@dataclass
class Probe:
    """One evaluation of the predicate: the grid value, the verdict and anything ``accept`` returned."""

    value: float
    accepted: bool
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class SearchResult:
    """Outcome of :func:`binary_search_grid`.

    ``best`` is the largest accepted grid value probed (``None`` if no probe was accepted);
    ``upper`` the largest grid value that may still be acceptable (``None`` when every probe was
    rejected down to the first point); ``exact`` is true when the probes pinned the boundary.
    """

    best: float | None
    upper: float | None
    exact: bool
    probes: list[Probe]


def pruning_grid(step: float = 0.05) -> list[float]:
    """The grid {0, step, ..., 1}, rounded so that 0.05 * 7 prints as 0.35.

    Example:
        >>> len(pruning_grid()), pruning_grid(0.25)
        (21, [0.0, 0.25, 0.5, 0.75, 1.0])
    """
    if not 0 < step <= 1:
        raise ConfigError(f"grid step must be in (0, 1], got {step}")
    n = round(1 / step)
    return [round(i * step, 10) for i in range(n + 1)]


def probes_needed(n: int) -> int:
    """Probes that make the search exact on a grid of ``n`` points: ``ceil(log2(n + 1))``.

    Example:
        >>> probes_needed(21)
        5
    """
    return math.ceil(math.log2(n + 1))


def binary_search_grid(
    accept: Callable[[float], bool | tuple[bool, dict[str, Any]]],
    grid: Sequence[float] | None = None,
    *,
    max_probes: int = 5,
) -> SearchResult:
    """Find the largest grid value that ``accept`` accepts, assuming acceptance is monotone.

    ``accept(value)`` returns a bool, or ``(bool, info)`` where ``info`` is recorded with the
    probe. The grid must be ascending and acceptance must be decreasing along it (small pruned
    fractions accepted, large ones rejected).

    Example:
        >>> result = binary_search_grid(lambda p: p <= 0.62)
        >>> result.best, result.exact, [p.value for p in result.probes]
        (0.6, True, [0.5, 0.75, 0.6, 0.65])
    """
    values = list(grid) if grid is not None else pruning_grid()
    if not values:
        raise ConfigError("binary search: the grid is empty")
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise ConfigError("binary search: the grid must be strictly ascending")
    if max_probes < 1:
        raise ConfigError(f"binary search: max_probes must be at least 1, got {max_probes}")
    low, high = 0, len(values) - 1
    best: int | None = None
    probes: list[Probe] = []
    while low <= high and len(probes) < max_probes:
        mid = (low + high) // 2
        verdict = accept(values[mid])
        ok, info = verdict if isinstance(verdict, tuple) else (verdict, {})
        probes.append(Probe(values[mid], bool(ok), dict(info)))
        if ok:
            best, low = mid, mid + 1
        else:
            high = mid - 1
    return SearchResult(
        best=values[best] if best is not None else None,
        upper=values[high] if high >= 0 else None,
        exact=low > high,
        probes=probes,
    )
