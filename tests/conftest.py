"""Test configuration: hypothesis profiles and a quiet, single-threaded torch."""

from __future__ import annotations

import os
import warnings

import torch
from hypothesis import HealthCheck, settings

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
