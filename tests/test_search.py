"""The grid binary search (DoE Algorithm 1) against random monotone predicates."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from surgery.strategies.doe.rate_search import binary_search_grid, probes_needed, pruning_grid


@given(threshold=st.integers(0, 21), step=st.sampled_from([0.05, 0.1, 0.25]))
def test_largest_accepted_value_for_monotone_predicates(threshold: int, step: float) -> None:
    grid = pruning_grid(step)
    threshold = min(threshold, len(grid))
    seen = []

    def accept(p: float) -> bool:
        seen.append(p)
        return grid.index(p) < threshold

    result = binary_search_grid(accept, grid, max_probes=probes_needed(len(grid)))
    assert result.exact
    assert result.best == (grid[threshold - 1] if threshold else None)
    assert len(result.probes) <= probes_needed(len(grid)) and [p.value for p in result.probes] == seen


@given(threshold=st.integers(0, 21), probes=st.integers(1, 4))
def test_fewer_probes_give_an_accepted_lower_bound(threshold: int, probes: int) -> None:
    grid = pruning_grid()
    result = binary_search_grid(lambda p: grid.index(p) < threshold, grid, max_probes=probes)
    assert len(result.probes) <= probes
    truth = grid[threshold - 1] if threshold else None
    if result.best is not None:
        assert truth is not None and result.best <= truth
        assert result.upper is None or truth <= result.upper
    if result.exact:
        assert result.best == truth


def test_five_probes_are_exact_on_the_doe_grid() -> None:
    assert probes_needed(21) == 5
