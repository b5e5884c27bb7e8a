"""What timing code needs to know of a device: torch runs work on a GPU asynchronously.

A clock read right after a call on a GPU times the launch, not the work; every timer here waits for the
device's queued work before it reads the clock (the benchmark's rounds, compress's timed training steps).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (nothing to wait for on a CPU).

    Example:
        >>> import torch
        >>> synchronize(torch.device("cpu"))
    """
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
