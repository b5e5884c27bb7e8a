"""The one routine that times models: side by side, in interleaved rounds, on the batches a service runs.

Every caller times through :func:`time_models`: ``surgery bench`` (:func:`surgery.measure.bench.bench_models`),
the latency table's probes and its cache check, the side-by-side speedups compress measures, the int8
fallback costs, the job estimate's single forwards and the cost probe of :mod:`surgery.measure.cost`.

Method:

1. **Same inputs, paired.** Round ``r`` runs ``batches[r % len(batches)]`` on every model, so within a
   round all models see the same batch: a full-length random one (:func:`make_inputs`) or real texts
   drawn from the user's data, each batch padded to its own longest as a server pads
   (:mod:`surgery.measure.serving`).
2. **Interleaved.** ``warmup`` untimed rounds, then ``repeats`` timed ones; each round runs every model
   once, the order rotating round by round (A B C, B C A, ...), so drifting load and cache effects hit
   all models alike. Each call is timed with ``time.perf_counter`` (a CUDA synchronise around it on GPU),
   under ``torch.inference_mode``, with ``threads`` torch intra-op threads (a runtime outside torch
   holds itself to the threads it was loaded with). Models run in eval mode; their mode is restored.
3. **Short calls repeated.** With ``least``, a model whose call takes less than ``least`` seconds runs
   several times back to back per round (judged on one timed call after an untimed one): on a busy
   machine a very short call either escapes other processes or waits a whole scheduler slice, so its
   time would not scale with load as a longer one's does. Times are reported per call.
4. **Read off** (:class:`Timing`): the paired speedup of each model over the first (median of the
   same-round ratios, :func:`surgery.measure.stats.paired_ratios`, with a 95% bootstrap interval),
   each model's level on a typical round (:func:`surgery.measure.stats.median_polish`), and latency
   percentiles per batch.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from pydantic import BaseModel, Field
from torch import nn

from surgery.core.devices import synchronize
from surgery.core.errors import ConfigError
from surgery.core.strategy import Batch  # one batch type (a model-input mapping)
from surgery.measure.machine import MachineInfo, machine_info
from surgery.measure.stats import Interval, bootstrap_median, median_polish, paired_ratios
from surgery.persist.config_values import usable_positions

#: Calls per timed unit are capped here (a probe of microseconds would otherwise run for ever).
MAX_CALLS = 1000
#: Resident memory (bytes) beyond which :func:`time_models` frees each runtime model's intermediate buffers after its
#: turn (a model with ``release_memory``: OpenVINO). The latency table holds its 18 probes at once, and at 32 x 512
#: tokens each OpenVINO probe keeps about 0.35 GB of buffers after its first call, beside 0.2 GB loaded: about 10 GB
#: in all, the peak of a BERT-base compress run (12.8 GB). Freed, a probe's next call allocates them again, which
#: measured 15% slower at that shape, so buffers are freed only past this bound (at 128 tokens nothing changes).
TIMING_RSS_BYTES = 5 * 2**30



def make_inputs(vocab_size: int, *, batch_size: int, seq_len: int, seed: int = 0, device: str | torch.device = "cpu"
                ) -> dict[str, torch.Tensor]:
    """A full-length random batch: ``input_ids`` (seeded) and an ``attention_mask`` of ones.

    Ids avoid the first few vocabulary entries, where special tokens usually live.

    Example:
        >>> batch = make_inputs(99, batch_size=2, seq_len=5)
        >>> batch["input_ids"].shape, int(batch["attention_mask"].sum())
        (torch.Size([2, 5]), 10)
    """
    gen = torch.Generator().manual_seed(seed)
    low = min(5, vocab_size - 1)
    ids = torch.randint(low, vocab_size, (batch_size, seq_len), generator=gen)
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}


def shared_vocab(models: Mapping[str, Any]) -> int:
    """The vocabulary every model has (the smallest ``config.vocab_size``), for random ids all can read.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> shared_vocab({"a": NS(config=NS(vocab_size=99)), "b": NS(config=NS(vocab_size=50))})
        50
    """
    sizes = [getattr(getattr(m, "config", None), "vocab_size", None) for m in models.values()]
    known = [int(s) for s in sizes if s]
    if not known:
        raise ConfigError("bench: no model has config.vocab_size; pass Hugging Face models")
    return min(known)


@contextmanager
def torch_threads(threads: int | None) -> Iterator[int]:
    """Run the block with ``threads`` torch intra-op threads (None: as they are); yields the count in use.

    Example:
        >>> with torch_threads(1) as used:
        ...     used, torch.get_num_threads()
        (1, 1)
    """
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def check_device(device: str) -> torch.device:
    """The torch device named ``device``, checked to exist on this machine.

    Example:
        >>> check_device("cpu")
        device(type='cpu')
        >>> check_device("tpu9")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: bench: unknown device 'tpu9'; use cpu, cuda or cuda:N
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"bench: unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"bench: device {device!r} is not supported; use cpu, cuda or cuda:N")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"bench: --device {device} but torch sees no CUDA GPU on this machine; use --device cpu")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"bench: --device {device} but this machine has {count} CUDA GPU(s) (cuda:0 to "
                              f"cuda:{count - 1})")
    return dev


def check_seq_len(models: Mapping[str, Any], seq_len: int, what: str = "bench") -> None:
    """Refuse a sequence length beyond a model's position embeddings (it would fail inside the forward);
    ``what`` begins the message (the command or function that was asked).

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> check_seq_len({"tiny": tiny_model(TinySpec("bert"))}, 10**6)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        surgery.core.errors.ConfigError: bench: --seq-len 1000000 exceeds the ... positions tiny supports; ...
    """
    for name, model in models.items():
        limit = usable_positions(getattr(model, "config", None))
        if limit is not None and limit < seq_len:
            raise ConfigError(f"{what}: --seq-len {seq_len} exceeds the {limit} positions {name} supports; "
                              f"use --seq-len {limit} or less")


def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none).

    Example:
        >>> value = load_average()
        >>> value is None or value >= 0
        True
    """
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..100) of a non-empty sequence.

    Example:
        >>> percentile([1.0, 2.0, 3.0, 4.0], 50), percentile([1.0, 2.0, 3.0, 4.0], 95)
        (2.5, 3.85)
    """
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return round(ordered[low] + (ordered[high] - ordered[low]) * (pos - low), 12)


def batch_length(batch: Batch) -> int:
    """The padded length of ``batch`` (the second dimension of its ``input_ids``).

    Example:
        >>> batch_length(make_inputs(99, batch_size=2, seq_len=7))
        7
    """
    return int(batch["input_ids"].shape[1])


class Timing(BaseModel):
    """What :func:`time_models` measured: seconds per call of every timed round, and how.

    Example:
        >>> t = Timing(reference="a", seconds={"a": [2.0, 4.0], "b": [1.0, 2.0]}, calls={"a": 1, "b": 1},
        ...            repeats=2, warmup=0, threads=1, device="cpu", batch_shapes=[[1, 8], [1, 8]],
        ...            machine=machine_info())
        >>> t.speedup("b")[0], t.latency_ms("a", 50), round(t.steady()[0]["b"], 4)
        (2.0, 3000.0, 1.4142)
    """

    reference: str = Field(description="the first model: every ratio is against it")
    seconds: dict[str, list[float]] = Field(description="name -> seconds per call in each timed round")
    calls: dict[str, int] = Field(description="name -> calls back to back per round (1 unless the call was short)")
    repeats: int
    warmup: int
    threads: int
    device: str
    batch_shapes: list[list[int]] = Field(description="[batch, padded length] of each timed round's batch")
    load_average: list[float | None] = Field(default_factory=list, description="1-minute load before and after")
    freed_buffers: bool = Field(default=False, description="runtime models' buffers were freed after each turn (the "
                                "process held more than TIMING_RSS_BYTES): each call allocated them again")
    machine: MachineInfo

    def speedup(self, name: str) -> tuple[float, Interval]:
        """The paired speedup of ``name`` over the reference (median of same-round ratios) and its 95% interval."""
        ratios = paired_ratios(self.seconds[self.reference], self.seconds[name])
        interval = bootstrap_median(ratios)
        return interval.estimate, interval

    def latency_ms(self, name: str, q: float) -> float:
        """The ``q``-th percentile (0..100) of ``name``'s milliseconds per batch over the timed rounds."""
        return 1000 * percentile(self.seconds[name], q)

    def steady(self) -> tuple[dict[str, float], list[float]]:
        """Each model's seconds on a typical round and each round's load factor (median polish of log times)."""
        return median_polish(self.seconds)


def _calls_for(models: Mapping[str, nn.Module], batch: Batch, least: float | None, sync: Callable[[], None],
               after: Callable[[str], None]) -> dict[str, int]:
    """Calls per timed unit: enough for ``least`` seconds, judged on one timed call after an untimed one."""
    if least is None:
        return {name: 1 for name in models}
    calls = {}
    for name, model in models.items():
        model(**batch)  # untimed: pays lazy initialisation (kernel choice, graph compilation)
        sync()
        start = time.perf_counter()
        model(**batch)
        sync()
        once = time.perf_counter() - start
        calls[name] = max(1, min(MAX_CALLS, math.ceil(least / max(once, 1e-6))))
        after(name)
    return calls


class BufferBound:
    """Frees runtime models' intermediate buffers after each one's turn once the process holds more than ``limit``
    bytes (see :data:`TIMING_RSS_BYTES`); ``freed`` says whether it had to.

    Example:
        >>> class Model:
        ...     released = 0
        ...     def release_memory(self): self.released += 1
        >>> models = {"a": Model(), "b": Model()}
        >>> bound = BufferBound(models, limit=0)
        >>> bound("a"); bound("b"); bound.freed, models["a"].released, models["b"].released
        (True, 1, 2)
        >>> BufferBound(models, limit=2**62)("a")
    """

    def __init__(self, models: Mapping[str, Any], limit: int) -> None:
        from surgery.measure.memory import rss_bytes

        self.models, self.limit, self.rss, self.freed = models, limit, rss_bytes, False

    def __call__(self, name: str) -> None:
        if not self.freed:
            held = self.rss()
            if held is None or held <= self.limit:
                return
            self.freed = True  # from now on, every model after its turn; those that ran already, now
            names = list(self.models)
        else:
            names = [name]
        for each in names:
            release = getattr(self.models[each], "release_memory", None)
            if callable(release):
                release()


def time_models(models: Mapping[str, nn.Module], batches: Sequence[Batch], *, repeats: int, warmup: int = 2,
                threads: int | None = None, device: str | torch.device = "cpu", least: float | None = None,
                on_round: Callable[[int], None] | None = None) -> Timing:
    """Time ``models`` side by side (the first is the reference) on ``batches``: the one timing routine.

    See the module docstring for the method. ``batches`` are moved to ``device``; round ``r`` runs
    ``batches[r % len(batches)]`` on every model. ``on_round`` is called after each round with the
    number done (warm-up included).

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> timing = time_models({"a": tiny_model(TinySpec("bert")), "b": tiny_model(TinySpec("bert"))},
        ...                      [make_inputs(99, batch_size=2, seq_len=8)], repeats=3, warmup=0, threads=1)
        >>> len(timing.seconds["a"]), timing.threads, timing.speedup("b")[0] > 0, timing.batch_shapes[0]
        (3, 1, True, [2, 8])
    """
    if not models:
        raise ConfigError("timing: pass at least one model")
    if not batches:
        raise ConfigError("timing: pass at least one batch")
    for field, value, low in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if value < low:
            raise ConfigError(f"timing: {field} must be at least {low}, got {value}")
    if threads is not None and threads < 1:
        raise ConfigError(f"timing: threads must be at least 1, got {threads}")
    dev = check_device(str(device))
    check_seq_len(models, max(batch_length(b) for b in batches), "timing")
    moved = [{k: v.to(dev) for k, v in b.items()} for b in batches]
    sync = functools.partial(synchronize, dev)
    names = list(models)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    shapes: list[list[int]] = []
    modes = {name: getattr(m, "training", False) for name, m in models.items()}
    before = load_average()
    try:
        with torch_threads(threads) as used, torch.inference_mode():
            for model in models.values():
                if isinstance(model, nn.Module):
                    model.to(dev).eval()
            bound = BufferBound(models, TIMING_RSS_BYTES)
            calls = _calls_for(models, moved[0], least, sync, bound)
            for round_ in range(warmup + repeats):
                batch = moved[round_ % len(moved)]
                shift = round_ % len(names)
                for name in names[shift:] + names[:shift]:  # rotate the order every round
                    sync()
                    start = time.perf_counter()
                    for _ in range(calls[name]):
                        models[name](**batch)
                    sync()
                    if round_ >= warmup:
                        seconds[name].append((time.perf_counter() - start) / calls[name])
                    bound(name)
                if round_ >= warmup:
                    shapes.append([int(batch["input_ids"].shape[0]), batch_length(batch)])
                if on_round is not None:
                    on_round(round_ + 1)
    finally:
        for name, model in models.items():
            if isinstance(model, nn.Module):
                model.train(modes[name])
    return Timing(reference=names[0], seconds=seconds, calls=calls, repeats=repeats, warmup=warmup, threads=used,
                  device=str(dev), batch_shapes=shapes, load_average=[before, load_average()],
                  freed_buffers=bound.freed,
                  machine=machine_info().model_copy(update={"torch_threads": used}))


def time_once(model: nn.Module, batch: Batch, *, threads: int | None = None) -> float:
    """Seconds of one call of ``model`` on ``batch``, after an untimed one (the first call at a shape is slower).

    Example:
        >>> from surgery.testing import TinySpec, tiny_model
        >>> time_once(tiny_model(TinySpec("bert")), make_inputs(99, batch_size=2, seq_len=8), threads=1) > 0
        True
    """
    device = next(iter(batch.values())).device
    return time_models({"model": model}, [batch], repeats=1, warmup=1, threads=threads, device=device
                       ).seconds["model"][0]

