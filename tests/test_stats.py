"""The bootstrap interval of a paired speedup, and how the benchmark reports it."""

from __future__ import annotations

import pytest

from surgery.measure.bench import bench_models
from surgery.measure.stats import Interval, bootstrap_median, interval_warning, rounds_for
from surgery.testing import TinySpec, tiny_model


def test_interval_is_deterministic_and_brackets_the_median() -> None:
    rounds = [1.82, 1.91, 1.88, 1.95, 1.86, 1.90, 1.79, 1.93]
    first, again = bootstrap_median(rounds), bootstrap_median(rounds)
    assert first == again  # seeded resampling
    assert first.low <= first.estimate <= first.high and first.estimate == pytest.approx(1.89)
    assert min(rounds) <= first.low and first.high <= max(rounds)
    assert bootstrap_median(rounds, seed=1).estimate == first.estimate
    assert not first.wide and interval_warning("m", first) is None


def test_constant_rounds_give_a_point_and_one_round_is_wide() -> None:
    point = bootstrap_median([2.0] * 6)
    assert (point.low, point.high, point.half_width, point.wide) == (2.0, 2.0, 0.0, False)
    single = bootstrap_median([2.0])
    assert single.wide and "one round gives no spread" in (interval_warning("m", single) or "")


def test_spread_widens_the_interval_and_more_rounds_narrow_it() -> None:
    steady = bootstrap_median([1.0, 1.02, 0.98, 1.01, 0.99, 1.0])
    noisy = bootstrap_median([0.7, 1.3, 0.9, 1.2, 0.8, 1.1])
    assert noisy.high - noisy.low > steady.high - steady.low
    assert noisy.wide and not steady.wide
    many = bootstrap_median([0.7, 1.3, 0.9, 1.2, 0.8, 1.1] * 8)
    assert many.high - many.low < noisy.high - noisy.low
    message = interval_warning("pruned", noisy)
    assert message and "\n" not in message and f"run about {rounds_for(noisy)} rounds" in message


def test_rounds_for_scales_with_the_square_of_the_width() -> None:
    assert rounds_for(Interval(estimate=1.0, low=0.9, high=1.1, level=0.95, rounds=10)) == 40
    assert rounds_for(Interval(estimate=1.0, low=0.98, high=1.02, level=0.95, rounds=10)) == 10
    with pytest.raises(ValueError):
        bootstrap_median([])


def test_bench_reports_the_interval() -> None:
    base, other = tiny_model(TinySpec("bert")), tiny_model(TinySpec("bert"))
    report = bench_models({"a": base, "b": other}, batch_size=2, seq_len=8, repeats=3, warmup=0)
    c = report.comparisons[0]
    assert c.paired_speedup_ci is not None and c.paired_speedup_ci[0] <= c.paired_speedup <= c.paired_speedup_ci[1]
    wide = [w for w in report.warnings if "is uncertain" in w]
    assert bool(wide) == ((c.paired_speedup_ci[1] - c.paired_speedup_ci[0]) / 2 / c.paired_speedup > 0.05)
