"""Running under ``torchrun`` or ``accelerate launch``: which process this is, and its share of a batch.

Every training path is the Hugging Face Trainer, so a launcher that starts one process per device
(and sets ``WORLD_SIZE`` and ``RANK``) trains data-parallel. For the result to equal a one-process
run, a batch size means the *global* batch: each of ``N`` processes takes ``batch_size / N`` examples
per step, the gradients are averaged across processes, and the steps, the learning-rate schedule and
the examples of each step are those of one process with ``batch_size`` (the Trainer draws every
epoch's order from one seeded permutation and hands consecutive batches to consecutive processes).
Only the main process (rank 0) writes results; the others compute the same model and exit.
"""

from __future__ import annotations

import os
import sys

from surgery.errors import ConfigError


def world_size() -> int:
    """The number of processes a launcher started (1 without one).

    Example:
        >>> world_size() >= 1
        True
    """
    return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))


def process_rank() -> int:
    """This process's rank among them (0 without a launcher)."""
    return int(os.environ.get("RANK", "0") or 0)


def is_main_process() -> bool:
    """Whether this process writes results (rank 0, or no launcher)."""
    return process_rank() == 0


def per_process_batch(batch_size: int, processes: int | None = None) -> int:
    """Each process's share of a global batch of ``batch_size``; refused if it does not divide evenly.

    Example:
        >>> per_process_batch(32, 2)
        16
        >>> per_process_batch(5, 2)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.errors.ConfigError: batch size 5 does not divide among 2 processes; use a multiple of 2 ...
    """
    count = processes or world_size()
    if batch_size % count:
        raise ConfigError(f"batch size {batch_size} does not divide among {count} processes; use a multiple of "
                          f"{count} (it is the global batch: each process takes batch size / {count} examples per "
                          "step)")
    return batch_size // count


def release_process_group() -> None:
    """Leave the process group (if training joined one) together with the other processes, then tear it down.

    Called when a command ends. Left to interpreter exit, gloo's threads can abort a process after its
    work is done, or a process can leave while another still waits in the last collective; a barrier
    first lets every process finish (the main one writes the results meanwhile).
    """
    if "torch.distributed" not in sys.modules:  # nothing joined a group; do not import torch for that
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
