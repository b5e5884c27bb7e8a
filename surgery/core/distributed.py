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

import contextlib
import os
import sys
from typing import NoReturn

from surgery.core.errors import ConfigError


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
        surgery.core.errors.ConfigError: batch size 5 does not divide among 2 processes; use a multiple of 2 ...
    """
    count = processes or world_size()
    if batch_size % count:
        raise ConfigError(f"batch size {batch_size} does not divide among {count} processes; use a multiple of "
                          f"{count} (it is the global batch: each process takes batch size / {count} examples per "
                          "step)")
    return batch_size // count


def leave_process_group() -> bool:
    """Wait at a barrier until every process of the group (if training joined one) is done; whether there was one.

    A process that joined a gloo group must then end with :func:`end_process`, not a normal exit:
    torch's ``ProcessGroupGloo`` destructor joins its worker threads while holding the GIL, and a worker
    may at that moment still be releasing a finished collective whose tensors were created in Python,
    which needs the GIL: a deadlock (seen with gdb: the main thread in ``~ProcessGroupGloo`` ->
    ``std::thread::join``, a ``pt_gloo_runloop`` thread in ``~AsyncBarrierWork`` ->
    ``~AsyncAllgatherWork`` -> ``decref`` -> ``take_gil``). It hung about one two-process run in
    fifteen here, at exit, after all the work was done. ``destroy_process_group`` does not avoid it (the
    trainer's DDP reducer holds the last reference, dropped later in a destructor).

    Example:
        >>> leave_process_group()  # no launcher, no group
        False
    """
    if "torch.distributed" not in sys.modules:  # nothing joined a group; do not import torch for that
        return False
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    dist.barrier()
    return True


def end_process(code: int) -> NoReturn:
    """End this process now with ``code``, after flushing its output, without running teardown code.

    For a process that joined a process group (see :func:`leave_process_group`): its results are written
    and its output flushed, so nothing is lost by skipping the destructors that can deadlock.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
