"""The dev data split in two: a part the search fits, a held-out part that only judges the finalists.

A pick fitted to the examples that also chose it lands under the bar on new data (the failure NNCF's
accuracy control is known for on small data). So the dev examples are split once, by a seeded
permutation, into the *search* part (bisection, screening, every decision of the search) and the
*pick* part (read only for the finalists). Figures on the pick part carry a paired interval of the
drop against the original on the same examples (:func:`paired_drop`), and ``--max-drop`` is held by its
upper end (the retained accuracy's lower end). Where no finalist holds it there, the pick falls back to
the held-out point estimate (still unbiased: the search never read those examples) and warns.

Successive halving reads the search part in two rungs: every candidate on a *screen* subset first,
only the contenders on the whole search part.

Where a budget cannot afford judging on the whole dev split at the job's length (the original's pass
over it and each candidate's), the split is drawn from a seeded subsample of it, sized by the job
estimate (:mod:`surgery.compress.job_estimate`, at least :data:`MIN_DEV_EXAMPLES`): the same three
parts, disjoint as before, over fewer examples.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from pydantic import BaseModel, Field

#: The share of the dev examples held out for the pick (the rest is the search's).
PICK_SHARE = 0.5
#: The two-sided confidence of the drop's interval (its upper end is a one-sided 95% bound).
CONFIDENCE = 0.9
#: Bootstrap resamples of the paired per-example differences.
BOOTSTRAP_ROUNDS = 2000
#: The share of the search part every candidate is screened on, and the fewest examples a screen reads.
SCREEN_SHARE = 0.3
MIN_SCREEN = 32
#: The fewest dev examples a budget leaves the judging: the pick part holds half of them (128: one example is
#: 0.8 points, and the paired interval of a cut that agrees with the original on most of them stays within
#: a few points), the search part the rest, its screen at least MIN_SCREEN.
MIN_DEV_EXAMPLES = 256


@dataclass(frozen=True)
class DevSplit:
    """Indices of the dev examples: ``screen`` ⊂ ``search``, ``pick`` disjoint from both; ``drawn_from``: the dev
    examples there were (more than the parts hold where a budget judged on a subsample)."""

    search: tuple[int, ...]
    pick: tuple[int, ...]
    screen: tuple[int, ...]
    drawn_from: int = 0

    @property
    def judged(self) -> int:
        """The dev examples the parts hold (each once; every one where the split is not a subsample)."""
        return len(set(self.search) | set(self.pick))

    @property
    def rest(self) -> tuple[int, ...]:
        """The search examples a screen did not read (a contender's second rung)."""
        seen = set(self.screen)
        return tuple(i for i in self.search if i not in seen)


def split_dev(n: int, *, seed: int = 0, pick_share: float | None = None, screen_share: float | None = None,
              min_screen: int | None = None, examples: int | None = None) -> DevSplit:
    """Split ``n`` dev examples into the search's part (with its screen) and the pick's, disjoint and seeded.

    ``examples``: judge on that many of the ``n`` only (a budget's subsample; None, or ``n`` or more: all): the
    first of the same seeded permutation, split as a whole dev split is.

    Fewer than 2 examples cannot be split: both parts are then the same examples (and say nothing
    held out); callers note it.

    Example:
        >>> s = split_dev(10, screen_share=0.5, min_screen=1)
        >>> len(s.search), len(s.pick), len(s.screen), set(s.search) & set(s.pick)
        (5, 5, 3, set())
        >>> set(s.screen) <= set(s.search), sorted(s.search + s.pick) == list(range(10))
        (True, True)
        >>> few = split_dev(1000, examples=300)
        >>> len(few.search), len(few.pick), len(few.screen), set(few.search) & set(few.pick), few.judged, few.drawn_from
        (150, 150, 45, set(), 300, 1000)
    """
    pick_share = PICK_SHARE if pick_share is None else pick_share  # read now: settings a caller may change
    screen_share = SCREEN_SHARE if screen_share is None else screen_share
    min_screen = MIN_SCREEN if min_screen is None else min_screen
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    if examples is not None:
        order = order[:max(examples, 1)]
    m = len(order)
    if m < 2:
        every = tuple(order)
        return DevSplit(every, every, every, n)
    held = min(m - 1, max(1, round(m * pick_share)))
    search, pick = sorted(order[held:]), sorted(order[:held])
    size = min(len(search), max(min_screen, math.ceil(screen_share * len(search))))
    screen = tuple(sorted(order[held: held + size]))
    return DevSplit(tuple(search), tuple(pick), screen, n)


class Judged(BaseModel):
    """A candidate's figures on one set of examples, paired with the original on the same examples."""

    examples: int
    value: float = Field(description="accuracy (task) or mean cosine (embedding) on these examples, a fraction")
    reference: float = Field(description="the original's own figure on the same examples")
    drop: float = Field(description="points lost against the original on these examples")
    drop_interval: list[float] = Field(description="the drop's paired interval, points [low, high]: adjusted Wald "
                                                   "for right/wrong scores, percentile bootstrap for cosines")
    retained: float | None = Field(default=None, description="value / reference, percent")
    retained_low: float | None = Field(default=None, description="the retained share at the drop interval's high end")


def paired_drop(reference: Sequence[float] | torch.Tensor, candidate: Sequence[float] | torch.Tensor, *,
                confidence: float = CONFIDENCE, rounds: int = BOOTSTRAP_ROUNDS, seed: int = 0) -> Judged:
    """The drop of ``candidate`` against ``reference`` (per-example scores: 1/0 correct, or cosines), with a
    paired interval over the examples.

    Paired: only where the two differ moves the interval (the original and a faithful cut agree on most
    examples). Right/wrong scores get Bonett & Price's adjusted Wald interval for a difference of paired
    proportions (one pseudo-example added to each cell where they disagree): the percentile bootstrap of a
    few disagreements is too narrow (with none in the sample it is [0, 0], and with two that went either
    way it bounded text-source cuts to 1 point on 200 held-out examples that lost 1.1-1.4 on test).
    Cosines, or any score that is not 0/1, get the percentile bootstrap of the per-example differences.

    Example:
        >>> j = paired_drop([1.0] * 90 + [0.0] * 10, [1.0] * 88 + [0.0] * 12)
        >>> j.drop, j.drop_interval[0] <= 2.0 <= j.drop_interval[1], j.examples
        (2.0, True, 100)
        >>> agree = paired_drop([1.0] * 150 + [0.0] * 50, [1.0] * 150 + [0.0] * 50)
        >>> agree.drop, agree.drop_interval[0] < 0.0 < agree.drop_interval[1] < 1.2
        (0.0, True)
        >>> paired_drop([0.9, 0.8], [0.9, 0.8]).drop_interval
        [0.0, 0.0]
    """
    ref = torch.as_tensor(reference, dtype=torch.float64).flatten()
    cand = torch.as_tensor(candidate, dtype=torch.float64).flatten()
    if ref.shape != cand.shape or ref.numel() == 0:
        raise ValueError(f"paired_drop: {ref.numel()} reference and {cand.numel()} candidate scores; need the "
                         "same examples, at least one")
    diff = 100.0 * (ref - cand)
    n = diff.numel()
    binary = bool(((ref == 0) | (ref == 1)).all() and ((cand == 0) | (cand == 1)).all())
    if binary:
        low, high = adjusted_wald(int(((ref == 1) & (cand == 0)).sum()), int(((ref == 0) & (cand == 1)).sum()), n,
                                  confidence=confidence)
    else:
        low, high = bootstrap_interval(diff, confidence=confidence, rounds=rounds, seed=seed)
    value, base = float(cand.mean()), float(ref.mean())
    drop = float(diff.mean())
    retained = 100.0 * value / base if base > 0 else None
    retained_low = 100.0 * (base - high / 100.0) / base if base > 0 else None
    return Judged(examples=n, value=round(value, 6), reference=round(base, 6), drop=round(drop, 4),
                  drop_interval=[round(low, 4), round(high, 4)],
                  retained=None if retained is None else round(retained, 3),
                  retained_low=None if retained_low is None else round(retained_low, 3))


def bootstrap_interval(diff: torch.Tensor, *, confidence: float = CONFIDENCE, rounds: int = BOOTSTRAP_ROUNDS,
                       seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``diff`` (per-example differences), ``rounds`` seeded
    resamples of the examples.

    Example:
        >>> low, high = bootstrap_interval(torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64))
        >>> 0.0 <= low < 1.5 < high <= 3.0
        True
    """
    n = diff.numel()
    draws = torch.randint(n, (rounds, n), generator=torch.Generator().manual_seed(seed))
    means = diff[draws].mean(dim=1)
    tail = (1.0 - confidence) / 2.0
    low, high = torch.quantile(means, torch.tensor([tail, 1.0 - tail], dtype=torch.float64)).tolist()
    return low, high


def adjusted_wald(lost: int, won: int, n: int, *, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Bonett & Price (2012)'s adjusted Wald interval, in points, for the drop between two paired right/wrong
    scorings of ``n`` examples: ``lost`` right before and wrong after, ``won`` the other way round.

    Example:
        >>> low, high = adjusted_wald(2, 0, 200)
        >>> round(low, 2), round(high, 2)
        (-0.63, 2.61)
    """
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2.0)
    p_lost, p_won = (lost + 1) / (n + 2), (won + 1) / (n + 2)
    centre = p_lost - p_won
    half = z * math.sqrt(max(p_lost + p_won - centre * centre, 0.0) / (n + 2))
    return 100.0 * (centre - half), 100.0 * (centre + half)
