"""How sure a paired speedup is: paired ratios, median polish and a bootstrap confidence interval over rounds.

A benchmark round runs every model once, moments apart, so the same-round throughput ratio of a
model and the reference cancels most of the load other processes put on the machine. The rounds are
then treated as independent draws: the percentile bootstrap resamples them with replacement, takes
the median of each resample, and reads the interval from the spread of those medians. The median
(not the mean) matches the point estimate the benchmark reports, and shrugs off a single round
that a burst of load distorted.

The resampling is seeded, so the same rounds always give the same interval.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, Field

#: An interval whose half-width exceeds this fraction of the estimate is called too wide to quote.
WIDE_HALF_WIDTH = 0.05
#: Bootstrap resamples; 2000 puts the percentile ends' own Monte Carlo error well below 1%.
RESAMPLES = 2000


class Interval(BaseModel):
    """A point estimate with a confidence interval."""

    estimate: float = Field(description="median of the per-round values")
    low: float
    high: float
    level: float = Field(description="confidence level, e.g. 0.95")
    rounds: int = Field(description="values the interval was computed from")

    @property
    def half_width(self) -> float:
        """Half the interval's width relative to the estimate (0.05 = +-5%)."""
        return (self.high - self.low) / 2 / self.estimate if self.estimate else float("inf")

    @property
    def wide(self) -> bool:
        """Whether the interval is wider than +-5% (or has too few rounds to tell)."""
        return self.rounds < 2 or self.half_width > WIDE_HALF_WIDTH


def bootstrap_median(values: Sequence[float], *, level: float = 0.95, resamples: int = RESAMPLES,
                     seed: int = 0) -> Interval:
    """Percentile-bootstrap confidence interval of the median of ``values``.

    With a single value the interval is that value and is flagged :attr:`Interval.wide` (one round
    says nothing about spread).

    Example:
        >>> ci = bootstrap_median([1.9, 2.0, 2.1, 2.0, 1.95, 2.05, 2.0, 1.98])
        >>> round(ci.estimate, 2), ci.low <= ci.estimate <= ci.high, ci.wide
        (2.0, True, False)
    """
    if not values:
        raise ValueError("bootstrap_median needs at least one value")
    if not 0 < level < 1:
        raise ValueError(f"level must be between 0 and 1, got {level}")
    data = list(values)
    estimate = statistics.median(data)
    if len(data) == 1:
        return Interval(estimate=estimate, low=estimate, high=estimate, level=level, rounds=1)
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(data, k=len(data))) for _ in range(resamples))
    tail = (1 - level) / 2
    low = medians[int(tail * (resamples - 1))]
    high = medians[round((1 - tail) * (resamples - 1))]
    return Interval(estimate=estimate, low=low, high=high, level=level, rounds=len(data))


def rounds_for(interval: Interval, target: float = WIDE_HALF_WIDTH) -> int:
    """Rounds likely to bring ``interval`` within +-``target`` (the width shrinks like 1/sqrt(rounds)).

    Example:
        >>> rounds_for(Interval(estimate=2.0, low=1.8, high=2.2, level=0.95, rounds=8))
        32
    """
    if interval.rounds < 2 or not interval.estimate:
        return max(2 * interval.rounds, 8)
    factor = (interval.half_width / target) ** 2
    return max(interval.rounds, math.ceil(round(interval.rounds * factor, 6)))  # round: float noise, not a round


def interval_warning(name: str, interval: Interval) -> str | None:
    """A one-line warning when ``interval`` is wider than +-5%, suggesting how many rounds to run.

    Example:
        >>> message = interval_warning("pruned", Interval(estimate=2.0, low=1.8, high=2.2, level=0.95, rounds=8))
        >>> for part in message.split("; "):
        ...     print(part)
        pruned: the paired speedup 2.00x is uncertain (95% interval 1.80-2.20, +-10%, over 8 rounds)
        run about 32 rounds for +-5%
    """
    if not interval.wide:
        return None
    spread = f"+-{interval.half_width:.0%}" if interval.rounds > 1 else "one round gives no spread"
    return (f"{name}: the paired speedup {interval.estimate:.2f}x is uncertain ({interval.level:.0%} interval "
            f"{interval.low:.2f}-{interval.high:.2f}, {spread}, over {interval.rounds} rounds); run about "
            f"{rounds_for(interval)} rounds for +-{WIDE_HALF_WIDTH:.0%}")


def mean_std(values: Sequence[float]) -> list[float]:
    """``[mean, sample standard deviation]`` of ``values`` (std 0 for a single value), as results files store it.

    Example:
        >>> mean_std([1.0, 2.0, 3.0]), mean_std([5.0])
        ([2.0, 1.0], [5.0, 0.0])
    """
    return [statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0]


def paired_ratios(reference: Sequence[float], model: Sequence[float], *, per_second: bool = False) -> list[float]:
    """Same-round speedups of ``model`` over ``reference``: seconds per batch (``per_second``: throughputs).

    Both ran within the same round, moments apart, so a burst of load from other processes hits both;
    the per-round ratio is therefore far steadier than either time on a busy machine.

    Example:
        >>> paired_ratios([2.0, 4.0], [1.0, 1.0]), paired_ratios([10.0], [30.0], per_second=True)
        ([2.0, 4.0], [3.0])
    """
    pairs = zip(reference, model, strict=True)
    if per_second:
        return [m / r if r else float("nan") for r, m in pairs]
    return [r / m if m else float("nan") for r, m in pairs]


def median_polish(times: Mapping[str, Sequence[float]], sweeps: int = 5) -> tuple[dict[str, float], list[float]]:
    """Each model's time on a typical round, and each round's load factor, by median polish of log times.

    A round that other processes slowed down slows every model in it; the round factor takes that
    out, so a model's estimate does not depend on which rounds were loaded (a two-way median polish:
    model level + round level, the typical round as the unit).

    Example:
        >>> levels, rounds = median_polish({"a": [1.0, 2.0, 1.0], "b": [3.0, 6.0, 3.0]})
        >>> {k: round(v, 6) for k, v in levels.items()}, [round(r, 6) for r in rounds]
        ({'a': 1.0, 'b': 3.0}, [1.0, 2.0, 1.0])
    """
    names = list(times)
    logs = {name: [math.log(t) for t in times[name]] for name in names}
    rounds = len(logs[names[0]])
    level = {name: statistics.median(values) for name, values in logs.items()}
    effect = [0.0] * rounds
    for _ in range(sweeps):
        effect = [statistics.median(logs[n][r] - level[n] for n in names) for r in range(rounds)]
        typical = statistics.median(effect)  # the typical round is the unit, not the fastest
        effect = [e - typical for e in effect]
        level = {n: statistics.median(logs[n][r] - effect[r] for r in range(rounds)) for n in names}
    return {n: math.exp(v) for n, v in level.items()}, [math.exp(e) for e in effect]
