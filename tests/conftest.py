"""Test configuration: hypothesis profiles, a quiet single-threaded torch, and the fixtures test modules share.

Shared plain helpers are in tests/helpers.py; no test module imports another.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

# The repository root, so that `from tests.helpers import ...` works under a bare `pytest` as under `python -m pytest`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

torch.set_num_threads(1)
warnings.filterwarnings("ignore", category=FutureWarning)

settings.register_profile(
    "ci", max_examples=20, derandomize=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture()
def timed_by_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI measures on this machine; here its times come from shape tables."""
    from surgery.compress.latency_source import MeasuredLatency
    from tests.helpers import tables_for

    monkeypatch.setattr(MeasuredLatency, "table", lambda self, model, runtime: tables_for(model).table(model, runtime))
    monkeypatch.setattr(MeasuredLatency, "speedup",
                        lambda self, original, candidate, *, runtime, reference_runtime, served=None: tables_for(
                            original).speedup(original, candidate, runtime=runtime,
                                              reference_runtime=reference_runtime))
