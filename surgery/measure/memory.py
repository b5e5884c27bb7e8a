"""Tensor memory of one forward pass: the weights plus the most the forward held at once.

On CUDA it is ``torch.cuda.max_memory_allocated``; on CPU there is no allocator high-water mark, so one
forward runs under ``torch.profiler`` with ``profile_memory=True`` and the allocator events are summed
in time order. It is tensor memory, not process RSS, which would mix every model in the process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn


def _weights_bytes(model: nn.Module) -> int:
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


@contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Send native (C++) writes to stderr to /dev/null for the block.

    The profiler's tracing backend prints ``USDT ... profiler_start/stop`` lines straight to file
    descriptor 2, which no Python setting reaches; the block only runs one forward pass.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real descriptor 2 (embedded interpreters): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as sink:
            os.dup2(sink.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _cpu_activation_peak(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> int | None:
    from torch.profiler import ProfilerActivity, profile

    with _quiet_native_stderr(), torch.inference_mode(), profile(activities=[ProfilerActivity.CPU],
                                                                  profile_memory=True) as prof:
        model(**inputs)
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None:
        return None
    # Every allocator event: positive bytes on allocation, negative on free; the running sum is the
    # tensor memory the forward held at that moment.
    events = sorted((e for e in results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns())
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return peak


def _cuda_activation_peak(model: nn.Module, inputs: Mapping[str, torch.Tensor], device: torch.device) -> int:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    with torch.inference_mode():
        model(**inputs)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def memory_use(model: nn.Module, inputs: Mapping[str, torch.Tensor], device: torch.device
               ) -> tuple[int, int | None, int | None, str]:
    """Weights, activation peak and their sum in bytes for one forward pass, and how they were measured.

    Example:
        >>> from surgery.testing import TinySpec, tiny_model, tiny_inputs
        >>> spec = TinySpec("bert")
        >>> weights, peak, total, method = memory_use(tiny_model(spec), tiny_inputs(spec), torch.device("cpu"))
        >>> weights > 0 and method.startswith("torch.profiler")
        True
    """
    weights = _weights_bytes(model)
    if device.type == "cuda":
        peak = _cuda_activation_peak(model, inputs, device)
        method = "torch.cuda.max_memory_allocated during one forward, plus weights"
    elif device.type == "cpu":
        peak = _cpu_activation_peak(model, inputs)
        method = "torch.profiler allocator events during one forward (tensor bytes), plus weights"
    else:
        peak, method = None, f"not measured on {device.type}"
    return weights, peak, (weights + peak if peak is not None else None), method


def rss_bytes() -> int | None:
    """The process's resident memory now, in bytes (``/proc/self/statm``; None where there is none).

    Example:
        >>> (rss_bytes() or 1) > 0
        True
    """
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def peak_rss_bytes() -> int | None:
    """The process's peak resident memory so far, in bytes (``getrusage``'s ``ru_maxrss``; None where absent).

    Example:
        >>> (peak_rss_bytes() or 1) > 0
        True
    """
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kibibytes, macOS bytes.
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024

